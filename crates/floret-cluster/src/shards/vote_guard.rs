//! The vote guard. Raft assumes a node never forgets a vote or an entry it
//! acknowledged. A node that may have (its data dir was wiped and the
//! cluster already exists, or opening its log cut off a torn write, which a
//! disk that lost synced data leaves too) neither grants votes nor
//! campaigns until a leader has reached it, or for [`VOTE_GUARD`] at most,
//! and does not resume a leadership its stored vote records. The chaos
//! suite found each of these losing committed entries: a wiped node's vote
//! elected a replica that lacked one; a leader whose log lost its tail
//! resumed leading at start and imposed its shorter log. A new node in a
//! new cluster is guarded only until its peers have all answered that no
//! shard exists yet.
//!
//! IMPLEMENTATION CAVEATS
//! - A guarded node still accepts appends from any leader, a stale one
//!   included: a wiped node does not know the terms it voted in before.
//!   Losing data then needs a stale leader still running beside the new
//!   one at the moment of the wipe.
//! - After [`VOTE_GUARD`] without a leader (every node lost its tail in a
//!   power failure) the guard lifts and votes go by the logs as usual.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use floret_store::{ShardId, StorageError};

use super::Shards;
use super::bootstrap::PROBE_INTERVAL;

/// The longest a node that may have forgotten votes or entries refuses to vote.
pub const VOTE_GUARD: Duration = Duration::from_secs(10);
/// How often bootstrap checks whether a guarded shard may vote again.
const GUARD_CHECK_INTERVAL: Duration = Duration::from_millis(200);

impl Shards {
    /// Whether this node must refuse a vote for `shard` now (see the
    /// module's vote guard). The guard lifts once a leader other than this
    /// node is known, or when it expires.
    pub fn refuses_vote(&self, shard: ShardId) -> bool {
        let mut guard = self
            .vote_guard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(&until) = guard.get(&shard) else {
            return false;
        };
        let leader_reached_us = self.any_group(shard).is_some_and(|group| {
            group
                .raft
                .metrics()
                .borrow()
                .current_leader
                .is_some_and(|leader| leader != self.node_id())
        });
        if leader_reached_us || Instant::now() >= until {
            guard.remove(&shard);
            drop(guard);
            self.lift_vote_guard(shard, leader_reached_us);
            return false;
        }
        true
    }

    /// Lets `shard`'s group vote and campaign again (its guard entry is gone).
    fn lift_vote_guard(&self, shard: ShardId, leader_reached_us: bool) {
        if let Some(group) = self.any_group(shard) {
            group.raft.runtime_config().elect(true);
        }
        tracing::info!(shard, leader_reached_us, "vote guard lifted");
    }

    /// The shards whose vote guard is still up.
    pub(super) fn guarded_shards(&self) -> Vec<ShardId> {
        self.vote_guard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .keys()
            .copied()
            .collect()
    }

    /// Checks every guarded shard until none is left, so a shard nobody
    /// asks for a vote still campaigns again once a leader reached it or
    /// the guard expired.
    pub(super) async fn release_vote_guards(&self) {
        loop {
            let guarded = self.guarded_shards();
            if guarded.is_empty() {
                return;
            }
            for shard in guarded {
                self.refuses_vote(shard);
            }
            tokio::time::sleep(GUARD_CHECK_INTERVAL).await;
        }
    }

    /// For a node on a new data dir: asks the peers until each guarded
    /// shard is decided. A shard no replica has is new (the cluster is being
    /// founded), so its guard goes; one that exists elsewhere keeps it.
    pub(super) async fn lift_vote_guard_where_new(&self) {
        let mut undecided: BTreeSet<ShardId> = self.guarded_shards().into_iter().collect();
        let until = Instant::now() + VOTE_GUARD;
        while !undecided.is_empty() && Instant::now() < until {
            let answers = self.probe_peers().await;
            undecided.retain(|&shard| {
                let (exists, all_answered) = self.presence(shard, &answers);
                if exists {
                    if !self.founding.members().contains(&self.node_id()) {
                        tracing::debug!(
                            shard,
                            "a node that joined: no vote until a leader moves the shard here"
                        );
                    } else if self
                        .asked_which_shards_exist
                        .load(std::sync::atomic::Ordering::Relaxed)
                    {
                        tracing::info!(
                            shard,
                            "a peer founded this new cluster's shard first: no vote until its leader reaches us"
                        );
                    } else {
                        tracing::warn!(
                            shard,
                            "rejoining a shard after losing this node's data: no vote until its leader reaches us"
                        );
                    }
                    return false;
                }
                if all_answered {
                    self.vote_guard
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .remove(&shard);
                    self.lift_vote_guard(shard, false);
                    return false;
                }
                true
            });
            if !undecided.is_empty() {
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
        }
    }
}

/// Rewrites a committed vote for this node as an uncommitted one, so that
/// openraft does not resume leadership from it at start: a node whose log
/// lost its tail may lack entries it committed as leader, and resuming
/// would impose its shorter log on the followers.
pub(super) async fn forget_leadership(
    log_store: &mut floret_store::LogStore,
) -> Result<(), StorageError> {
    use openraft::storage::RaftLogStorage;
    if let Some(vote) = log_store.read_vote().await?
        && vote.is_committed()
    {
        log_store
            .save_vote(&openraft::Vote {
                leader_id: vote.leader_id,
                committed: false,
            })
            .await?;
    }
    Ok(())
}
