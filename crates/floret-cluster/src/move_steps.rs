//! Carrying out a change of members, as pure decisions: whether a change may
//! start at all ([`check_change`]), and the next step of one shard's move
//! towards its new replica set, read off what the shard's leader sees
//! ([`next_move_step`]).
//!
//! A move adds each new replica as a learner, waits until it has caught up,
//! hands leadership away if the leader itself leaves, changes the voters to
//! the new set in one joint change (keeping the leaving replicas as
//! learners, so the new configuration reaches them), and then drops every
//! learner the new set does not name (those, and any left by an abandoned
//! move). Each step follows from
//! what the leader observes, not from what was done before, so a leader
//! that takes over a half-done move goes on where the last one stopped, and
//! a step carried out twice asks for nothing more.
//!
//! IMPLEMENTATION CAVEATS
//! - The node's move driver carries the steps out (floret-server,
//!   `leadership/moves.rs`); this module only decides.
//! - How many shards move at once, and how long a learner may take to catch
//!   up before the move is reported stalled, are the caller's.

use std::collections::{BTreeMap, BTreeSet};

use floret_store::{NodeId, ShardId};

use crate::ReplicaPlacement;

/// What a shard's leader sees of its group, from its raft metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardRaftView {
    /// The leader reporting it.
    pub leader: NodeId,
    /// The voters of the group's current configuration.
    pub voters: BTreeSet<NodeId>,
    /// Its learners: replicas that receive the log but do not vote.
    pub learners: BTreeSet<NodeId>,
    /// Whether a membership change is still under way: the configuration
    /// is joint, or its entry is not committed yet. openraft takes one
    /// change at a time.
    pub changing: bool,
    /// The index of the leader's last log entry.
    pub last_log_index: u64,
    /// The highest index each other replica is known to hold, as the
    /// leader's replication reports it (absent: nothing known yet).
    pub matched: BTreeMap<NodeId, u64>,
}

impl ShardRaftView {
    /// What a leader's raft metrics say of its group; None when the metrics
    /// are not a leader's.
    pub fn of_leader(metrics: &openraft::RaftMetrics<NodeId, openraft::BasicNode>) -> Option<Self> {
        let leader = metrics.id;
        if metrics.current_leader != Some(leader) {
            return None;
        }
        let stored = &metrics.membership_config;
        let membership = stored.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let learners: BTreeSet<NodeId> = membership.learner_ids().collect();
        let configuration_index = stored.log_id().map(|log_id| log_id.index);
        let applied_index = metrics.last_applied.map(|log_id| log_id.index);
        let matched = metrics
            .replication
            .iter()
            .flatten()
            .filter_map(|(&node, matched)| Some((node, matched.as_ref()?.index)))
            .collect();
        Some(Self {
            leader,
            voters,
            learners,
            changing: membership.get_joint_config().len() > 1
                || configuration_index > applied_index,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            matched,
        })
    }

    /// How many entries `node` is behind the leader's log.
    fn behind(&self, node: NodeId) -> u64 {
        if node == self.leader {
            return 0;
        }
        let matched = self.matched.get(&node).copied().unwrap_or(0);
        self.last_log_index.saturating_sub(matched)
    }
}

/// What a shard's leader does next to bring its group to the new replica set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoveStep {
    /// The voters are the new set and no learner is left: the move is over.
    Done,
    /// A membership change is under way: wait until it commits.
    WaitForChange,
    /// Add this node as a learner, so the log (or a snapshot) reaches it.
    AddLearner(NodeId),
    /// A new replica is still this many entries behind: wait.
    WaitForCatchUp {
        /// The learner furthest behind.
        node: NodeId,
        /// By how many entries.
        behind: u64,
    },
    /// The leader leaves the group: hand leadership to this voter that
    /// stays, the most caught up of them, before changing the voters.
    HandLeadershipTo(NodeId),
    /// Change the voters to this set (the voters it does not name leave
    /// the group).
    ChangeVoters(BTreeSet<NodeId>),
    /// The voters are the new set: drop these learners it does not name.
    RemoveLearners(BTreeSet<NodeId>),
}

