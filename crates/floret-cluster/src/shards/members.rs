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
//! included, which receives the mark) moves replicas off it.
//!
//! Each member sits in a seat of the placement ring (`placement.rs`): its
//! own id, or the seat of the member it replaced, whose replicas it takes.
//! A member's record (openraft's `BasicNode.addr`) is its peer address,
//! then ` seat=N` when it sits in a seat not its own, then
//! [`LEAVING_MARK`] while it leaves.
//!
//! IMPLEMENTATION CAVEATS
//! - It is the configuration this replica acts on, the latest it holds,
//!   which may not be committed yet.
//! - A node's client address is not in it: the gossip view carries those.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use floret_store::NodeId;
use openraft::BasicNode;

use super::{Shards, ShardsError};
use crate::placement::ReplicaPlacement;

/// What ends a leaving member's record.
pub const LEAVING_MARK: &str = " leaving";

/// What precedes the seat in the record of a member that sits in a seat
/// not its own.
const SEAT_MARK: &str = " seat=";

/// The record of member `node`, dialled at `peer_address`, in `seat`.
pub(super) fn member_record(
    node: NodeId,
    peer_address: &str,
    seat: NodeId,
    leaving: bool,
) -> BasicNode {
    let seat = if seat == node {
        String::new()
    } else {
        format!("{SEAT_MARK}{seat}")
    };
    let mark = if leaving { LEAVING_MARK } else { "" };
    BasicNode::new(format!("{peer_address}{seat}{mark}"))
}

/// Member `node`'s peer address, seat, and whether it is leaving, from its
/// record. A seat that does not read as an id is the member's own.
fn read_member_record(node: NodeId, record: &BasicNode) -> (&str, NodeId, bool) {
    let (rest, leaving) = match record.addr.strip_suffix(LEAVING_MARK) {
        Some(rest) => (rest, true),
        None => (record.addr.as_str(), false),
    };
    match rest.split_once(SEAT_MARK) {
        Some((peer_address, seat)) => (peer_address, seat.parse().unwrap_or(node), leaving),
        None => (rest, node, leaving),
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
    /// The seat it sits in on the placement ring: its own id, or the seat
    /// of the member it replaced.
    pub seat: NodeId,
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
        let metrics = self.membership_group().raft.metrics().borrow().clone();
        let stored = &metrics.membership_config;
        let voters: BTreeSet<NodeId> = stored.membership().voter_ids().collect();
        MembersView {
            epoch: stored.log_id().map(|log_id| log_id.index),
            leader: metrics.current_leader,
            members: stored
                .membership()
                .nodes()
                .map(|(&id, record)| {
                    let (peer_address, seat, leaving) = read_member_record(id, record);
                    Member {
                        id,
                        peer_address: peer_address.to_owned(),
                        voter: voters.contains(&id),
                        leaving,
                        seat,
                    }
                })
                .collect(),
        }
    }
}

impl MembersView {
    /// The seats of the members shards are placed on, each with its member.
    /// Changes never seat two such members in one seat; were it so, the
    /// higher id would hold the seat.
    pub fn seats(&self) -> BTreeMap<NodeId, NodeId> {
        self.members
            .iter()
            .filter(|member| !member.leaving)
            .map(|member| (member.seat, member.id))
            .collect()
    }

    /// The member `node`, if it is one.
    pub fn member(&self, node: NodeId) -> Option<&Member> {
        self.members.iter().find(|member| member.id == node)
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
        let seats = view.seats();
        if view.epoch.is_none() || seats.is_empty() {
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
        let placement = ReplicaPlacement::seated(
            self.placement.shard_count(),
            &seats,
            self.replication_factor,
        );
        let placement_changed = **replicas != placement;
        if placement_changed {
            tracing::info!(
                epoch = view.epoch,
                placement = placement.description(),
                "shards placed over the members at this epoch"
            );
            *replicas = Arc::new(placement);
        }
        Ok(peers_changed || placement_changed)
    }

    /// Follows the membership group for as long as this node runs: every
    /// change of its configuration updates the peers and the placement.
    pub fn spawn_member_follower(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let shards = Arc::clone(self);
        let mut metrics = self.membership_group().raft.metrics();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written_seat_and_mark_included() {
        for (node, seat, leaving) in [(4, 4, false), (4, 2, false), (4, 4, true), (4, 2, true)] {
            let record = member_record(node, "10.0.0.4:7801", seat, leaving);
            assert_eq!(
                read_member_record(node, &record),
                ("10.0.0.4:7801", seat, leaving)
            );
        }
    }

    #[test]
    fn a_record_written_before_seats_were_recorded_reads_as_the_members_own_seat() {
        assert_eq!(
            read_member_record(3, &BasicNode::new("127.0.0.1:9003 leaving")),
            ("127.0.0.1:9003", 3, true)
        );
        assert_eq!(
            member_record(3, "127.0.0.1:9003", 3, false),
            BasicNode::new("127.0.0.1:9003")
        );
    }
}
