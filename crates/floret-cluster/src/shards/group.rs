//! One shard's raft group on this node, and opening it on what the node
//! stores of the shard (at start, and again when a retired replica's
//! group is replaced).

use std::sync::Arc;

use floret_store::{AppliedListener, Raft, ShardId, ShardReader, ShardStorage};

use super::vote_guard::forget_leadership;
use super::{MEMBERSHIP_GROUP, ShardsError};
use crate::network::PeerNetwork;
use crate::peers::Peers;

/// One shard on this node: its raft group and read access to its queues.
pub struct ShardGroup {
    /// The shard's index.
    pub id: ShardId,
    /// The shard's raft group.
    pub raft: Raft,
    /// Reads the shard's applied state.
    pub reader: ShardReader,
}

/// Opens the raft group of `shard` (or the membership group) on what this
/// node stores of it. `lost_tail`: the log lost its tail at open, so a
/// leadership its stored vote records is not resumed.
pub(super) async fn open_group(
    shard: ShardId,
    peers: &Arc<Peers>,
    config: &Arc<openraft::Config>,
    storage: &ShardStorage,
    events: &AppliedListener,
    lost_tail: bool,
) -> Result<ShardGroup, ShardsError> {
    let trees = |source| ShardsError::Trees { shard, source };
    let raft_error = |reason: String| ShardsError::Raft { shard, reason };
    let events = (shard != MEMBERSHIP_GROUP).then(|| events.clone());
    let mut log_store = storage.log_store(shard);
    if lost_tail {
        forget_leadership(&mut log_store)
            .await
            .map_err(|e| raft_error(e.to_string()))?;
    }
    let state_machine = storage.state_machine(shard, events).map_err(trees)?;
    let reader = state_machine.reader();
    let network = PeerNetwork::new(shard, peers.clone());
    let raft = Raft::new(
        peers.node_id(),
        config.clone(),
        network,
        log_store,
        state_machine,
    )
    .await
    .map_err(|e| raft_error(e.to_string()))?;
    Ok(ShardGroup {
        id: shard,
        raft,
        reader,
    })
}
