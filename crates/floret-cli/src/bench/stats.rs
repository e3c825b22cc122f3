//! The arithmetic of a benchmark report: latency percentiles, deliveries per
//! producer per one-second window, which producers stayed backlogged through
//! a window, and Jain's fairness index over them.
//!
//! Pure functions over recorded events, unit-tested here; the scenarios
//! record, this module reads.

use std::collections::BTreeMap;
use std::time::Duration;

use floret_sched::jain_index;

/// Width of a fairness window.
pub const WINDOW: Duration = Duration::from_secs(1);

/// Latency percentiles of one group of messages, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `latencies` (sorted here).
    pub fn of(mut latencies: Vec<Duration>) -> Self {
        latencies.sort_unstable();
        let rank = |fraction: f64| -> f64 {
            if latencies.is_empty() {
                return 0.0;
            }
            let index =
                ((latencies.len() as f64 * fraction).ceil() as usize).clamp(1, latencies.len()) - 1;
            latencies[index].as_secs_f64() * 1e3
        };
        Self {
            count: latencies.len(),
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            p999_ms: rank(0.999),
            max_ms: rank(1.0),
        }
    }
}

/// Jain's fairness index of `shares` (see [`jain_index`]); 1 for an empty
/// or all-zero set, where nobody was treated worse than anybody.
pub fn jain(shares: &[f64]) -> f64 {
    jain_index(shares).unwrap_or(1.0)
}

/// What happened to one producer's messages, as offsets from the run's
/// start, each list in time order ([`windows`] sorts them).
#[derive(Debug, Clone, Default)]
pub struct ProducerTimeline {
    /// When produce calls were acknowledged, with how many messages each.
    pub acknowledged: Vec<(Duration, u64)>,
    /// When each message was first delivered.
    pub delivered: Vec<Duration>,
}

impl ProducerTimeline {
    fn sort(&mut self) {
        self.acknowledged.sort_unstable();
        self.delivered.sort_unstable();
    }

    /// Whether the producer had acknowledged messages waiting for their first
    /// delivery at every moment of `[start, start + WINDOW)`. A message
    /// delivered before its acknowledgement reached the client counts as
    /// never waiting, so the answer errs towards "not backlogged".
    pub fn backlogged_through(&self, start: Duration) -> bool {
        let end = start + WINDOW;
        let acks_before = self.acknowledged.partition_point(|(at, _)| *at < start);
        let acks_by_end = self.acknowledged.partition_point(|(at, _)| *at < end);
        let deliveries_before = self.delivered.partition_point(|at| *at < start);
        let deliveries_by_end = self.delivered.partition_point(|at| *at < end);
        let acked: u64 = self.acknowledged[..acks_before]
            .iter()
            .map(|(_, count)| count)
            .sum();
        let mut waiting = acked as i64 - deliveries_before as i64;
        if waiting <= 0 {
            return false;
        }
        let mut events: Vec<(Duration, i64)> = self.acknowledged[acks_before..acks_by_end]
            .iter()
            .map(|&(at, count)| (at, count as i64))
            .chain(
                self.delivered[deliveries_before..deliveries_by_end]
                    .iter()
                    .map(|&at| (at, -1)),
            )
            .collect();
        // Deliveries first at equal times: an ack and a delivery at the same
        // instant must not hide an empty queue.
        events.sort_unstable();
        events.iter().all(|&(_, change)| {
            waiting += change;
            waiting > 0
        })
    }

    /// First deliveries in `[start, start + WINDOW)`.
    pub fn delivered_in(&self, start: Duration) -> u64 {
        let end = start + WINDOW;
        (self.delivered.partition_point(|at| *at < end)
            - self.delivered.partition_point(|at| *at < start)) as u64
    }
}

/// One window's fairness: each producer's deliveries, and Jain's index over
/// those that stayed backlogged through it (weights are all 1).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WindowFairness {
    pub start_s: u64,
    pub deliveries: BTreeMap<String, u64>,
    pub backlogged: Vec<String>,
    pub jain_backlogged: f64,
}

