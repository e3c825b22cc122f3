//! Changing the members: adding a node, removing one, and replacing one
//! by a new node in its seat, on the membership group's leader. Each change
//! is checked first ([`check_change`]: no shrink below the replication
//! factor, a live majority for every shard that moves), then committed as
//! the group's own configuration. The placement, the peers and the shard
//! moves follow from that on every node (`members.rs`, and the server's
//! move driver).
//!
//! A removed member is first marked leaving (and loses its vote here); it
//! leaves the group once no shard holds a replica on it
//! ([`Shards::forget_leaving_member`], which the server calls when every
//! shard's leader says so). A replaced member leaves the same way, in the
//! same configuration change that seats the new node in its seat, so
//! exactly its replicas move to the new node.
//!
//! The group's voters are the first [`MAX_MEMBERSHIP_VOTERS`] members to
//! join that are still members; the rest follow it as learners
//! ([`membership_voters`]).
//!
//! IMPLEMENTATION CAVEATS
//! - Changes do not wait for the shards to finish moving; `floret status`
//!   and `floret cluster moves` show where each shard's replicas are.

use std::collections::{BTreeMap, BTreeSet};

use floret_store::NodeId;
use openraft::ChangeMembers;

use super::members::member_record;
use super::{MembersView, Shards};
use crate::gossip::Liveness;
use crate::move_steps::{ChangeRefused, check_change};
use crate::placement::ReplicaPlacement;

/// The most voters the membership group has; further members are learners.
pub const MAX_MEMBERSHIP_VOTERS: usize = 5;

/// A change of members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberChange {
    /// Make `node` a member, dialled at `peer_address`.
    Add {
        /// The new member's id.
        node: NodeId,
        /// Its peer port, `host:port`.
        peer_address: String,
    },
    /// Make `node` a member no more.
    Remove {
        /// The member's id.
        node: NodeId,
    },
    /// Make `with` a member, dialled at `peer_address`, in the seat of
    /// `node`, which becomes a member no more.
    Replace {
        /// The member replaced.
        node: NodeId,
        /// The new member's id.
        with: NodeId,
        /// Its peer port, `host:port`.
        peer_address: String,
    },
}

