//! What the dispatcher remembers to report how fair it has been, per queue:
//! deliveries per producer over the last [`WINDOW_SECONDS`] seconds (in
//! one-second slots) and each producer's recent dwell times (commit to
//! first delivery).
//!
//! Jain's index is taken over producers that are still backlogged and were
//! delivered in the window, each counted as deliveries divided by weight:
//! 1.0 when every such producer got its weighted share.
//!
//! Each producer delivered in the window costs one entry of fixed size: its
//! per-second counts and at most [`DWELL_SAMPLES`] dwell times. A queue
//! drained over 10,000 producers held about 27 MB here when every second
//! had a map of its own and each producer kept 256 eight-byte samples; it
//! now holds about 4 MB.
//!
//! IMPLEMENTATION CAVEATS
//! - "Backlogged" is judged when the figures are read, not through the
//!   whole window: a producer that emptied half-way counts if it refilled.
//! - Dwell percentiles come from each producer's last [`DWELL_SAMPLES`]
//!   first deliveries, so its p99 is the largest of them. Dwell times are
//!   kept in whole milliseconds up to about 49 days.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// Length of the delivery window.
pub const WINDOW_SECONDS: u64 = 10;
/// Dwell samples kept per producer: 256 bytes each, enough for a median
/// and a tail over its latest deliveries.
pub const DWELL_SAMPLES: usize = 64;

const SLOTS: usize = WINDOW_SECONDS as usize;

/// One producer's deliveries in the window and its latest dwell times.
struct ProducerWindow {
    /// The latest second it was delivered in.
    latest_second: u64,
    /// Deliveries in second `s` at slot `s % WINDOW_SECONDS`, for the seconds
    /// from `latest_second - WINDOW_SECONDS + 1` to `latest_second`.
    per_second: [u32; SLOTS],
    /// Dwell times of its latest first deliveries, ms, oldest first.
    dwell_ms: VecDeque<u32>,
}

impl ProducerWindow {
    fn new(second: u64) -> Self {
        Self {
            latest_second: second,
            per_second: [0; SLOTS],
            dwell_ms: VecDeque::new(),
        }
    }

    /// Counts one delivery at `second`; a second before the latest (the
    /// clock stepped back) counts in the latest.
    fn count(&mut self, second: u64) {
        if second > self.latest_second {
            let cleared = (second - self.latest_second).min(WINDOW_SECONDS);
            for passed in second + 1 - cleared..=second {
                self.per_second[slot(passed)] = 0;
            }
            self.latest_second = second;
        }
        let count = &mut self.per_second[slot(self.latest_second)];
        *count = count.saturating_add(1);
    }

    fn record_dwell(&mut self, dwell_ms: u64) {
        if self.dwell_ms.len() == DWELL_SAMPLES {
            self.dwell_ms.pop_front();
        }
        self.dwell_ms
            .push_back(u32::try_from(dwell_ms).unwrap_or(u32::MAX));
    }

    /// Deliveries in the window that ends at `now_second`.
    fn deliveries_until(&self, now_second: u64) -> u64 {
        let first = (now_second.max(self.latest_second) + 1).saturating_sub(WINDOW_SECONDS);
        (first..=now_second.min(self.latest_second))
            .map(|second| u64::from(self.per_second[slot(second)]))
            .sum()
    }

    fn in_window(&self, now_second: u64) -> bool {
        self.latest_second + WINDOW_SECONDS > now_second
    }
}

fn slot(second: u64) -> usize {
    (second % WINDOW_SECONDS) as usize
}

/// One queue's recent deliveries and dwell times, per producer `K`.
pub struct FairnessWindow<K> {
    producers: HashMap<K, ProducerWindow>,
    /// The second producers out of the window were last forgotten at.
    forgotten_at_second: u64,
}

impl<K> Default for FairnessWindow<K> {
    fn default() -> Self {
        Self {
            producers: HashMap::new(),
            forgotten_at_second: 0,
        }
    }
}

/// A producer's recent figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProducerFairness {
    /// Deliveries in the window.
    pub window_deliveries: u64,
    /// Median commit-to-first-delivery time, ms.
    pub dwell_p50_ms: u64,
    /// 99th percentile of it, ms.
    pub dwell_p99_ms: u64,
}

impl<K: Hash + Eq + Clone> FairnessWindow<K> {
    /// Records a delivery at `now_second` (Unix seconds); `dwell_ms` for a first delivery.
    pub fn delivered(&mut self, producer: &K, now_second: u64, dwell_ms: Option<u64>) {
        self.forget_idle(now_second);
        let window = match self.producers.get_mut(producer) {
            Some(window) => window,
            None => self
                .producers
                .entry(producer.clone())
                .or_insert_with(|| ProducerWindow::new(now_second)),
        };
        window.count(now_second);
        if let Some(dwell_ms) = dwell_ms {
            window.record_dwell(dwell_ms);
        }
    }

