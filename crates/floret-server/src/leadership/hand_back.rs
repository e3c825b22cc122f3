//! Handing a shard's leadership back to its preferred replica, on the
//! leader's side. The leader grants it only to the shard's preferred
//! replica, and only once it is caught up (it has just called, so it is
//! reachable whatever the gossip view says). It then freezes its log:
//! the shard's proposer refuses new operations and waits, with those
//! already queued, until the hand-back is over; the entries in flight
//! commit first. It stops dispatching the shard, turns its heartbeats off,
//! waits until the replica holds its last entry and answers with that
//! entry.
//!
//! openraft 0.9 has no leadership transfer, but a leader grants a vote to
//! a candidate whose log is as long as its own once it has led for longer
//! than the leader lease (its lease only holds against a leader it heard
//! from). So the replica calls its election as soon as its log holds that
//! entry, and wins it at once with the leader's vote: the shard stalls for
//! the election, not for a lease. A leader elected less than a lease ago
//! refuses; the replica's higher term deposes it all the same, and the
//! shard elects a leader among its replicas (one election timeout). If
//! nobody took over once that has had time to happen, the leader leads on.

use std::sync::Arc;
use std::time::Duration;

use floret_cluster::Shards;
use floret_store::{NodeId, ShardId};
use openraft::{BasicNode, RaftMetrics};
use tokio::sync::oneshot;

use crate::deliver::DispatcherHandle;
use crate::produce::proposer::Proposers;

/// Entries a preferred replica may lag behind and still be handed the leadership.
const HAND_BACK_MAX_LAG: u64 = 64;
/// How long the leader waits for its entries in flight to commit before
/// it freezes its log for a hand-back.
const ENTRIES_IN_FLIGHT_WAIT: Duration = Duration::from_secs(1);

/// What the leader tells the replica it stepped aside for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SteppedAside {
    /// The leader's last log entry once its proposer paused: the replica
    /// calls its election when its own log holds it.
    pub last_log_index: u64,
    /// When the replica calls its election anyway (the leader lease: by
    /// then the followers grant their votes).
    pub elect_within: Duration,
}

/// Hands shards this node leads back to their preferred replicas.
#[derive(Clone)]
pub struct HandBack {
    shards: Arc<Shards>,
    proposers: Proposers,
    dispatcher: DispatcherHandle,
}

impl HandBack {
    /// Hand-backs of the shards `shards` holds.
    pub fn new(shards: Arc<Shards>, proposers: Proposers, dispatcher: DispatcherHandle) -> Self {
        Self {
            shards,
            proposers,
            dispatcher,
        }
    }

    /// Steps aside in `shard` for `requester` if it may take over, or says
    /// why not.
    pub async fn grant(&self, shard: ShardId, requester: NodeId) -> Result<SteppedAside, String> {
        if self.shards.replicas().preferred_leader(shard) != requester {
            return Err(format!(
                "node {requester} is not the preferred replica of shard {shard}"
            ));
        }
        if self.moving(shard) {
            return Err(format!(
                "shard {shard} is moving to its new replicas: its leadership goes back once it has"
            ));
        }
        if !self.shards.votes_in(shard, requester) {
            return Err(format!(
                "node {requester} does not vote in shard {shard} yet (a replica moving to it)"
            ));
        }
        self.step_aside(shard, requester).await
    }

    /// Whether `shard`'s replicas, as this node's replica knows them, are
    /// not yet where the placement over the current members puts them.
    fn moving(&self, shard: ShardId) -> bool {
        let Some(group) = self.shards.group(shard) else {
            return false;
        };
        let placement = self.shards.replicas();
        let metrics = group.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        let mut replicas: Vec<NodeId> = membership.nodes().map(|(&node, _)| node).collect();
        replicas.sort_unstable();
        let mut placed = placement.replicas(shard).to_vec();
        placed.sort_unstable();
        replicas != placed || membership.learner_ids().next().is_some()
    }

