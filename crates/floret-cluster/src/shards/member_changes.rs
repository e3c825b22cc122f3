//! Changing the members: adding a node and removing one, on the membership
//! group's leader. Each change is checked first ([`check_change`]: no
//! shrink below the replication factor, a live majority for every shard
//! that moves), then committed as the group's own configuration. The
//! placement, the peers and the shard moves follow from that on every
//! node (`members.rs`, and the server's move driver).
//!
//! A removed member is first marked leaving (and loses its vote here); it
//! leaves the group once no shard holds a replica on it
//! ([`Shards::forget_leaving_member`], which the server calls when every
//! shard's leader says so).
//!
//! The group's voters are the first [`MAX_MEMBERSHIP_VOTERS`] members to
//! join that are still members; the rest follow it as learners
//! ([`membership_voters`]).
//!
//! IMPLEMENTATION CAVEATS
//! - A node replacing another takes a seat of its own: replacing in place
//!   (`placement.rs` seats) is not offered yet.
//! - Changes do not wait for the shards to finish moving; `floret status`
//!   shows where each shard's replicas are.

use std::collections::{BTreeMap, BTreeSet};

use floret_store::NodeId;
use openraft::ChangeMembers;

use super::members::member_record;
use super::{MEMBERSHIP_GROUP, MembersView, Shards};
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
    /// member at that address, or leaving, or no member) changes nothing
    /// but the voters, if a change cut off before left them behind.
    pub async fn change_members(
        &self,
        change: MemberChange,
    ) -> Result<MembersView, MemberChangeError> {
        let me = self.node_id();
        let raft = &self.groups[&MEMBERSHIP_GROUP].raft;
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
        let placed_before: BTreeSet<NodeId> = before.placed().into_iter().collect();
        let raft_error = |error: String| MemberChangeError::Raft(error);
        let set_record = |node: NodeId, peer_address: &str, leaving: bool| {
            let records = BTreeMap::from([(node, member_record(peer_address, leaving))]);
            raft.change_membership(ChangeMembers::SetNodes(records), true)
        };
        let placed_after = match change {
            MemberChange::Add { node, peer_address } => {
                if node == 0 {
                    return Err(MemberChangeError::Invalid("node ids are > 0".into()));
                }
                if peer_address.trim().is_empty() || peer_address.contains(' ') {
                    return Err(MemberChangeError::Invalid(format!(
                        "a new member needs the peer address the others dial, host:port, not {peer_address:?}"
                    )));
                }
                let mut placed_after = placed_before.clone();
                placed_after.insert(node);
                match before.members.iter().find(|member| member.id == node) {
                    Some(member) if member.peer_address == peer_address && !member.leaving => {}
                    Some(member) => {
                        if member.leaving {
                            self.check_member_change(&placed_before, &placed_after)?;
                        }
                        tracing::info!(node, %peer_address, was_leaving = member.leaving, "a member's record changes");
                        set_record(node, &peer_address, false)
                            .await
                            .map_err(|e| raft_error(e.to_string()))?;
                    }
                    None => {
                        self.check_member_change(&placed_before, &placed_after)?;
                        tracing::info!(node, %peer_address, "adding a member");
                        raft.add_learner(node, member_record(&peer_address, false), false)
                            .await
                            .map_err(|e| raft_error(e.to_string()))?;
                    }
                }
                placed_after
            }
            MemberChange::Remove { node } => {
                let Some(member) = before.members.iter().find(|member| member.id == node) else {
                    return Ok(before);
                };
                let mut placed_after = placed_before.clone();
                placed_after.remove(&node);
                if !member.leaving {
                    self.check_member_change(&placed_before, &placed_after)?;
                    tracing::info!(
                        node,
                        "removing a member: it leaves once no shard holds a replica on it"
                    );
                    set_record(node, &member.peer_address, true)
                        .await
                        .map_err(|e| raft_error(e.to_string()))?;
                }
                placed_after
            }
        };
        let voters = membership_voters(&voters_now, &placed_after);
        if voters != voters_now {
            // A voter that leaves stays a learner: the configurations that
            // follow still reach it.
            raft.change_membership(voters, true)
                .await
                .map_err(|e| raft_error(e.to_string()))?;
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
        self.groups[&MEMBERSHIP_GROUP]
            .raft
            .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([node])), false)
            .await
            .map(drop)
            .map_err(|e| MemberChangeError::Raft(e.to_string()))
    }

    /// Refuses a change from `members_before` to `members_after` that
    /// [`check_change`] finds unsafe, judging liveness by the gossip view
    /// (a member it has not declared dead counts as live).
    fn check_member_change(
        &self,
        members_before: &BTreeSet<NodeId>,
        members_after: &BTreeSet<NodeId>,
    ) -> Result<(), ChangeRefused> {
        let before: Vec<NodeId> = members_before.iter().copied().collect();
        let after: Vec<NodeId> = members_after.iter().copied().collect();
        let shard_count = self.placement.shard_count();
        let live: BTreeSet<NodeId> = before
            .iter()
            .chain(&after)
            .copied()
            .filter(|&node| node == self.node_id() || self.liveness(node) != Some(Liveness::Dead))
            .collect();
        check_change(
            &ReplicaPlacement::new(shard_count, &before, self.replication_factor),
            &ReplicaPlacement::new(shard_count, &after, self.replication_factor),
            &before,
            &after,
            self.replication_factor,
            &live,
        )
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