/// Why a change of members was not made.
#[derive(Debug, thiserror::Error)]
pub enum MemberChangeError {
    /// This node does not lead the membership group.
    #[error("node {me} does not lead the membership group (its leader: {leader:?})")]
    NotLeader {
        /// This node.
        me: NodeId,
        /// The leader, if known.
        leader: Option<NodeId>,
    },
    /// The change would leave the cluster unsafe.
    #[error(transparent)]
    Refused(#[from] ChangeRefused),
    /// The change is malformed.
    #[error("{0}")]
    Invalid(String),
    /// raft did not commit it.
    #[error("the membership group did not commit the change: {0}")]
    Raft(String),
}

/// The voters the membership group keeps when its members become
/// `members_after`: the voters that stay, then the lowest other members,
/// up to [`MAX_MEMBERSHIP_VOTERS`].
pub fn membership_voters(
    voters_now: &BTreeSet<NodeId>,
    members_after: &BTreeSet<NodeId>,
) -> BTreeSet<NodeId> {
    let mut voters: BTreeSet<NodeId> = voters_now.intersection(members_after).copied().collect();
    for &member in members_after {
        if voters.len() >= MAX_MEMBERSHIP_VOTERS {
            break;
        }
        voters.insert(member);
    }
    voters
}

impl Shards {
    /// Makes `change` on the membership group, which this node must lead.
    /// Returns the members after it. A change already made (the node is a
    /// member at that address in that seat, or leaving, or no member)
    /// changes nothing but the voters, if a change cut off before left them
    /// behind.
    pub async fn change_members(
        &self,
        change: MemberChange,
    ) -> Result<MembersView, MemberChangeError> {
        let me = self.node_id();
        let membership_group = self.membership_group();
        let raft = &membership_group.raft;
        let before = self.members_view();
        if before.leader != Some(me) {
            return Err(MemberChangeError::NotLeader {
                me,
                leader: before.leader,
            });
        }
        let voters_now: BTreeSet<NodeId> = before
            .members
            .iter()
            .filter(|member| member.voter)
            .map(|member| member.id)
            .collect();
        let seats_before = before.seats();
        let mut seats_after = seats_before.clone();
        let mut records = BTreeMap::new();
        match change {
            MemberChange::Add { node, peer_address } => {
                check_new_member(node, &peer_address)?;
                match before.member(node) {
                    Some(member) if member.peer_address == peer_address && !member.leaving => {}
                    Some(member) => {
                        seat_free_for(&seats_before, member.seat, node)?;
                        seats_after.insert(member.seat, node);
                        records
                            .insert(node, member_record(node, &peer_address, member.seat, false));
                    }
                    None => {
                        seat_free_for(&seats_before, node, node)?;
                        seats_after.insert(node, node);
                        records.insert(node, member_record(node, &peer_address, node, false));
                    }
                }
            }
            MemberChange::Remove { node } => {
                if let Some(member) = before.member(node).filter(|member| !member.leaving) {
                    seats_after.remove(&member.seat);
                    records.insert(
                        node,
                        member_record(node, &member.peer_address, member.seat, true),
                    );
                }
            }
            MemberChange::Replace {
                node,
                with,
                peer_address,
            } => {
                check_new_member(with, &peer_address)?;
                if node == with {
                    return Err(MemberChangeError::Invalid(format!(
                        "node {node} cannot replace itself: give the new node a new id"
                    )));
                }
                let seat = match (before.member(node), before.member(with)) {
                    (_, Some(new)) if new.peer_address == peer_address && !new.leaving => {
                        // Made before: only the old member's mark may be missing.
                        new.seat
                    }
                    (_, Some(_)) => {
                        return Err(MemberChangeError::Invalid(format!(
                            "node {with} is already a member: a replacement needs a new id"
                        )));
                    }
                    (Some(old), None) => old.seat,
                    (None, None) => {
                        return Err(MemberChangeError::Invalid(format!(
                            "node {node} is not a member"
                        )));
                    }
                };
                if let Some(old) = before.member(node).filter(|old| !old.leaving) {
                    records.insert(node, member_record(node, &old.peer_address, old.seat, true));
                }
                if before.member(with).is_none() {
                    if seats_before.contains_key(&with) {
                        return Err(MemberChangeError::Invalid(format!(
                            "{with} is the seat of a member: a replacement needs an id no member sits as"
                        )));
                    }
                    seat_free_for(&seats_before, seat, node)?;
                    records.insert(with, member_record(with, &peer_address, seat, false));
                }
                seats_after.insert(seat, with);
            }
        }
        if !records.is_empty() {
            self.check_member_change(&seats_before, &seats_after)?;
            tracing::info!(
                records = ?records,
                "changing the members: placed after, by seat, {seats_after:?}"
            );
            raft.change_membership(ChangeMembers::SetNodes(records), true)
                .await
                .map_err(|e| MemberChangeError::Raft(e.to_string()))?;
        }
        let members_after: BTreeSet<NodeId> = seats_after.values().copied().collect();
        let voters = membership_voters(&voters_now, &members_after);
        if voters != voters_now {
            // A voter that leaves stays a learner: the configurations that
            // follow still reach it.
            raft.change_membership(voters, true)
                .await
                .map_err(|e| MemberChangeError::Raft(e.to_string()))?;
        }
        Ok(self.members_view())
    }