/// Fairness of every whole window from the start up to `end` (sorts each
/// timeline first).
pub fn windows(
    timelines: &mut BTreeMap<String, ProducerTimeline>,
    end: Duration,
) -> Vec<WindowFairness> {
    timelines.values_mut().for_each(ProducerTimeline::sort);
    let whole_windows = end.as_secs();
    (0..whole_windows)
        .map(|second| {
            let start = Duration::from_secs(second);
            let deliveries: BTreeMap<String, u64> = timelines
                .iter()
                .map(|(producer, timeline)| (producer.clone(), timeline.delivered_in(start)))
                .filter(|(_, count)| *count > 0)
                .collect();
            let backlogged: Vec<String> = timelines
                .iter()
                .filter(|(_, timeline)| timeline.backlogged_through(start))
                .map(|(producer, _)| producer.clone())
                .collect();
            let shares: Vec<f64> = backlogged
                .iter()
                .map(|producer| deliveries.get(producer).copied().unwrap_or(0) as f64)
                .collect();
            WindowFairness {
                start_s: second,
                deliveries,
                jain_backlogged: jain(&shares),
                backlogged,
            }
        })
        .collect()
}

/// Median and minimum of Jain's index over the windows in which at least two
/// producers stayed backlogged (with one, the index is 1 by definition).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct FairnessSummary {
    pub contested_windows: usize,
    pub jain_median: f64,
    pub jain_min: f64,
}

impl FairnessSummary {
    pub fn of(windows: &[WindowFairness]) -> Self {
        let mut indexes: Vec<f64> = windows
            .iter()
            .filter(|window| window.backlogged.len() >= 2)
            .map(|window| window.jain_backlogged)
            .collect();
        if indexes.is_empty() {
            return Self {
                contested_windows: 0,
                jain_median: 1.0,
                jain_min: 1.0,
            };
        }
        indexes.sort_by(f64::total_cmp);
        Self {
            contested_windows: indexes.len(),
            jain_median: indexes[indexes.len() / 2],
            jain_min: indexes[0],
        }
    }
}

/// The rate of `(time, amount)` events in each whole second from the start
/// to `end`: one point (second, amount per second) for every second, so a
/// rate that drops to nothing shows as zero, not as a gap. Events after
/// `end` are left out; the last, partial second is scaled to a full one,
/// or left out when it covers under a tenth of a second.
pub fn per_second(
    events: impl IntoIterator<Item = (Duration, f64)>,
    end: Duration,
) -> Vec<(f64, f64)> {
    let mut sums = vec![0.0; end.as_secs_f64().ceil() as usize];
    for (at, amount) in events {
        if at <= end
            && let Some(sum) = sums.get_mut(at.as_secs() as usize)
        {
            *sum += amount;
        }
    }
    let last_covered = end.as_secs_f64() - end.as_secs() as f64;
    if last_covered > 0.0 && last_covered < 0.1 {
        sums.pop();
    } else if last_covered > 0.0
        && let Some(last) = sums.last_mut()
    {
        *last /= last_covered;
    }
    sums.into_iter()
        .enumerate()
        .map(|(second, sum)| (second as f64, sum))
        .collect()
}

