//! What the dispatcher remembers to report how fair it has been, per queue:
//! deliveries per producer over the last [`WINDOW_SECONDS`] seconds (in
//! one-second buckets) and each producer's recent dwell times (commit to
//! first delivery).
//!
//! Jain's index is taken over producers that are still backlogged and were
//! delivered in the window, each counted as deliveries divided by weight:
//! 1.0 when every such producer got its weighted share.
//!
//! IMPLEMENTATION CAVEATS
//! - "Backlogged" is judged when the figures are read, not through the
//!   whole window: a producer that emptied half-way counts if it refilled.
//! - Dwell percentiles come from each producer's last [`DWELL_SAMPLES`]
//!   first deliveries.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// Length of the delivery window.
pub const WINDOW_SECONDS: u64 = 10;
/// Dwell samples kept per producer.
pub const DWELL_SAMPLES: usize = 256;

/// Deliveries per producer in one second.
struct Bucket<K> {
    second: u64,
    deliveries: HashMap<K, u64>,
}

/// One queue's recent deliveries and dwell times, per producer `K`.
pub struct FairnessWindow<K> {
    buckets: VecDeque<Bucket<K>>,
    dwell_ms: HashMap<K, VecDeque<u64>>,
}

impl<K> Default for FairnessWindow<K> {
    fn default() -> Self {
        Self {
            buckets: VecDeque::new(),
            dwell_ms: HashMap::new(),
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
        if self.buckets.back().is_none_or(|b| b.second != now_second) {
            self.buckets.push_back(Bucket {
                second: now_second,
                deliveries: HashMap::new(),
            });
        }
        let bucket = self.buckets.back_mut().expect("pushed above");
        match bucket.deliveries.get_mut(producer) {
            Some(count) => *count += 1,
            None => {
                bucket.deliveries.insert(producer.clone(), 1);
            }
        }
        self.expire(now_second);
        if let Some(dwell) = dwell_ms {
            match self.dwell_ms.get_mut(producer) {
                Some(samples) => {
                    if samples.len() == DWELL_SAMPLES {
                        samples.pop_front();
                    }
                    samples.push_back(dwell);
                }
                None => {
                    self.dwell_ms
                        .insert(producer.clone(), VecDeque::from([dwell]));
                }
            }
        }
    }

    /// Drops the buckets that left the window, and the dwell samples of
    /// producers no remaining bucket names: a producer that went idle keeps
    /// nothing here, whether or not anyone reads the figures.
    fn expire(&mut self, now_second: u64) {
        while self
            .buckets
            .front()
            .is_some_and(|b| b.second + WINDOW_SECONDS <= now_second)
        {
            let Some(expired) = self.buckets.pop_front() else {
                break;
            };
            for producer in expired.deliveries.keys() {
                let still_delivered = self
                    .buckets
                    .iter()
                    .any(|bucket| bucket.deliveries.contains_key(producer));
                if !still_delivered {
                    self.dwell_ms.remove(producer);
                }
            }
        }
    }

    /// Per producer figures for the window ending at `now_second`; producers
    /// without deliveries in it are forgotten.
    pub fn figures(&mut self, now_second: u64) -> HashMap<K, ProducerFairness> {
        self.expire(now_second);
        let mut figures: HashMap<K, ProducerFairness> = HashMap::new();
        for bucket in &self.buckets {
            for (producer, count) in &bucket.deliveries {
                figures
                    .entry(producer.clone())
                    .or_default()
                    .window_deliveries += count;
            }
        }
        self.dwell_ms
            .retain(|producer, _| figures.contains_key(producer));
        for (producer, samples) in &self.dwell_ms {
            let mut sorted: Vec<u64> = samples.iter().copied().collect();
            sorted.sort_unstable();
            let at = |fraction: f64| {
                let index = ((sorted.len() as f64 * fraction).ceil() as usize).max(1) - 1;
                sorted[index.min(sorted.len() - 1)]
            };
            if let Some(figure) = figures.get_mut(producer) {
                figure.dwell_p50_ms = at(0.50);
                figure.dwell_p99_ms = at(0.99);
            }
        }
        figures
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
        assert_eq!(window.dwell_ms.len(), 2);
        window.delivered(&busy, 112, Some(8));
        assert!(
            window.dwell_ms.contains_key(&idle),
            "delivered at 103, still in the window"
        );
        window.delivered(&busy, 113, Some(9));
        assert!(!window.dwell_ms.contains_key(&idle));
        assert_eq!(window.dwell_ms[&busy].len(), 3);
    }
}
