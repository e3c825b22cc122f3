//! A sink's rate cap, one number for the whole cluster, split between the
//! nodes that pump into it, and the token bucket each pump spends its part
//! from. Pure: demands and times are passed in.
//!
//! Each node learns every other node's demand for the queue (backlogged
//! weight, what it sent, whether its part held it back) by asking it
//! (`Peer.SinkWeight`) every [`super::WEIGHT_POLL`]:
//! - a node that did not answer keeps an even part (`cap / nodes`) reserved
//!   for it, since it may be pumping;
//! - the rest is split among this node and the nodes that answered: each
//!   gets a floor of [`FLOOR_FRACTION`] of an even part (so a node whose
//!   backlog just appeared is not stalled until the others hear of it), and
//!   the remainder goes by weight (evenly while no one has any);
//! - the split is weighted max-min fair over what each node asks for: no
//!   limit if its part held it back (it used [`HELD_BACK_USE`] of it with a
//!   batch waiting for tokens), else what it sent in its last poll with
//!   [`HEADROOM`], never under the floor. A node gets at most what it asks
//!   for; the nodes that ask for more share what the others leave by
//!   weight; what no one asks for goes by weight. A node of quiet
//!   producers, each briefly backlogged with one message, so keeps what it
//!   uses rather than a large weighted part it cannot use while a flood
//!   waits on another node, and the flood's node takes the rest; nodes all
//!   held back split by weight alone.
//!
//! Nodes compute their parts from views taken at slightly different times,
//! so a pump uses the smallest of its last three parts: a part only grows
//! once the others have had two polls to shrink theirs.
//!
//! The bucket holds at most [`BURST`] of the rate, so no second at the sink
//! gets more than the cap plus that burst; a pump's batches are cut to what
//! the bucket holds. So that a sink answering slower than that does not
//! hold a pump below its part, a pump without `max_in_flight` keeps as many
//! batches at the sink as its part needs over the sink's answer time
//! ([`batches_for_rate`]).

use std::time::{Duration, Instant};

use super::weights::PumpDemand;

/// Share of an even part every answering node gets whatever its weight.
pub const FLOOR_FRACTION: f64 = 0.05;
/// How much more than it sent in its last poll a node its part did not
/// hold back keeps, so its demand can grow before it is held back.
pub const HEADROOM: f64 = 1.5;
/// How much of its rate a pump may send at once.
pub const BURST: Duration = Duration::from_millis(20);

/// This node's part of `cap` (messages/s), from its own demand and each
/// other node's (None: it did not answer).
pub fn node_rate(cap: f64, own: &PumpDemand, others: &[Option<PumpDemand>]) -> f64 {
    let nodes = (others.len() + 1) as f64;
    let answering: Vec<&PumpDemand> = std::iter::once(own)
        .chain(others.iter().flatten())
        .collect();
    let budget = cap * answering.len() as f64 / nodes;
    let floor = budget / answering.len() as f64 * FLOOR_FRACTION;
    let demands: Vec<f64> = answering.iter().map(|node| demand(node, floor)).collect();
    let fill_weights: Vec<f64> = answering
        .iter()
        .map(|node| node.weight.max(1) as f64)
        .collect();
    let parts = water_fill(budget, &demands, &fill_weights);
    let spare = (budget - parts.iter().sum::<f64>()).max(0.0);
    let total: u64 = answering.iter().map(|node| node.weight).sum();
    let own_spare = if total == 0 {
        spare / answering.len() as f64
    } else {
        spare * own.weight as f64 / total as f64
    };
    parts[0] + own_spare
}

/// Share of its part a node must have sent in a poll, with a batch waiting
/// for tokens, for its part to count as holding it back: a node of quiet
/// producers whose burst waited once, using less, is not held back.
pub const HELD_BACK_USE: f64 = 0.9;

/// What a node asks for: no limit when its part held it back, else what it
/// sent with [`HEADROOM`], never under `floor`.
fn demand(node: &PumpDemand, floor: f64) -> f64 {
    if node.rate_held_back {
        return f64::INFINITY;
    }
    (node.sent_per_second * HEADROOM).max(floor)
}

/// Weighted max-min fair shares of `budget`: no node gets more than its
/// demand, and the nodes that want more share what the others leave by
/// weight.
fn water_fill(budget: f64, demands: &[f64], weights: &[f64]) -> Vec<f64> {
    let mut parts = vec![0.0; demands.len()];
    let mut wanting: Vec<usize> = (0..demands.len()).collect();
    let mut left = budget;
    while !wanting.is_empty() {
        let level = left / wanting.iter().map(|&i| weights[i]).sum::<f64>();
        let (met, unmet): (Vec<usize>, Vec<usize>) = wanting
            .iter()
            .partition(|&&i| demands[i] <= level * weights[i]);
        if met.is_empty() {
            for i in unmet {
                parts[i] = level * weights[i];
            }
            break;
        }
        for i in met {
            parts[i] = demands[i];
            left -= demands[i];
        }
        wanting = unmet;
    }
    parts
}

