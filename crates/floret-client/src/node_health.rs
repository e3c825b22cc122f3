//! Which of the client's nodes a call with no known leader goes to: the
//! nodes in turn, passing over any whose last call failed in the last
//! [`FAILED_NODE_REST`]. A node that was removed from the cluster, died or
//! is restarting is then tried about once per rest, not on every other
//! call, while the nodes that answer take the load (and forward each call
//! to its leader). Pure: the caller passes the time.
//!
//! IMPLEMENTATION CAVEATS
//! - A node that accepts calls but answers them slowly is not passed over.

use std::time::{Duration, Instant};

/// How long a node whose call failed is passed over.
pub const FAILED_NODE_REST: Duration = Duration::from_secs(2);

/// The turn over the client's nodes and when each last failed.
#[derive(Debug)]
pub(crate) struct NodeHealth {
    failed_at: Vec<Option<Instant>>,
    next: usize,
}

impl NodeHealth {
    /// `nodes` nodes, none failed, the turn at `first`.
    pub(crate) fn new(nodes: usize, first: usize) -> Self {
        Self {
            failed_at: vec![None; nodes],
            next: first % nodes.max(1),
        }
    }

    /// The node whose turn it is at `now`, passing over those resting; the
    /// next in turn when every node rests.
    pub(crate) fn pick(&mut self, now: Instant) -> usize {
        let nodes = self.failed_at.len();
        let rested = |failed: &Option<Instant>| {
            failed.is_none_or(|at| now.saturating_duration_since(at) >= FAILED_NODE_REST)
        };
        let chosen = (0..nodes)
            .map(|offset| (self.next + offset) % nodes)
            .find(|&node| rested(&self.failed_at[node]))
            .unwrap_or(self.next);
        self.next = (chosen + 1) % nodes;
        chosen
    }

    /// A call to `node` failed at `now`.
    pub(crate) fn failed(&mut self, node: usize, now: Instant) {
        if let Some(failed) = self.failed_at.get_mut(node) {
            *failed = Some(now);
        }
    }

    /// A call to `node` was answered.
    pub(crate) fn answered(&mut self, node: usize) {
        if let Some(failed) = self.failed_at.get_mut(node) {
            *failed = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_without_a_leader_go_to_every_node_in_turn() {
        let now = Instant::now();
        let mut health = NodeHealth::new(3, 1);
        let picked: Vec<usize> = (0..6).map(|_| health.pick(now)).collect();
        assert_eq!(picked, [1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn calls_keep_going_to_a_removed_node_that_refuses_them() {
        let start = Instant::now();
        let mut health = NodeHealth::new(3, 0);
        health.failed(1, start);
        health.failed(2, start);
        let during_the_rest: Vec<usize> = (0..4)
            .map(|ms| health.pick(start + Duration::from_millis(ms * 100)))
            .collect();
        assert_eq!(during_the_rest, [0, 0, 0, 0], "a resting node was tried");

        let rested = start + FAILED_NODE_REST;
        let after: Vec<usize> = (0..3).map(|_| health.pick(rested)).collect();
        assert_eq!(after, [1, 2, 0], "a node stays passed over after its rest");
    }

    #[test]
    fn a_node_that_answers_again_is_no_longer_passed_over() {
        let start = Instant::now();
        let mut health = NodeHealth::new(2, 0);
        health.failed(1, start);
        assert_eq!(health.pick(start), 0);
        assert_eq!(health.pick(start), 0);
        health.answered(1);
        assert_eq!(health.pick(start), 1);
    }

    #[test]
    fn calls_stop_when_every_node_failed() {
        let start = Instant::now();
        let mut health = NodeHealth::new(2, 0);
        health.failed(0, start);
        health.failed(1, start);
        let picked: Vec<usize> = (0..4).map(|_| health.pick(start)).collect();
        assert_eq!(
            picked,
            [0, 1, 0, 1],
            "with every node resting, all are tried in turn"
        );
    }
}
