//! The shard moves a change of members asks for: which replicas each shard
//! gains and loses between the placement over the old members and the one
//! over the new, and how much of the cluster that moves. Pure: both
//! placements are given.
//!
//! IMPLEMENTATION CAVEATS
//! - Each shard's leader carries its own move out (`move_steps.rs`, and the
//!   server's move driver); this module only measures what a change asks.
//! - A change of preferred leader alone is not a move: leadership follows
//!   the placement through the hand-back, as after any restart.
//! - A replacement moves exactly the replaced node's replicas when the new
//!   node takes its seat ([`ReplicaPlacement::seated`], `floret cluster
//!   replace-node`); as a leave and a join it moves more.

use floret_store::{NodeId, ShardId};

use crate::ReplicaPlacement;

/// What one shard's replica set gains and loses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMove {
    /// The shard.
    pub shard: ShardId,
    /// Nodes that become replicas: each joins as a learner, catches up and
    /// is promoted.
    pub adding: Vec<NodeId>,
    /// Replicas that leave once the new ones are voters.
    pub removing: Vec<NodeId>,
}

/// The moves from `before` to `after` (placements of the same shards), in
/// shard order; shards whose replica set is unchanged are left out.
pub fn shard_moves(before: &ReplicaPlacement, after: &ReplicaPlacement) -> Vec<ShardMove> {
    assert_eq!(
        before.shard_count(),
        after.shard_count(),
        "a change of members keeps the shards"
    );
    (0..before.shard_count())
        .filter_map(|shard| {
            let (old, new) = (before.replicas(shard), after.replicas(shard));
            let adding: Vec<NodeId> = new.iter().copied().filter(|n| !old.contains(n)).collect();
            let removing: Vec<NodeId> = old.iter().copied().filter(|n| !new.contains(n)).collect();
            (!adding.is_empty() || !removing.is_empty()).then_some(ShardMove {
                shard,
                adding,
                removing,
            })
        })
        .collect()
}

/// How much of a cluster a change of members moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoveFigures {
    /// Shards whose replica set changes, of all shards.
    pub shards_moved: f64,
    /// Replicas copied to a new node, of all replicas after the change: the
    /// share of the data copied, with shards of equal size.
    pub replicas_copied: f64,
    /// The least share of replicas any change between those members must
    /// copy: the joining nodes' share of the members after, or the leaving
    /// nodes' share of the members before, whichever is larger (a replace
    /// is both: one node's share).
    pub ideal_replicas_copied: f64,
}

/// The figures of going from `before` over `members_before` to `after` over
/// `members_after`.
pub fn move_figures(
    before: &ReplicaPlacement,
    after: &ReplicaPlacement,
    members_before: &[NodeId],
    members_after: &[NodeId],
) -> MoveFigures {
    let moves = shard_moves(before, after);
    let shards = before.shard_count().max(1) as f64;
    let replicas_after: usize = (0..after.shard_count())
        .map(|shard| after.replicas(shard).len())
        .sum();
    let copied: usize = moves.iter().map(|m| m.adding.len()).sum();
    MoveFigures {
        shards_moved: moves.len() as f64 / shards,
        replicas_copied: copied as f64 / replicas_after.max(1) as f64,
        ideal_replicas_copied: least_share_copied(members_before, members_after),
    }
}