/// The next step of a move towards the voters `target`, as the shard's
/// leader sees it in `view`. A learner counts as caught up once it is at most
/// `caught_up_within` entries behind.
pub fn next_move_step(
    target: &BTreeSet<NodeId>,
    view: &ShardRaftView,
    caught_up_within: u64,
) -> MoveStep {
    if view.changing {
        return MoveStep::WaitForChange;
    }
    if &view.voters == target {
        return if view.learners.is_empty() {
            MoveStep::Done
        } else {
            MoveStep::RemoveLearners(view.learners.clone())
        };
    }
    let joining: Vec<NodeId> = target.difference(&view.voters).copied().collect();
    if let Some(&node) = joining.iter().find(|node| !view.learners.contains(node)) {
        return MoveStep::AddLearner(node);
    }
    let furthest_behind = joining
        .iter()
        .map(|&node| (view.behind(node), node))
        .max()
        .filter(|&(behind, _)| behind > caught_up_within);
    if let Some((behind, node)) = furthest_behind {
        return MoveStep::WaitForCatchUp { node, behind };
    }
    if !target.contains(&view.leader) {
        let successor = view
            .voters
            .intersection(target)
            .map(|&node| (view.behind(node), node))
            .min()
            .map(|(_, node)| node);
        if let Some(successor) = successor {
            return MoveStep::HandLeadershipTo(successor);
        }
    }
    MoveStep::ChangeVoters(target.clone())
}

/// Why a change of members is refused before anything moves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChangeRefused {
    /// The change would leave no member.
    #[error("a cluster needs at least one member")]
    NoMembersLeft,
    /// Removing members would leave fewer than the replication factor.
    #[error(
        "{members} members would be left, fewer than the replication factor {replication_factor}: replace the node instead, or add one first"
    )]
    BelowReplicationFactor {
        /// Members after the change.
        members: usize,
        /// The cluster's replication factor.
        replication_factor: usize,
    },
    /// A shard that moves has too few live replicas, before or after the
    /// change, to commit it.
    #[error(
        "shard {shard} would move with {live} live of {replicas} replicas {when} the change: a majority is needed to commit it"
    )]
    ShardWithoutMajority {
        /// The shard.
        shard: ShardId,
        /// Its live replicas.
        live: usize,
        /// Its replicas.
        replicas: usize,
        /// "before" or "after".
        when: &'static str,
    },
}

