//! Retiring replicas a move took away: this node's group of such a shard
//! is stopped, everything the node stores of the shard is deleted
//! (`floret_store::ShardStorage::retire`), and a fresh, uninitialised
//! group takes its place, as on a node that never held the shard, so a
//! later move can bring the shard back here.
//!
//! This module only carries the steps out; whether a replica may go is
//! decided by the caller, from what the shard's leader reports, before
//! the group stops and again after (a stopped replica acks nothing more,
//! so a configuration that excludes it then cannot come to count on it).
//!
//! A fresh group refuses votes until a leader reaches it or the vote
//! guard expires: it forgot the votes its old replica gave.

use std::time::Instant;

use openraft::storage::RaftLogStorage;

use super::{Shards, ShardsError, VOTE_GUARD, open_group};
use floret_store::ShardId;

impl Shards {
    /// The shards whose replica here holds any state (a term, entries or
    /// an applied state) although the placement over the current members
    /// does not put this node there, and which this node does not lead:
    /// replicas a move took away, or is taking away.
    pub fn stale_replicas(&self) -> Vec<ShardId> {
        let node_id = self.node_id();
        let placement = self.replicas();
        self.opened_groups()
            .filter(|group| !placement.holds(node_id, group.id))
            .filter(|group| {
                let metrics = group.raft.metrics();
                let metrics = metrics.borrow();
                let holds_state = metrics.current_term > 0
                    || metrics.last_log_index.is_some()
                    || metrics.last_applied.is_some();
                holds_state && metrics.current_leader != Some(node_id)
            })
            .map(|group| group.id)
            .collect()
    }

    /// Stops the group of `shard` for good (its replica votes, acks and
    /// applies nothing more) and returns the highest term it knew. Follow
    /// with [`Shards::restart_group`], after an error too: the group may
    /// have stopped before the error.
    pub async fn stop_group(&self, shard: ShardId) -> Result<u64, ShardsError> {
        let raft_error = |reason: String| ShardsError::Raft { shard, reason };
        let group = self
            .opened_group(shard)
            .ok_or_else(|| raft_error("no such shard".into()))?;
        group
            .raft
            .shutdown()
            .await
            .map_err(|e| raft_error(e.to_string()))?;
        let reported = group.raft.metrics().borrow().current_term;
        let stored = self
            .storage
            .log_store(shard)
            .read_vote()
            .await
            .map_err(|e| raft_error(e.to_string()))?
            .map_or(0, |vote| vote.leader_id.term);
        Ok(reported.max(stored))
    }

    /// Opens the group of `shard` again after [`Shards::stop_group`]:
    /// when `retire`, on nothing, once everything this node stored of the
    /// shard is deleted; otherwise on the state it kept. A deletion that
    /// fails leaves the group stopped: its half-deleted state must not be
    /// served, and the next start finishes the deletion.
    pub async fn restart_group(&self, shard: ShardId, retire: bool) -> Result<(), ShardsError> {
        let slot = self.groups.get(&shard).ok_or_else(|| ShardsError::Raft {
            shard,
            reason: "no such shard".into(),
        })?;
        if retire {
            self.storage
                .retire(shard)
                .await
                .map_err(|error| ShardsError::Raft {
                    shard,
                    reason: format!(
                        "deleting the retired replica's state failed ({error}); the group stays stopped until the node restarts and finishes it"
                    ),
                })?;
            metrics::counter!("floret_replicas_retired_total").increment(1);
        }
        let group = open_group(
            shard,
            &self.peers,
            &self.raft_config,
            &self.storage,
            &self.events,
            false,
        )
        .await?;
        if retire {
            group.raft.runtime_config().elect(false);
            self.vote_guard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .insert(shard, Instant::now() + VOTE_GUARD);
        }
        let group = std::sync::Arc::new(group);
        let node_stopped = {
            let stopped = self
                .stopped
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if !*stopped {
                slot.send_replace(group.clone());
            }
            *stopped
        };
        if node_stopped {
            let _stopping_anyway = group.raft.shutdown().await;
        }
        Ok(())
    }

    /// Lifts every vote guard whose shard a leader reached or whose time
    /// ran out (a guard is otherwise lifted when a vote is asked for).
    pub fn lift_expired_vote_guards(&self) {
        for shard in self.guarded_shards() {
            self.refuses_vote(shard);
        }
    }
}