/// The least share of replicas any placement must copy when the members
/// go from `members_before` to `members_after`: the joining nodes' share
/// of the members after, or the leaving nodes' share of those before,
/// whichever is larger (a replace is both: one node's share).
pub fn least_share_copied(members_before: &[NodeId], members_after: &[NodeId]) -> f64 {
    let joining = members_after
        .iter()
        .filter(|node| !members_before.contains(node))
        .count();
    let leaving = members_before
        .iter()
        .filter(|node| !members_after.contains(node))
        .count();
    f64::max(
        joining as f64 / members_after.len().max(1) as f64,
        leaving as f64 / members_before.len().max(1) as f64,
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_joining_node_takes_one_replica_of_a_shard_at_most_and_nothing_else_moves() {
        for shards in [6, 12, 32, 64] {
            let three = ReplicaPlacement::new(shards, &[1, 2, 3], 3);
            let four = ReplicaPlacement::new(shards, &[1, 2, 3, 4], 3);
            for shard_move in shard_moves(&three, &four) {
                assert_eq!(shard_move.adding, [4], "{shards} shards: {shard_move:?}");
                assert_eq!(shard_move.removing.len(), 1, "{shard_move:?}");
            }
        }
    }

    #[test]
    fn a_leaving_node_moves_only_the_shards_it_held() {
        let five = ReplicaPlacement::new(32, &[1, 2, 3, 4, 5], 3);
        let four = ReplicaPlacement::new(32, &[1, 2, 3, 4], 3);
        let moves = shard_moves(&five, &four);
        assert!(!moves.is_empty());
        for shard_move in &moves {
            assert_eq!(shard_move.removing, [5], "{shard_move:?}");
            assert_eq!(shard_move.adding.len(), 1, "{shard_move:?}");
            assert!(five.holds(5, shard_move.shard));
        }
        let held_by_five = (0..32).filter(|&shard| five.holds(5, shard)).count();
        assert_eq!(moves.len(), held_by_five);
    }

    /// Going 3 -> 4 -> 5 -> 4 nodes, the share of replicas copied at each
    /// step against the least possible (docs/design.md, "Membership").
    #[test]
    fn growing_and_shrinking_copies_close_to_the_ideal_share_with_enough_shards() {
        let steps: [&[NodeId]; 4] = [&[1, 2, 3], &[1, 2, 3, 4], &[1, 2, 3, 4, 5], &[1, 2, 3, 4]];
        for shards in [6, 12, 24, 48, 96] {
            let placements: Vec<ReplicaPlacement> = steps
                .iter()
                .map(|members| ReplicaPlacement::new(shards, members, 3))
                .collect();
            let mut row = format!("{shards:>3} shards:");
            for (step, pair) in placements.windows(2).enumerate() {
                let figures = move_figures(&pair[0], &pair[1], steps[step], steps[step + 1]);
                row += &format!(
                    "  {}->{}: shards {:.2}, copied {:.2} (ideal {:.2})",
                    steps[step].len(),
                    steps[step + 1].len(),
                    figures.shards_moved,
                    figures.replicas_copied,
                    figures.ideal_replicas_copied
                );
                if shards >= 48 {
                    assert!(
                        figures.replicas_copied <= 1.5 * figures.ideal_replicas_copied,
                        "{row}"
                    );
                }
            }
            eprintln!("{row}");
        }
    }

    #[test]
    fn a_node_that_takes_a_dead_nodes_seat_gets_exactly_its_replicas_and_nothing_else_moves() {
        let five: BTreeMap<NodeId, NodeId> = (1..=5).map(|node| (node, node)).collect();
        let mut replaced = five.clone();
        replaced.insert(2, 6);
        for shards in [6, 48] {
            let before = ReplicaPlacement::seated(shards, &five, 3);
            let after = ReplicaPlacement::seated(shards, &replaced, 3);
            let moves = shard_moves(&before, &after);
            let held_by_two = (0..shards).filter(|&shard| before.holds(2, shard)).count();
            assert_eq!(moves.len(), held_by_two);
            for shard_move in &moves {
                assert_eq!(shard_move.adding, [6], "{shard_move:?}");
                assert_eq!(shard_move.removing, [2], "{shard_move:?}");
                let renamed: Vec<NodeId> = before
                    .replicas(shard_move.shard)
                    .iter()
                    .map(|&node| if node == 2 { 6 } else { node })
                    .collect();
                assert_eq!(after.replicas(shard_move.shard), renamed);
            }
            let figures = move_figures(&before, &after, &[1, 2, 3, 4, 5], &[1, 3, 4, 5, 6]);
            assert!(
                (figures.replicas_copied - held_by_two as f64 / (3 * shards) as f64).abs() < 1e-9,
                "{figures:?}"
            );
            assert!((figures.ideal_replicas_copied - 0.2).abs() < 1e-9);
        }
    }

    #[test]
    fn a_node_that_joins_in_a_seat_of_its_own_in_place_of_a_dead_one_moves_more_than_its_share() {
        let before = ReplicaPlacement::new(48, &[1, 2, 3, 4, 5], 3);
        let after = ReplicaPlacement::new(48, &[1, 3, 4, 5, 6], 3);
        let figures = move_figures(&before, &after, &[1, 2, 3, 4, 5], &[1, 3, 4, 5, 6]);
        assert!(
            figures.replicas_copied > figures.ideal_replicas_copied,
            "{figures:?}"
        );
        eprintln!(
            "replace 2 by 6 over 5 nodes, 48 shards, 6 in a seat of its own: copied {:.2} (ideal {:.2})",
            figures.replicas_copied, figures.ideal_replicas_copied
        );
    }
}
