//! The move driver: on each shard this node leads, brings the shard's
//! replicas to where the placement over the current members puts them,
//! a few shards at a time.
//!
//! Every [`MOVE_TICK`] the driver reads, per led shard, the next step from
//! what the leader sees (`floret_cluster::next_move_step`): add the new
//! replica as a learner, wait while it catches up by snapshot and log,
//! hand leadership to a replica that stays if this node leaves, change the
//! voters in one joint change (the leaving replicas stay learners, so the
//! configuration that no longer counts them on reaches them and they stop
//! calling elections), then drop the learners the placement does not name.
//! A step runs in a task of its own, bounded by [`STEP_TIMEOUT`]; the next
//! tick reads the outcome from raft again, so a failed step is retried and
//! a new leader resumes a move where its predecessor stopped.
//!
//! IMPLEMENTATION CAVEATS
//! - The bound on moves at once is per leader, not for the whole cluster.
//! - A learner that never catches up (its node is down) holds its shard's
//!   move, and a slot, until it does or the member is removed; it is
//!   logged every [`STALL_REPORT`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use floret_cluster::{MoveStep, ShardRaftView, Shards, next_move_step};
use floret_store::ShardId;
use openraft::{BasicNode, ChangeMembers};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::drain::hand_off;
use super::hand_back::HandBack;

/// How often the driver reads every led shard's next step.
pub const MOVE_TICK: Duration = Duration::from_millis(500);
/// How long one step may take before the driver reads the shard again.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// A new replica counts as caught up within this many entries of the leader.
const CAUGHT_UP_WITHIN: u64 = 64;
/// How often a move that makes no progress is logged.
const STALL_REPORT: Duration = Duration::from_secs(30);

/// Starts the move driver of this node, moving at most `at_once` shards at a time.
pub fn spawn(shards: Arc<Shards>, hand_back: HandBack, at_once: usize) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut driver = MoveDriver {
            shards,
            hand_back,
            at_once: at_once.max(1),
            moving: BTreeMap::new(),
            stepping: Arc::new(Mutex::new(BTreeSet::new())),
        };
        loop {
            tokio::time::sleep(MOVE_TICK).await;
            driver.tick();
        }
    })
}

/// One shard's move, as the driver tracks it.
struct Moving {
    /// The step last seen, and when it was first seen.
    step: MoveStep,
    since: Instant,
    reported: Instant,
}

struct MoveDriver {
    shards: Arc<Shards>,
    hand_back: HandBack,
    at_once: usize,
    /// Shards whose move has begun here and is not done.
    moving: BTreeMap<ShardId, Moving>,
    /// Shards with a step task running.
    stepping: Arc<Mutex<BTreeSet<ShardId>>>,
}

impl MoveDriver {
    fn tick(&mut self) {
        let placement = self.shards.replicas();
        let now = Instant::now();
        let mut led = BTreeSet::new();
        for group in self.shards.opened_groups() {
            let Some(view) = ShardRaftView::of_leader(&group.raft.metrics().borrow()) else {
                continue;
            };
            let shard = group.id;
            led.insert(shard);
            let target: BTreeSet<_> = placement.replicas(shard).iter().copied().collect();
            let step = next_move_step(&target, &view, CAUGHT_UP_WITHIN);
            if step == MoveStep::Done {
                if let Some(finished) = self.moving.remove(&shard) {
                    tracing::info!(
                        shard,
                        replicas = ?target,
                        took_ms = now.duration_since(finished.since).as_millis() as u64,
                        "shard moved"
                    );
                }
                continue;
            }
            if !self.moving.contains_key(&shard) {
                if self.moving.len() >= self.at_once {
                    continue;
                }
                tracing::info!(shard, from = ?view.voters, to = ?target, "moving shard");
                self.moving.insert(
                    shard,
                    Moving {
                        step: step.clone(),
                        since: now,
                        reported: now,
                    },
                );
            }
            let moving = self.moving.get_mut(&shard).expect("inserted above");
            if moving.step != step {
                moving.step = step.clone();
                moving.reported = now;
            } else if now.duration_since(moving.reported) >= STALL_REPORT {
                moving.reported = now;
                tracing::warn!(shard, ?step, "shard move makes no progress");
            }
            self.start_step(shard, step);
        }
        self.moving.retain(|shard, _| led.contains(shard));
    }

    /// Runs `step` of `shard`'s move in a task of its own, unless one runs.
    fn start_step(&self, shard: ShardId, step: MoveStep) {
        if matches!(
            step,
            MoveStep::Done | MoveStep::WaitForChange | MoveStep::WaitForCatchUp { .. }
        ) {
            return;
        }
        if !lock(&self.stepping).insert(shard) {
            return;
        }
        let shards = self.shards.clone();
        let hand_back = self.hand_back.clone();
        let stepping = self.stepping.clone();
        tokio::spawn(async move {
            let outcome =
                tokio::time::timeout(STEP_TIMEOUT, take_step(&shards, &hand_back, shard, &step))
                    .await;
            match outcome {
                Ok(Ok(())) => tracing::debug!(shard, ?step, "move step taken"),
                Ok(Err(why)) => tracing::warn!(shard, ?step, %why, "move step failed; retrying"),
                Err(_) => tracing::warn!(shard, ?step, "move step timed out; retrying"),
            }
            lock(&stepping).remove(&shard);
        });
    }
}

/// Carries out one step of `shard`'s move.
async fn take_step(
    shards: &Shards,
    hand_back: &HandBack,
    shard: ShardId,
    step: &MoveStep,
) -> Result<(), String> {
    let Some(group) = shards.opened_group(shard) else {
        return Err(format!("shard {shard} is not one of the cluster's"));
    };
    let raft = &group.raft;
    match step {
        MoveStep::AddLearner(node) => {
            let address = shards
                .peers()
                .address(*node)
                .ok_or_else(|| format!("node {node} is not a member"))?;
            raft.add_learner(*node, BasicNode::new(address), false)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
        MoveStep::HandLeadershipTo(successor) => {
            hand_off(
                shards,
                hand_back,
                shard,
                *successor,
                Instant::now() + STEP_TIMEOUT,
            )
            .await;
            Ok(())
        }
        MoveStep::ChangeVoters(voters) => raft
            .change_membership(voters.clone(), true)
            .await
            .map(drop)
            .map_err(|e| e.to_string()),
        MoveStep::RemoveLearners(learners) => raft
            .change_membership(ChangeMembers::RemoveNodes(learners.clone()), false)
            .await
            .map(drop)
            .map_err(|e| e.to_string()),
        MoveStep::Done | MoveStep::WaitForChange | MoveStep::WaitForCatchUp { .. } => Ok(()),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