/// Most batches [`batches_for_rate`] asks for.
pub const RATE_BATCHES_AT_MOST: usize = 16;

/// Batches of `batch` messages a pump keeps at the sink at once to send
/// `rate` messages/s to a sink that answers in `answer_time` (Little's law),
/// from 1 to [`RATE_BATCHES_AT_MOST`].
pub fn batches_for_rate(rate: f64, batch: usize, answer_time: Duration) -> usize {
    let seconds_per_batch = batch.max(1) as f64 / rate.max(f64::MIN_POSITIVE);
    let needed = (answer_time.as_secs_f64() / seconds_per_batch).ceil();
    (needed.min(RATE_BATCHES_AT_MOST as f64) as usize).max(1)
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

    /// Messages per second it refills at.
    pub fn rate(&self) -> f64 {
        self.rate
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

    fn weighing(weight: u64) -> PumpDemand {
        PumpDemand {
            weight,
            ..PumpDemand::default()
        }
    }

    /// Every node's part, as each computes it from the same demands.
    fn parts(cap: f64, demands: &[PumpDemand]) -> Vec<f64> {
        (0..demands.len())
            .map(|me| {
                let others: Vec<Option<PumpDemand>> = (0..demands.len())
                    .filter(|&n| n != me)
                    .map(|n| Some(demands[n]))
                    .collect();
                node_rate(cap, &demands[me], &others)
            })
            .collect()
    }

    #[test]
    fn parts_follow_backlogged_weight_and_add_up_to_the_cap() {
        let parts = parts(1000.0, &[weighing(1), weighing(9), weighing(0)]);
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
        let idle = Some(weighing(0));
        assert!(close(node_rate(900.0, &weighing(0), &[idle, idle]), 300.0));
    }

    #[test]
    fn a_silent_node_keeps_its_even_part_reserved() {
        let part = node_rate(900.0, &weighing(5), &[None, Some(weighing(0))]);
        let floor = 600.0 / 2.0 * FLOOR_FRACTION;
        assert!(close(part, 600.0 - floor), "{part}");
        assert!(close(node_rate(900.0, &weighing(5), &[None, None]), 300.0));
    }

    #[test]
    fn quiet_nodes_keep_what_they_use_and_the_held_back_flood_gets_the_rest() {
        // A flood (and a few quiet producers) on one node, quiet producers
        // each briefly backlogged with one message on the others: by
        // weight alone the flood's node would get a sixth of the cap.
        let flood = PumpDemand {
            weight: 2,
            sent_per_second: 300.0,
            rate_held_back: true,
            batches_held_back: false,
        };
        let quiet = PumpDemand {
            weight: 5,
            sent_per_second: 140.0,
            rate_held_back: false,
            batches_held_back: false,
        };
        let parts = parts(1900.0, &[flood, quiet, quiet]);
        assert!(close(parts.iter().sum(), 1900.0), "{parts:?}");
        assert!(close(parts[1], 210.0), "{parts:?}");
        assert!(close(parts[0], 1900.0 - 2.0 * 210.0), "{parts:?}");
    }

    #[test]
    fn a_node_its_sink_holds_back_keeps_what_it_sends_while_no_part_holds_anyone_back() {
        // The flood's node sends 400/s, all its sink's answers allow; the
        // quiet nodes' transient weights must not take that away from it.
        let flood = PumpDemand {
            weight: 1,
            sent_per_second: 400.0,
            ..PumpDemand::default()
        };
        let quiet = PumpDemand {
            weight: 4,
            sent_per_second: 40.0,
            ..PumpDemand::default()
        };
        let parts = parts(1000.0, &[flood, quiet, quiet]);
        assert!(close(parts.iter().sum(), 1000.0), "{parts:?}");
        assert!(parts[0] >= 600.0, "{parts:?}");
        assert!(parts[1] >= 60.0, "{parts:?}");
    }

    #[test]
    fn an_idle_node_keeps_the_floor_while_another_is_held_back() {
        let held_back = PumpDemand {
            weight: 1,
            sent_per_second: 500.0,
            rate_held_back: true,
            batches_held_back: false,
        };
        let parts = parts(900.0, &[held_back, weighing(0), weighing(0)]);
        let floor = 300.0 * FLOOR_FRACTION;
        assert!(close(parts[1], floor), "{parts:?}");
        assert!(close(parts[0], 900.0 - 2.0 * floor), "{parts:?}");
    }

    #[test]
    fn a_slow_sink_gets_enough_batches_at_once_for_the_rate() {
        let ms = Duration::from_millis;
        assert_eq!(batches_for_rate(500.0, 10, ms(50)), 3);
        assert_eq!(batches_for_rate(500.0, 10, ms(5)), 1);
        assert_eq!(batches_for_rate(500.0, 10, ms(0)), 1);
        assert_eq!(
            batches_for_rate(100_000.0, 1, ms(1_000)),
            RATE_BATCHES_AT_MOST
        );
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
