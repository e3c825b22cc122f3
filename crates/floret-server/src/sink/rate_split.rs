//! A sink's rate cap, one number for the whole cluster, split between the
//! nodes that pump into it, and the token bucket each pump spends its part
//! from. Pure: weights and times are passed in.
//!
//! Each node learns every other node's backlogged weight for the queue by
//! asking it (`Peer.SinkWeight`) every [`super::WEIGHT_POLL`]:
//! - a node that did not answer keeps an even part (`cap / nodes`) reserved
//!   for it, since it may be pumping;
//! - the rest is split among this node and the nodes that answered: each
//!   gets a floor of [`FLOOR_FRACTION`] of an even part (so a node whose
//!   backlog just appeared is not stalled until the others hear of it), and
//!   the remainder goes by weight (evenly while no one has any).
//!
//! Nodes compute their parts from views taken at slightly different times,
//! so a pump uses the smallest of its last three parts: a part only grows
//! once the others have had two polls to shrink theirs.
//!
//! The bucket holds at most [`BURST`] of the rate, so no second at the sink
//! gets more than the cap plus that burst; a pump's batches are cut to what
//! the bucket holds.

use std::time::{Duration, Instant};

/// Share of an even part every answering node gets whatever its weight.
pub const FLOOR_FRACTION: f64 = 0.05;
/// How much of its rate a pump may send at once.
pub const BURST: Duration = Duration::from_millis(20);

/// This node's part of `cap` (messages/s), from its own backlogged weight
/// and each other node's (None: it did not answer).
pub fn node_rate(cap: f64, own: u64, others: &[Option<u64>]) -> f64 {
    let nodes = (others.len() + 1) as f64;
    let silent = others.iter().filter(|w| w.is_none()).count() as f64;
    let sharing = nodes - silent;
    let budget = cap * sharing / nodes;
    let floor = budget / sharing * FLOOR_FRACTION;
    let weighed = budget - floor * sharing;
    let total: u64 = own + others.iter().flatten().sum::<u64>();
    if total == 0 {
        return budget / sharing;
    }
    floor + weighed * own as f64 / total as f64
}

/// Messages a pump may send, refilled at its rate.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    tokens: f64,
    refilled_at: Instant,
}

impl TokenBucket {
    /// An empty bucket filling at `rate` messages/s from `now`.
    pub fn new(rate: f64, now: Instant) -> Self {
        Self {
            rate,
            tokens: 0.0,
            refilled_at: now,
        }
    }

    /// Changes the rate from `now` on.
    pub fn set_rate(&mut self, rate: f64, now: Instant) {
        self.refill(now);
        self.rate = rate;
        self.tokens = self.tokens.min(self.capacity());
    }

    /// The most messages one batch may hold at this rate (at least 1).
    pub fn batch_limit(&self) -> usize {
        self.capacity().floor().max(1.0) as usize
    }

    /// Takes `messages` tokens if the bucket holds enough at `now` (a batch
    /// larger than the bucket waits for a full one and leaves a debt);
    /// otherwise when it will.
    pub fn take(&mut self, messages: usize, now: Instant) -> Result<(), Instant> {
        self.refill(now);
        let needed = (messages as f64).min(self.capacity().max(1.0));
        if self.tokens + 1e-9 >= needed {
            self.tokens -= messages as f64;
            return Ok(());
        }
        if self.rate <= 0.0 {
            return Err(now + Duration::from_secs(1));
        }
        Err(now + Duration::from_secs_f64((needed - self.tokens) / self.rate))
    }

    fn capacity(&self) -> f64 {
        self.rate * BURST.as_secs_f64()
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity().max(1.0));
        self.refilled_at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn parts_follow_backlogged_weight_and_add_up_to_the_cap() {
        let weights = [1u64, 9, 0];
        let parts: Vec<f64> = (0..3)
            .map(|me| {
                let others: Vec<Option<u64>> = (0..3)
                    .filter(|&n| n != me)
                    .map(|n| Some(weights[n]))
                    .collect();
                node_rate(1000.0, weights[me], &others)
            })
            .collect();
        assert!(close(parts.iter().sum(), 1000.0), "{parts:?}");
        let floor = 1000.0 / 3.0 * FLOOR_FRACTION;
        assert!(
            close(parts[2], floor),
            "an idle node keeps the floor: {parts:?}"
        );
        assert!(
            close(parts[1] - floor, 9.0 * (parts[0] - floor)),
            "{parts:?}"
        );
    }

    #[test]
    fn no_backlog_anywhere_splits_evenly() {
        assert!(close(node_rate(900.0, 0, &[Some(0), Some(0)]), 300.0));
    }

    #[test]
    fn a_silent_node_keeps_its_even_part_reserved() {
        let part = node_rate(900.0, 5, &[None, Some(0)]);
        let floor = 600.0 / 2.0 * FLOOR_FRACTION;
        assert!(close(part, 600.0 - floor), "{part}");
        assert!(close(node_rate(900.0, 5, &[None, None]), 300.0));
    }

    #[test]
    fn bucket_sends_no_more_than_its_rate_plus_one_burst() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(1000.0, start);
        assert_eq!(bucket.batch_limit(), 20);
        let mut sent = 0;
        let mut now = start;
        while now < start + Duration::from_secs(1) {
            match bucket.take(bucket.batch_limit(), now) {
                Ok(()) => sent += bucket.batch_limit(),
                Err(ready) => now = ready,
            }
        }
        assert!((980..=1020).contains(&sent), "{sent}");
    }

    #[test]
    fn oversized_batch_waits_for_a_full_bucket_and_leaves_a_debt() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(100.0, start);
        assert_eq!(bucket.batch_limit(), 2);
        let ready = bucket.take(50, start).unwrap_err();
        let waited = ready - start;
        assert!(waited.abs_diff(Duration::from_millis(20)) < Duration::from_micros(10));
        assert!(bucket.take(50, ready).is_ok());
        let next = bucket.take(1, ready).unwrap_err();
        assert!(
            next >= ready + Duration::from_millis(480),
            "{:?}",
            next - ready
        );
    }
}
