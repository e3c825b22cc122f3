//! A sink's cap on batches in flight (`max_in_flight`), one number for the
//! whole cluster, split between the nodes that pump into it by backlogged
//! weight. Pure: the weights are passed in.
//!
//! Every node apportions the cap over all members from the demands it
//! polled for the rate (`Peer.SinkWeight`), the same way, and keeps its own
//! part:
//! - a node that did not answer keeps one batch reserved, since it may be
//!   pumping;
//! - every node with a backlog gets one batch;
//! - what is left goes by weight, whole batches to each node's quota first,
//!   then one each to the largest remainders (ties to the lower node id);
//!   once some node's part held a batch back, only such nodes weigh, so a
//!   node whose one batch is enough does not keep batches it cannot use.
//!
//! A node always allows itself one batch, so a backlog that appeared since
//! the last poll is not stalled: until the next polls that is at most one
//! batch over the cap per such node. A cap under the number of nodes with a
//! backlog acts as one batch per such node.

use super::weights::PumpDemand;

/// A member's id and the demand it answered (None: silent).
pub type NodeDemand = (u64, Option<PumpDemand>);

/// How many batches node `me`, whose own demand is `own`, may have at the
/// sink at once under a cluster-wide cap of `cap` batches; `others` are
/// the other members' answers.
pub fn node_batches(cap: u32, me: u64, own: &PumpDemand, others: &[NodeDemand]) -> usize {
    let mut demands: Vec<NodeDemand> = others.to_vec();
    demands.push((me, Some(*own)));
    demands.sort_by_key(|(id, _)| *id);
    let some_held_back = demands
        .iter()
        .any(|(_, demand)| demand.is_some_and(|d| d.batches_held_back));
    let nodes: Vec<(u64, Option<u64>)> = demands
        .iter()
        .map(|(id, demand)| {
            let weight = demand.map(|d| {
                let weighs = d.batches_held_back || !some_held_back;
                if weighs { d.weight } else { 0 }
            });
            (*id, weight)
        })
        .collect();
    let mut batches: Vec<usize> = demands
        .iter()
        .map(|(_, demand)| usize::from(demand.is_none_or(|d| d.weight > 0)))
        .collect();
    let left = (cap as usize).saturating_sub(batches.iter().sum());
    let total: u64 = nodes.iter().filter_map(|(_, weight)| *weight).sum();
    if left > 0 && total > 0 {
        let quotas: Vec<f64> = nodes
            .iter()
            .map(|(_, weight)| left as f64 * weight.unwrap_or(0) as f64 / total as f64)
            .collect();
        for (given, quota) in batches.iter_mut().zip(&quotas) {
            *given += quota.floor() as usize;
        }
        let whole: usize = quotas.iter().map(|quota| quota.floor() as usize).sum();
        let mut by_remainder: Vec<usize> = (0..nodes.len()).collect();
        by_remainder.sort_by(|&a, &b| {
            let remainder = |i: usize| quotas[i] - quotas[i].floor();
            remainder(b).total_cmp(&remainder(a)).then(a.cmp(&b))
        });
        for &index in by_remainder.iter().take(left.saturating_sub(whole)) {
            batches[index] += 1;
        }
    }
    let mine = nodes
        .iter()
        .position(|(id, _)| *id == me)
        .expect("this node was pushed above");
    batches[mine].max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weighing(weight: u64) -> PumpDemand {
        PumpDemand {
            weight,
            ..PumpDemand::default()
        }
    }

    /// Every node's part, as each computes it from the same demands.
    fn parts_of(cap: u32, demands: &[PumpDemand]) -> Vec<usize> {
        (0..demands.len())
            .map(|me| {
                let others: Vec<NodeDemand> = (0..demands.len())
                    .filter(|&n| n != me)
                    .map(|n| (n as u64 + 1, Some(demands[n])))
                    .collect();
                node_batches(cap, me as u64 + 1, &demands[me], &others)
            })
            .collect()
    }

    fn parts(cap: u32, weights: &[u64]) -> Vec<usize> {
        let demands: Vec<PumpDemand> = weights.iter().map(|&w| weighing(w)).collect();
        parts_of(cap, &demands)
    }

    #[test]
    fn parts_follow_backlogged_weight_and_add_up_to_the_cap() {
        assert_eq!(parts(8, &[1, 1, 2]), vec![2, 2, 4]);
        assert_eq!(parts(10, &[90, 5, 5]), vec![7, 2, 1]);
        assert_eq!(parts(7, &[1, 1, 1]), vec![3, 2, 2]);
    }

    #[test]
    fn a_node_without_backlog_leaves_its_batches_to_the_others() {
        assert_eq!(parts(6, &[1, 0, 1]), vec![3, 1, 3]);
        // Its own single batch is for a backlog that appears before the
        // others hear of it; while it has none, it sends nothing.
        let sum_backlogged: usize = parts(6, &[1, 0, 1]).iter().step_by(2).sum();
        assert_eq!(sum_backlogged, 6);
    }

    #[test]
    fn a_silent_node_keeps_one_batch_reserved() {
        let others = [(2, None), (3, Some(weighing(5)))];
        assert_eq!(node_batches(6, 1, &weighing(5), &others), 3);
    }

    #[test]
    fn once_a_node_is_held_back_only_held_back_nodes_weigh() {
        let flood = PumpDemand {
            weight: 1,
            batches_held_back: true,
            ..PumpDemand::default()
        };
        assert_eq!(
            parts_of(12, &[flood, weighing(5), weighing(5)]),
            vec![10, 1, 1]
        );
    }

    #[test]
    fn a_cap_under_the_backlogged_nodes_still_lets_each_send_one() {
        assert_eq!(parts(2, &[3, 3, 3]), vec![1, 1, 1]);
    }

    #[test]
    fn no_backlog_anywhere_keeps_one_batch_ready() {
        assert_eq!(parts(9, &[0, 0, 0]), vec![1, 1, 1]);
    }
}