/// Whether the members may go from `members_before` (placed as `before`)
/// to `members_after` (placed as `after`), with `live` the nodes that
/// answer now. Refused: a change that leaves fewer members than the
/// replication factor where there were more (a shrink below it), and one
/// in which a shard that moves lacks a live majority of its replicas before
/// or after: the joint change needs both.
pub fn check_change(
    before: &ReplicaPlacement,
    after: &ReplicaPlacement,
    members_before: &[NodeId],
    members_after: &[NodeId],
    replication_factor: usize,
    live: &BTreeSet<NodeId>,
) -> Result<(), ChangeRefused> {
    if members_after.is_empty() {
        return Err(ChangeRefused::NoMembersLeft);
    }
    if members_after.len() < members_before.len() && members_after.len() < replication_factor {
        return Err(ChangeRefused::BelowReplicationFactor {
            members: members_after.len(),
            replication_factor,
        });
    }
    for shard_move in crate::shard_moves(before, after) {
        let shard = shard_move.shard;
        for (replicas, when) in [
            (before.replicas(shard), "before"),
            (after.replicas(shard), "after"),
        ] {
            let live_count = replicas.iter().filter(|node| live.contains(node)).count();
            if live_count <= replicas.len() / 2 {
                return Err(ChangeRefused::ShardWithoutMajority {
                    shard,
                    live: live_count,
                    replicas: replicas.len(),
                    when,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(nodes: &[NodeId]) -> BTreeSet<NodeId> {
        nodes.iter().copied().collect()
    }

    fn view(leader: NodeId, voters: &[NodeId], learners: &[NodeId]) -> ShardRaftView {
        ShardRaftView {
            leader,
            voters: set(voters),
            learners: set(learners),
            changing: false,
            last_log_index: 1_000,
            matched: voters
                .iter()
                .chain(learners)
                .map(|&node| (node, 1_000))
                .collect(),
        }
    }

    /// A move of shard replicas {1,2,3} to {1,3,4}, step by step, as the
    /// leader sees the group after carrying out each step.
    #[test]
    fn a_move_adds_the_learner_waits_for_it_then_swaps_the_voters_in_one_change() {
        let target = set(&[1, 3, 4]);
        let mut seen = view(1, &[1, 2, 3], &[]);
        assert_eq!(next_move_step(&target, &seen, 64), MoveStep::AddLearner(4));

        seen.changing = true;
        seen.learners.insert(4);
        assert_eq!(next_move_step(&target, &seen, 64), MoveStep::WaitForChange);

        seen.changing = false;
        seen.matched.insert(4, 200);
        assert_eq!(
            next_move_step(&target, &seen, 64),
            MoveStep::WaitForCatchUp {
                node: 4,
                behind: 800
            }
        );

        seen.matched.insert(4, 950);
        assert_eq!(
            next_move_step(&target, &seen, 64),
            MoveStep::ChangeVoters(target.clone())
        );

        seen.voters = target.clone();
        seen.learners.clear();
        assert_eq!(next_move_step(&target, &seen, 64), MoveStep::Done);
    }

    #[test]
    fn a_learner_nobody_has_heard_from_is_not_taken_for_caught_up() {
        let mut seen = view(1, &[1, 2, 3], &[4]);
        seen.matched.remove(&4);
        assert_eq!(
            next_move_step(&set(&[1, 2, 4]), &seen, 64),
            MoveStep::WaitForCatchUp {
                node: 4,
                behind: 1_000
            }
        );
    }

    #[test]
    fn a_leader_that_leaves_hands_over_to_the_most_caught_up_voter_that_stays() {
        let mut seen = view(2, &[1, 2, 3], &[4]);
        seen.matched.insert(1, 990);
        seen.matched.insert(3, 999);
        assert_eq!(
            next_move_step(&set(&[1, 3, 4]), &seen, 64),
            MoveStep::HandLeadershipTo(3)
        );
    }

    #[test]
    fn a_new_leader_resumes_a_half_done_move_without_adding_the_learner_again() {
        let seen = view(3, &[1, 2, 3], &[4]);
        assert_eq!(
            next_move_step(&set(&[1, 3, 4]), &seen, 64),
            MoveStep::ChangeVoters(set(&[1, 3, 4]))
        );
    }

    #[test]
    fn a_learner_left_over_from_an_abandoned_move_is_dropped() {
        let seen = view(1, &[1, 2, 3], &[5]);
        assert_eq!(
            next_move_step(&set(&[1, 2, 3]), &seen, 64),
            MoveStep::RemoveLearners(set(&[5]))
        );
    }

    #[test]
    fn two_new_replicas_join_one_learner_at_a_time() {
        let target = set(&[1, 4, 5]);
        let mut seen = view(1, &[1, 2, 3], &[]);
        assert_eq!(next_move_step(&target, &seen, 64), MoveStep::AddLearner(4));
        seen.learners.insert(4);
        seen.matched.insert(4, 1_000);
        assert_eq!(next_move_step(&target, &seen, 64), MoveStep::AddLearner(5));
    }

    fn placements(before: &[NodeId], after: &[NodeId]) -> (ReplicaPlacement, ReplicaPlacement) {
        (
            ReplicaPlacement::new(12, before, 3),
            ReplicaPlacement::new(12, after, 3),
        )
    }

    #[test]
    fn removing_a_dead_node_from_three_is_refused_below_the_replication_factor() {
        let (before, after) = placements(&[1, 2, 3], &[1, 3]);
        assert_eq!(
            check_change(&before, &after, &[1, 2, 3], &[1, 3], 3, &set(&[1, 3])),
            Err(ChangeRefused::BelowReplicationFactor {
                members: 2,
                replication_factor: 3
            })
        );
    }

    #[test]
    fn removing_a_dead_node_from_four_is_allowed_while_the_others_live() {
        let (before, after) = placements(&[1, 2, 3, 4], &[1, 3, 4]);
        assert_eq!(
            check_change(
                &before,
                &after,
                &[1, 2, 3, 4],
                &[1, 3, 4],
                3,
                &set(&[1, 3, 4])
            ),
            Ok(())
        );
    }

    #[test]
    fn a_change_that_moves_shards_whose_replicas_are_mostly_dead_is_refused() {
        let (before, after) = placements(&[1, 2, 3, 4], &[1, 2, 3, 4, 5]);
        let refused = check_change(
            &before,
            &after,
            &[1, 2, 3, 4],
            &[1, 2, 3, 4, 5],
            3,
            &set(&[1, 5]),
        );
        assert!(
            matches!(
                refused,
                Err(ChangeRefused::ShardWithoutMajority { when: "before", .. })
            ),
            "{refused:?}"
        );
    }

    #[test]
    fn a_replacement_of_a_dead_node_in_three_is_allowed() {
        let (before, after) = placements(&[1, 2, 3], &[1, 3, 4]);
        assert_eq!(
            check_change(&before, &after, &[1, 2, 3], &[1, 3, 4], 3, &set(&[1, 3, 4])),
            Ok(())
        );
    }
}