    /// Takes `node`, a leaving member that no longer votes in the
    /// membership group, out of the group: called once no shard holds a
    /// replica on it. Anything else is left as it is.
    pub async fn forget_leaving_member(&self, node: NodeId) -> Result<(), MemberChangeError> {
        let view = self.members_view();
        let leaving_learner = view
            .members
            .iter()
            .any(|member| member.id == node && member.leaving && !member.voter);
        if !leaving_learner {
            return Ok(());
        }
        if view.leader != Some(self.node_id()) {
            return Err(MemberChangeError::NotLeader {
                me: self.node_id(),
                leader: view.leader,
            });
        }
        tracing::info!(
            node,
            "no shard holds a replica on the leaving member: it leaves the membership group"
        );
        self.membership_group()
            .raft
            .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([node])), false)
            .await
            .map(drop)
            .map_err(|e| MemberChangeError::Raft(e.to_string()))
    }

    /// Refuses a change from the members in `seats_before` to those in
    /// `seats_after` that [`check_change`] finds unsafe, judging liveness
    /// by the gossip view (a member it has not declared dead counts as
    /// live).
    fn check_member_change(
        &self,
        seats_before: &BTreeMap<NodeId, NodeId>,
        seats_after: &BTreeMap<NodeId, NodeId>,
    ) -> Result<(), ChangeRefused> {
        let before: Vec<NodeId> = seats_before.values().copied().collect();
        let after: Vec<NodeId> = seats_after.values().copied().collect();
        let shard_count = self.placement.shard_count();
        let live: BTreeSet<NodeId> = before
            .iter()
            .chain(&after)
            .copied()
            .filter(|&node| node == self.node_id() || self.liveness(node) != Some(Liveness::Dead))
            .collect();
        let placement =
            |seats| ReplicaPlacement::seated(shard_count, seats, self.replication_factor);
        check_change(
            &placement(seats_before),
            &placement(seats_after),
            &before,
            &after,
            self.replication_factor,
            &live,
        )
    }
}

/// Refuses a new member's id or peer address that cannot be one.
fn check_new_member(node: NodeId, peer_address: &str) -> Result<(), MemberChangeError> {
    if node == 0 {
        return Err(MemberChangeError::Invalid("node ids are > 0".into()));
    }
    if peer_address.trim().is_empty() || peer_address.contains(' ') {
        return Err(MemberChangeError::Invalid(format!(
            "a new member needs the peer address the others dial, host:port, not {peer_address:?}"
        )));
    }
    Ok(())
}

/// Refuses to seat `node` in `seat` when another member sits there.
fn seat_free_for(
    seats: &BTreeMap<NodeId, NodeId>,
    seat: NodeId,
    node: NodeId,
) -> Result<(), MemberChangeError> {
    match seats.get(&seat) {
        Some(&sitting) if sitting != node => Err(MemberChangeError::Invalid(format!(
            "node {sitting} sits in seat {seat}, where node {seat} was: choose an id that is no member's seat"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(nodes: &[NodeId]) -> BTreeSet<NodeId> {
        nodes.iter().copied().collect()
    }

    #[test]
    fn members_join_as_voters_until_five_vote_then_as_learners() {
        assert_eq!(
            membership_voters(&set(&[1, 2, 3]), &set(&[1, 2, 3, 4])),
            set(&[1, 2, 3, 4])
        );
        assert_eq!(
            membership_voters(&set(&[1, 2, 3, 4, 5]), &set(&[1, 2, 3, 4, 5, 6])),
            set(&[1, 2, 3, 4, 5])
        );
    }

    #[test]
    fn a_removed_voter_is_replaced_by_the_lowest_learner() {
        assert_eq!(
            membership_voters(&set(&[1, 2, 3, 4, 5]), &set(&[1, 3, 4, 5, 6, 7])),
            set(&[1, 3, 4, 5, 6])
        );
    }

    #[test]
    fn a_voter_that_stays_keeps_its_vote_over_a_lower_learner() {
        assert_eq!(
            membership_voters(&set(&[2, 3, 4, 5, 6]), &set(&[1, 2, 3, 4, 5, 6])),
            set(&[2, 3, 4, 5, 6])
        );
    }
}