/// Latency percentiles of `(time, latency)` samples grouped by the whole
/// second they fall in, for the seconds that have samples.
pub fn percentiles_per_second(
    samples: impl IntoIterator<Item = (Duration, Duration)>,
) -> Vec<(f64, Percentiles)> {
    let mut by_second: BTreeMap<u64, Vec<Duration>> = BTreeMap::new();
    for (at, latency) in samples {
        by_second.entry(at.as_secs()).or_default().push(latency);
    }
    by_second
        .into_iter()
        .map(|(second, latencies)| (second as f64, Percentiles::of(latencies)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_summed_in_the_second_they_fall_in_and_quiet_seconds_are_zero() {
        let events = [(0.2, 5.0), (0.9, 1.0), (2.25, 3.0), (2.75, 9.0)]
            .map(|(at, amount)| (Duration::from_secs_f64(at), amount));
        assert_eq!(
            per_second(events, Duration::from_secs_f64(2.5)),
            [(0.0, 6.0), (1.0, 0.0), (2.0, 6.0)],
            "the half second at the end holds 3, a rate of 6; the event after the end is left out"
        );
        assert_eq!(
            per_second(events, Duration::from_secs_f64(2.05)),
            [(0.0, 6.0), (1.0, 0.0)],
            "a last second of 50 ms is too short to give a rate"
        );
        assert!(per_second([], Duration::ZERO).is_empty());
    }

    #[test]
    fn latency_percentiles_are_taken_per_second_with_samples() {
        let ms = Duration::from_millis;
        let samples = [(ms(100), ms(10)), (ms(900), ms(30)), (ms(3_100), ms(7))];
        let per_second = percentiles_per_second(samples);
        let seconds: Vec<f64> = per_second.iter().map(|(second, _)| *second).collect();
        assert_eq!(seconds, [0.0, 3.0]);
        assert_eq!(per_second[0].1.count, 2);
        assert_eq!(per_second[0].1.max_ms, 30.0);
        assert_eq!(per_second[1].1.p50_ms, 7.0);
    }

    fn ms(milliseconds: u64) -> Duration {
        Duration::from_millis(milliseconds)
    }

    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_a_monopoly() {
        assert!((jain(&[5.0, 5.0, 5.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[9.0, 0.0, 0.0]) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let latencies = (1..=100).map(ms).collect();
        let percentiles = Percentiles::of(latencies);
        assert_eq!(percentiles.count, 100);
        assert_eq!(percentiles.p50_ms, 50.0);
        assert_eq!(percentiles.p99_ms, 99.0);
        assert_eq!(percentiles.max_ms, 100.0);
    }

    #[test]
    fn a_producer_whose_queue_empties_in_a_window_is_not_backlogged_through_it() {
        let timeline = ProducerTimeline {
            acknowledged: vec![(ms(100), 3)],
            delivered: vec![ms(900), ms(1_200), ms(1_500)],
        };
        assert!(!timeline.backlogged_through(ms(0)), "nothing waits at 0");
        assert!(
            !timeline.backlogged_through(ms(1_000)),
            "its last message leaves at 1.5 s"
        );
        let refilled = ProducerTimeline {
            acknowledged: vec![(ms(100), 3), (ms(1_400), 5)],
            ..timeline
        };
        assert!(refilled.backlogged_through(ms(1_000)));
    }

    #[test]
    fn a_message_delivered_before_its_ack_arrived_does_not_count_as_waiting() {
        let timeline = ProducerTimeline {
            acknowledged: vec![(ms(1_500), 1)],
            delivered: vec![ms(1_400)],
        };
        assert!(!timeline.backlogged_through(ms(1_000)));
        assert!(!timeline.backlogged_through(ms(2_000)));
    }

    #[test]
    fn jain_of_a_window_covers_only_the_backlogged_producers() {
        let flood = |delivered: Vec<Duration>| ProducerTimeline {
            acknowledged: vec![(ms(0), 1_000)],
            delivered,
        };
        let mut timelines = BTreeMap::from([
            (
                "a".to_owned(),
                flood((0..10).map(|i| ms(1_000 + i * 90)).collect()),
            ),
            (
                "b".to_owned(),
                flood((0..30).map(|i| ms(1_000 + i * 30)).collect()),
            ),
            (
                "quiet".to_owned(),
                ProducerTimeline {
                    acknowledged: vec![(ms(1_100), 1)],
                    delivered: vec![ms(1_101)],
                },
            ),
        ]);
        let windows = windows(&mut timelines, ms(2_000));
        assert_eq!(windows.len(), 2);
        let second = &windows[1];
        assert_eq!(second.backlogged, ["a", "b"]);
        assert_eq!(second.deliveries["quiet"], 1);
        assert!((second.jain_backlogged - jain(&[10.0, 30.0])).abs() < 1e-12);
        assert!(
            windows[0].backlogged.is_empty(),
            "nothing was waiting before the first ack"
        );
        let summary = FairnessSummary::of(&windows);
        assert_eq!(summary.contested_windows, 1);
        assert!((summary.jain_min - 0.8).abs() < 1e-12);
    }
}
