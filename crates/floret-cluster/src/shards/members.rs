//! The member list as this node's replica of the membership group holds
//! it: the voters and learners of the group's configuration with their
//! peer addresses, and the placement epoch (the log index of that
//! configuration, which grows with every change of members). The peers
//! this node dials and the replica placement follow it
//! ([`Shards::follow_members`]).
//!
//! A member being removed stays in the group, marked leaving, until no
//! shard holds a replica on it: the shards are placed over the members
//! that are not leaving, so every leader (the leaving node's own
//! included, which receives the mark) moves replicas off it. Each member's
//! record is its peer address, followed by [`LEAVING_MARK`] while it leaves
//! (in openraft's `BasicNode.addr`).
//!
//! IMPLEMENTATION CAVEATS
//! - It is the configuration this replica acts on, the latest it holds,
//!   which may not be committed yet.
//! - A node's client address is not in it: the gossip view carries those.
//! - Every member sits in its own seat: replacing a node in its seat
//!   (`placement.rs`) is not recorded yet.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use floret_store::NodeId;
use openraft::BasicNode;

use super::{MEMBERSHIP_GROUP, Shards, ShardsError};
use crate::placement::ReplicaPlacement;

/// What follows a leaving member's peer address in its record.
pub const LEAVING_MARK: &str = " leaving";

/// A member's record in the membership group's configuration.
pub(super) fn member_record(peer_address: &str, leaving: bool) -> BasicNode {
    let mark = if leaving { LEAVING_MARK } else { "" };
    BasicNode::new(format!("{peer_address}{mark}"))
}

/// A member's peer address and whether it is leaving, from its record.
fn read_member_record(record: &BasicNode) -> (&str, bool) {
    match record.addr.strip_suffix(LEAVING_MARK) {
        Some(peer_address) => (peer_address, true),
        None => (record.addr.as_str(), false),
    }
}

/// One member, as the membership group holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its node id.
    pub id: NodeId,
    /// Where the other nodes dial it.
    pub peer_address: String,
    /// Whether it votes in the membership group (learners follow it).
    pub voter: bool,
    /// Whether it is being removed: no shard is placed on it, and it leaves
    /// the group once no shard holds a replica on it.
    pub leaving: bool,
}

/// The member list at one epoch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MembersView {
    /// The log index of the configuration (the founding one is 0); None
    /// before the group is founded.
    pub epoch: Option<u64>,
    /// The membership group's leader, as this replica knows it.
    pub leader: Option<NodeId>,
    /// The members, in id order.
    pub members: Vec<Member>,
}

impl Shards {
    /// The member list as this node's replica of the membership group holds it.
    pub fn members_view(&self) -> MembersView {
        let metrics = self.groups[&MEMBERSHIP_GROUP]
            .raft
            .metrics()
            .borrow()
            .clone();
        let stored = &metrics.membership_config;
        let voters: BTreeSet<NodeId> = stored.membership().voter_ids().collect();
        MembersView {
            epoch: stored.log_id().map(|log_id| log_id.index),
            leader: metrics.current_leader,
            members: stored
                .membership()
                .nodes()
                .map(|(&id, record)| {
                    let (peer_address, leaving) = read_member_record(record);
                    Member {
                        id,
                        peer_address: peer_address.to_owned(),
                        voter: voters.contains(&id),
                        leaving,
                    }
                })
                .collect(),
        }
    }
}

impl MembersView {
    /// The members shards are placed on: those not leaving, in id order.
    pub fn placed(&self) -> Vec<NodeId> {
        self.members
            .iter()
            .filter(|member| !member.leaving)
            .map(|member| member.id)
            .collect()
    }
}

impl Shards {
    /// Makes the members the membership group holds (once it is founded)
    /// the peers this node dials, at the addresses this node was configured
    /// with where it was, and places the shards over those not leaving.
    /// Returns whether anything changed. A node the group does not name
    /// (removed) or marks leaving places nothing on itself, so the shards
    /// it leads move away from it.
    pub fn follow_members(&self) -> Result<bool, ShardsError> {
        let view = self.members_view();
        let placed = view.placed();
        if view.epoch.is_none() || placed.is_empty() {
            return Ok(false);
        }
        let me = self.node_id();
        let mut addresses: BTreeMap<NodeId, String> = view
            .members
            .iter()
            .map(|member| {
                let address = self
                    .configured_addresses
                    .get(&member.id)
                    .unwrap_or(&member.peer_address);
                (member.id, address.clone())
            })
            .collect();
        if let std::collections::btree_map::Entry::Vacant(own) = addresses.entry(me) {
            tracing::warn!(
                epoch = view.epoch,
                "this node is no longer a member of the cluster: its shards move to the members"
            );
            own.insert(self.peers.address(me).unwrap_or_default());
        }
        let peers_changed = self.peers.set_members(addresses)?;
        let mut replicas = self
            .replicas
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let placement_changed = replicas.members() != placed;
        if placement_changed {
            *replicas = Arc::new(ReplicaPlacement::new(
                self.placement.shard_count(),
                &placed,
                self.replication_factor,
            ));
            tracing::info!(
                epoch = view.epoch,
                placed = ?placed,
                "shards placed over the members at this epoch"
            );
        }
        Ok(peers_changed || placement_changed)
    }

    /// Follows the membership group for as long as this node runs: every
    /// change of its configuration updates the peers and the placement.
    pub fn spawn_member_follower(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let shards = Arc::clone(self);
        let mut metrics = self.groups[&MEMBERSHIP_GROUP].raft.metrics();
        tokio::spawn(async move {
            let mut seen = None;
            while metrics.changed().await.is_ok() {
                let configuration = metrics.borrow().membership_config.log_id().to_owned();
                if configuration == seen {
                    continue;
                }
                seen = configuration;
                if let Err(error) = shards.follow_members() {
                    tracing::error!(%error, "cannot follow the membership group");
                }
            }
        })
    }
}