    /// Drops the producers not delivered in the window, once a second: a
    /// producer that went idle keeps nothing here, whether or not anyone
    /// reads the figures. A map left far larger than what it holds (a
    /// drained crowd of producers) is given back.
    fn forget_idle(&mut self, now_second: u64) {
        if now_second <= self.forgotten_at_second {
            return;
        }
        self.forgotten_at_second = now_second;
        self.producers
            .retain(|_, window| window.in_window(now_second));
        if self.producers.capacity() > 4 * self.producers.len().max(64) {
            self.producers.shrink_to_fit();
        }
    }

    /// Per producer figures for the window ending at `now_second`; producers
    /// without deliveries in it are forgotten.
    pub fn figures(&mut self, now_second: u64) -> HashMap<K, ProducerFairness> {
        self.forget_idle(now_second);
        self.producers
            .iter()
            .filter(|(_, window)| window.in_window(now_second))
            .map(|(producer, window)| {
                let mut sorted: Vec<u32> = window.dwell_ms.iter().copied().collect();
                sorted.sort_unstable();
                let at = |fraction: f64| {
                    let index = ((sorted.len() as f64 * fraction).ceil() as usize).max(1) - 1;
                    sorted.get(index).map_or(0, |&ms| u64::from(ms))
                };
                let figures = ProducerFairness {
                    window_deliveries: window.deliveries_until(now_second),
                    dwell_p50_ms: at(0.50),
                    dwell_p99_ms: at(0.99),
                };
                (producer.clone(), figures)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_deliveries_leave_the_window() {
        let mut window = FairnessWindow::default();
        let (a, b) = ("a", "b");
        window.delivered(&a, 100, Some(5));
        window.delivered(&b, 105, Some(7));
        window.delivered(&b, 109, None);
        let figures = window.figures(112);
        assert!(!figures.contains_key(&a));
        assert_eq!(figures[&b].window_deliveries, 2);
        assert_eq!((figures[&b].dwell_p50_ms, figures[&b].dwell_p99_ms), (7, 7));
    }

    #[test]
    fn idle_producer_dwell_samples_are_dropped_without_a_stats_read() {
        let mut window = FairnessWindow::default();
        let (idle, busy) = ("idle", "busy");
        window.delivered(&idle, 100, Some(5));
        window.delivered(&idle, 103, Some(6));
        window.delivered(&busy, 105, Some(7));
        assert_eq!(window.producers.len(), 2);
        window.delivered(&busy, 112, Some(8));
        assert!(
            window.producers.contains_key(&idle),
            "delivered at 103, still in the window"
        );
        window.delivered(&busy, 113, Some(9));
        assert!(!window.producers.contains_key(&idle));
        assert_eq!(window.producers[&busy].dwell_ms.len(), 3);
    }

    #[test]
    fn seconds_that_leave_the_window_stop_counting_after_a_wrap_of_the_slots() {
        let mut window = FairnessWindow::default();
        let producer = "p";
        for second in [100, 100, 100, 108, 111] {
            window.delivered(&producer, second, None);
        }
        assert_eq!(window.figures(111)[&producer].window_deliveries, 2);
        assert_eq!(window.figures(117)[&producer].window_deliveries, 2);
        assert_eq!(window.figures(118)[&producer].window_deliveries, 1);
        window.delivered(&producer, 140, None);
        assert_eq!(window.figures(140)[&producer].window_deliveries, 1);
    }

    #[test]
    fn a_clock_stepping_back_counts_in_the_latest_second() {
        let mut window = FairnessWindow::default();
        let producer = "p";
        window.delivered(&producer, 100, None);
        window.delivered(&producer, 95, None);
        assert_eq!(window.figures(100)[&producer].window_deliveries, 2);
        assert_eq!(window.figures(98)[&producer].window_deliveries, 0);
    }

    #[test]
    fn a_producer_drained_of_thousands_keeps_a_bounded_number_of_dwell_samples() {
        let mut window = FairnessWindow::default();
        let producer = "p";
        for ms in 0..10_000u64 {
            window.delivered(&producer, 100, Some(ms));
        }
        let samples = &window.producers[&producer].dwell_ms;
        assert_eq!(samples.len(), DWELL_SAMPLES);
        assert!(
            samples.capacity() <= DWELL_SAMPLES,
            "{}",
            samples.capacity()
        );
        let figures = window.figures(100);
        assert_eq!(figures[&producer].dwell_p99_ms, 9_999);
        assert_eq!(figures[&producer].dwell_p50_ms, 9_967);
    }

    #[test]
    fn a_drained_crowd_of_producers_gives_its_memory_back() {
        let mut window = FairnessWindow::default();
        let producers: Vec<String> = (0..10_000).map(|n| format!("p{n}")).collect();
        for producer in &producers {
            window.delivered(producer, 100, Some(1));
        }
        let last = "last".to_string();
        window.delivered(&last, 110, Some(1));
        assert_eq!(window.producers.len(), 1);
        assert!(
            window.producers.capacity() < 1_000,
            "{}",
            window.producers.capacity()
        );
    }
}
