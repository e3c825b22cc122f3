//! Handing a shard's leadership back to its preferred replica, on the
//! leader's side. The leader grants it only to the shard's preferred
//! replica, and only once it is caught up (it has just called, so it is
//! reachable whatever the gossip view says);
//! then it pauses the shard's proposer, stops dispatching the shard and
//! turns its heartbeats off, and tells the replica its last log entry.
//!
//! openraft 0.9 has no leadership transfer, but a leader grants a vote to
//! a candidate whose log is as long as its own once it has led for longer
//! than the leader lease (its lease only holds against a leader it heard
//! from). So the replica calls its election as soon as its log holds that
//! entry, and wins it at once with the leader's vote; the shard stalls for
//! the election, not for a lease. A leader elected less than a lease ago
//! refuses, and the replica wins once the followers' lease has lapsed
//! (heartbeats are off). If nobody took over once that has had time to
//! happen, the leader leads on.

use std::sync::Arc;
use std::time::Duration;

use floret_cluster::Shards;
use floret_store::{NodeId, ShardId};

use crate::deliver::DispatcherHandle;
use crate::produce::proposer::Proposers;

/// Entries a preferred replica may lag behind and still be handed the leadership.
const HAND_BACK_MAX_LAG: u64 = 64;

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
    pub fn grant(&self, shard: ShardId, requester: NodeId) -> Result<SteppedAside, String> {
        let me = self.shards.node_id();
        let Some(group) = self.shards.group(shard) else {
            return Err(format!("node {me} holds no replica of shard {shard}"));
        };
        if self.shards.replicas().preferred_leader(shard) != requester {
            return Err(format!(
                "node {requester} is not the preferred replica of shard {shard}"
            ));
        }
        let metrics = group.raft.metrics().borrow().clone();
        if metrics.current_leader != Some(me) {
            return Err(format!("node {me} does not lead shard {shard}"));
        }
        let last_log = metrics.last_log_index.unwrap_or(0);
        let matched = metrics
            .replication
            .as_ref()
            .and_then(|replication| replication.get(&requester).cloned().flatten())
            .map(|log_id| log_id.index)
            .unwrap_or(0);
        if matched + HAND_BACK_MAX_LAG < last_log {
            return Err(format!(
                "node {requester} is {} entries behind on shard {shard}",
                last_log - matched
            ));
        }
        if self.proposers.get(shard).is_none() {
            return Err(format!("shard {shard} has no proposer here"));
        }
        tracing::info!(
            shard,
            to = requester,
            "handing the shard's leadership back to its preferred replica"
        );
        let lease = self.shards.tuning().election_timeout_max;
        self.step_aside(shard, lease * 2 + Duration::from_millis(500));
        Ok(SteppedAside {
            last_log_index: group.raft.metrics().borrow().last_log_index.unwrap_or(0),
            elect_within: lease,
        })
    }

    /// Pauses `shard`'s proposer, dispatch and heartbeats for `step_aside`,
    /// then resumes them; dispatch only if this node still leads.
    fn step_aside(&self, shard: ShardId, step_aside: Duration) {
        let (Some(group), Some(proposer)) = (self.shards.group(shard), self.proposers.get(shard))
        else {
            return;
        };
        let (raft, proposer) = (group.raft.clone(), proposer.clone());
        proposer.pause(step_aside);
        raft.runtime_config().heartbeat(false);
        self.dispatcher.leadership(shard, false);
        let (dispatcher, me) = (self.dispatcher.clone(), self.shards.node_id());
        tokio::spawn(async move {
            tokio::time::sleep(step_aside).await;
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
    }
}