    /// The replica of `shard` (not this node) holding the most of this
    /// leader's log, the preferred one among equals; none when this node
    /// does not lead it or it has no other replica.
    pub fn most_caught_up_replica(&self, shard: ShardId) -> Option<NodeId> {
        let me = self.shards.node_id();
        let group = self.shards.group(shard)?;
        let metrics = group.raft.metrics().borrow().clone();
        if metrics.current_leader != Some(me) {
            return None;
        }
        let preferred = self.shards.replicas().preferred_leader(shard);
        metrics
            .membership_config
            .membership()
            .voter_ids()
            .filter(|&replica| replica != me)
            .max_by_key(|&replica| (matched_by(&metrics, replica), replica == preferred))
    }

    /// Steps aside in `shard` for `requester` (the preferred replica that
    /// asked, or the successor of a leader about to stop) if this node
    /// leads it and the requester is caught up, or says why not.
    pub async fn step_aside(
        &self,
        shard: ShardId,
        requester: NodeId,
    ) -> Result<SteppedAside, String> {
        let me = self.shards.node_id();
        let Some(group) = self.shards.group(shard) else {
            return Err(format!("node {me} holds no replica of shard {shard}"));
        };
        let metrics = group.raft.metrics().borrow().clone();
        if metrics.current_leader != Some(me) {
            return Err(format!("node {me} does not lead shard {shard}"));
        }
        let last_log = metrics.last_log_index.unwrap_or(0);
        let lag = last_log.saturating_sub(matched_by(&metrics, requester));
        if lag > HAND_BACK_MAX_LAG {
            return Err(format!(
                "node {requester} is {lag} entries behind on shard {shard}"
            ));
        }
        let Some(proposer) = self.proposers.get(shard).cloned() else {
            return Err(format!("shard {shard} has no proposer here"));
        };
        let lease = self.shards.tuning().election_timeout_max;
        let step_aside = lease * 2 + Duration::from_millis(500);
        proposer.pause(step_aside);
        let Ok(Some(log_frozen)) =
            tokio::time::timeout(ENTRIES_IN_FLIGHT_WAIT, proposer.hold_every_slot()).await
        else {
            proposer.resume();
            return Err(format!(
                "shard {shard}'s entries in flight did not commit within {ENTRIES_IN_FLIGHT_WAIT:?}"
            ));
        };
        let raft = group.raft.clone();
        if raft.metrics().borrow().current_leader != Some(me) {
            drop(log_frozen);
            proposer.resume();
            return Err(format!("node {me} no longer leads shard {shard}"));
        }
        tracing::info!(
            shard,
            to = requester,
            "stepping aside: handing the shard's leadership to a caught-up replica"
        );
        let (answer, answered) = oneshot::channel();
        let dispatcher = self.dispatcher.clone();
        // In a task of its own: heartbeats and dispatch come back even if
        // the caller gives up on this call.
        tokio::spawn(async move {
            raft.runtime_config().heartbeat(false);
            dispatcher.leadership(shard, false);
            let last_log_index = raft.metrics().borrow().last_log_index.unwrap_or(0);
            let caught_up = |m: &RaftMetrics<NodeId, BasicNode>| {
                matched_by(m, requester) >= last_log_index || m.current_leader != Some(me)
            };
            let mut metrics = raft.metrics();
            if tokio::time::timeout(lease, metrics.wait_for(caught_up))
                .await
                .is_err()
            {
                tracing::debug!(
                    shard,
                    to = requester,
                    "the replica did not catch up within a lease; answering anyway"
                );
            }
            proposer.pause(step_aside);
            let _caller_gone = answer.send(SteppedAside {
                last_log_index,
                elect_within: lease,
            });
            tokio::time::sleep(step_aside).await;
            drop(log_frozen);
            raft.runtime_config().heartbeat(true);
            proposer.resume();
            let still_leading = raft.metrics().borrow().current_leader == Some(me);
            if still_leading && raft.ensure_linearizable().await.is_ok() {
                tracing::info!(
                    shard,
                    "hand-back did not happen; dispatching the shard again"
                );
                dispatcher.leadership(shard, true);
            }
        });
        answered
            .await
            .map_err(|_| format!("the hand-back of shard {shard} stopped"))
    }
}

/// The last entry `replica` holds, as far as the leader knows.
fn matched_by(metrics: &RaftMetrics<NodeId, BasicNode>, replica: NodeId) -> u64 {
    metrics
        .replication
        .as_ref()
        .and_then(|replication| replication.get(&replica).cloned().flatten())
        .map_or(0, |log_id| log_id.index)
}
