//! The node's shards: one openraft group per shard, all on the node's one
//! sled database, created at start and shut down together.
//!
//! A data dir that never saw a shard initialises it as a one-member group; a
//! data dir that did asks the group to elect at once instead of waiting out
//! the election timeout, so a restarted node serves within a moment.
//!
//! IMPLEMENTATION CAVEATS
//! - Every group has exactly this node as member; membership changes and
//!   replica sets come with the cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use floret_store::{AppliedListener, Database, NodeId, OpenError, Raft, ShardId, ShardReader};
use openraft::{BasicNode, SnapshotPolicy};

use crate::network::NoPeers;
use crate::placement::ShardPlacement;

/// Raft timing and snapshot tunables shared by every shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftTuning {
    /// Leader heartbeat; each group sends its own, so keep it modest on small machines.
    pub heartbeat: Duration,
    /// Lower bound of the election timeout; well above scheduling noise on a loaded 2-core box.
    pub election_timeout_min: Duration,
    /// Upper bound of the election timeout.
    pub election_timeout_max: Duration,
    /// Entries applied since the last snapshot before a new one is built.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot, so a briefly lagging
    /// replica catches up from the log instead of a whole snapshot.
    pub logs_kept_after_snapshot: u64,
}

impl Default for RaftTuning {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(250),
            election_timeout_min: Duration::from_millis(1_500),
            election_timeout_max: Duration::from_millis(3_000),
            snapshot_every_entries: 20_000,
            logs_kept_after_snapshot: 1_000,
        }
    }
}

/// Why the shards could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShardsError {
    /// The data dir refused the configuration.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// sled failed to open a shard's trees.
    #[error("cannot open the trees of shard {shard}: {source}")]
    Trees {
        /// The shard.
        shard: ShardId,
        /// The sled failure.
        #[source]
        source: sled::Error,
    },
    /// openraft refused the configuration or failed to start a group.
    #[error("cannot start the raft group of shard {shard}: {reason}")]
    Raft {
        /// The shard.
        shard: ShardId,
        /// openraft's complaint.
        reason: String,
    },
}

/// One shard on this node: its raft group and read access to its queues.
pub struct ShardGroup {
    /// The shard's index.
    pub id: ShardId,
    /// The shard's raft group.
    pub raft: Raft,
    /// Reads the shard's applied state.
    pub reader: ShardReader,
}

/// Every shard of the node, and the placement that maps producers to them.
pub struct Shards {
    node_id: NodeId,
    groups: Vec<ShardGroup>,
    placement: ShardPlacement,
}

impl Shards {
    /// Opens and starts every shard's raft group.
    pub async fn start(
        node_id: NodeId,
        address: &str,
        database: &Database,
        shard_count: u32,
        tuning: &RaftTuning,
        events: AppliedListener,
    ) -> Result<Self, ShardsError> {
        database.claim_shard_count(shard_count)?;
        let config =
            Arc::new(raft_config(tuning).map_err(|reason| ShardsError::Raft { shard: 0, reason })?);
        let mut groups = Vec::with_capacity(shard_count as usize);
        for shard in 0..shard_count {
            let trees = |source| ShardsError::Trees { shard, source };
            let raft_error = |reason: String| ShardsError::Raft { shard, reason };
            let log_store = database.log_store(shard);
            let state_machine = database
                .state_machine(shard, Some(events.clone()))
                .map_err(trees)?;
            let reader = state_machine.reader();
            let raft = Raft::new(node_id, config.clone(), NoPeers, log_store, state_machine)
                .await
                .map_err(|e| raft_error(e.to_string()))?;
            if raft
                .is_initialized()
                .await
                .map_err(|e| raft_error(e.to_string()))?
            {
                raft.trigger()
                    .elect()
                    .await
                    .map_err(|e| raft_error(e.to_string()))?;
            } else {
                let members = BTreeMap::from([(node_id, BasicNode::new(address))]);
                raft.initialize(members)
                    .await
                    .map_err(|e| raft_error(e.to_string()))?;
            }
            groups.push(ShardGroup {
                id: shard,
                raft,
                reader,
            });
        }
        Ok(Self {
            node_id,
            groups,
            placement: ShardPlacement::new(shard_count),
        })
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// One shard; panics on an id outside `0..shard_count`, which placement never yields.
    pub fn group(&self, shard: ShardId) -> &ShardGroup {
        &self.groups[shard as usize]
    }

    /// Every shard, in id order.
    pub fn groups(&self) -> &[ShardGroup] {
        &self.groups
    }

    /// Producer -> shard placement.
    pub fn placement(&self) -> &ShardPlacement {
        &self.placement
    }

    /// Whether this node currently leads `shard`.
    pub fn leads(&self, shard: ShardId) -> bool {
        self.group(shard).raft.metrics().borrow().current_leader == Some(self.node_id)
    }

    /// Stops every raft group.
    pub async fn shutdown(&self) {
        for group in &self.groups {
            if let Err(error) = group.raft.shutdown().await {
                tracing::warn!(shard = group.id, %error, "raft group did not stop cleanly");
            }
        }
    }
}

fn raft_config(tuning: &RaftTuning) -> Result<openraft::Config, String> {
    let config = openraft::Config {
        cluster_name: "floret".into(),
        heartbeat_interval: tuning.heartbeat.as_millis() as u64,
        election_timeout_min: tuning.election_timeout_min.as_millis() as u64,
        election_timeout_max: tuning.election_timeout_max.as_millis() as u64,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(tuning.snapshot_every_entries),
        max_in_snapshot_log_to_keep: tuning.logs_kept_after_snapshot,
        ..Default::default()
    };
    config.validate().map_err(|e| e.to_string())
}
