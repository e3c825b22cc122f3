//! What a noisy-neighbor run found: latency per group (quiet and flood),
//! fairness per window, and the summary and charts made of them.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::super::plot::{self, Chart, Series};
use super::super::sink::{Counters, FLOOD_PRODUCER_PREFIX, Received};
use super::super::stats::{self, FairnessSummary, Percentiles, ProducerTimeline, WINDOW};
use super::{Acks, NoisyArgs};

#[derive(serde::Serialize)]
pub(super) struct NoisyReport {
    scenario: &'static str,
    flood_messages: u64,
    flooders: usize,
    quiet_producers: usize,
    sink: super::SinkKind,
    sink_rate: f64,
    flood_seconds: f64,
    flood_produce_rate: f64,
    consume_rate: f64,
    /// Deliveries per second from the first delivery until the flood's
    /// last produce was acknowledged: whether produce load starved dispatch.
    consume_rate_during_flood: f64,
    produced: u64,
    delivered: u64,
    redeliveries: u64,
    not_delivered: u64,
    failed_produce_calls: u64,
    /// Why the first failed produce call failed.
    first_produce_failure: Option<String>,
    quiet_latency: Percentiles,
    /// Of the quiet latency, the produce call (until durable on a majority).
    quiet_produce_call: Percentiles,
    /// The quiet producer with the highest p99, and that p99: a quiet
    /// producer sharing a shard with the flood waits behind its entries.
    quiet_worst_producer: Option<(String, f64)>,
    flood_latency: Percentiles,
    fairness: FairnessSummary,
    pub(super) windows: Vec<stats::WindowFairness>,
}

pub(super) fn analyse(
    args: &NoisyArgs,
    acks: BTreeMap<String, Acks>,
    quiet_calls: Vec<Duration>,
    received: &[Received],
    counters: &Counters,
    flood: std::ops::Range<Duration>,
) -> NoisyReport {
    let flood_seconds = (flood.end - flood.start).as_secs_f64();
    let mut timelines: BTreeMap<String, ProducerTimeline> = acks
        .into_iter()
        .map(|(producer, acknowledged)| {
            let timeline = ProducerTimeline {
                acknowledged,
                delivered: Vec::new(),
            };
            (producer, timeline)
        })
        .collect();
    let (mut quiet_latencies, mut flood_latencies) = (Vec::new(), Vec::new());
    let mut per_quiet_producer: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    let first: Vec<&Received> = received.iter().filter(|r| r.attempt == 1).collect();
    for delivery in &first {
        timelines
            .entry(delivery.producer.clone())
            .or_default()
            .delivered
            .push(delivery.at);
        if let Some(produced_at) = delivery.produced_at {
            let latency = delivery.at.saturating_sub(produced_at);
            if delivery.producer.starts_with(FLOOD_PRODUCER_PREFIX) {
                flood_latencies.push(latency);
            } else {
                quiet_latencies.push(latency);
                per_quiet_producer
                    .entry(delivery.producer.as_str())
                    .or_default()
                    .push(latency);
            }
        }
    }
    let end = first.iter().map(|r| r.at).max().unwrap_or_default();
    let start = first.iter().map(|r| r.at).min().unwrap_or_default();
    let windows = stats::windows(&mut timelines, end);
    let produced = counters.produced.load(Ordering::Relaxed);
    let flood_produced: u64 = timelines
        .iter()
        .filter(|(producer, _)| producer.starts_with(FLOOD_PRODUCER_PREFIX))
        .flat_map(|(_, timeline)| timeline.acknowledged.iter().map(|(_, count)| count))
        .sum();
    NoisyReport {
        scenario: "noisy-neighbor",
        flood_messages: args.messages,
        flooders: args.flooders,
        quiet_producers: args.quiet,
        sink: args.sink,
        sink_rate: args.sink_rate,
        flood_seconds,
        flood_produce_rate: flood_produced as f64 / flood_seconds.max(f64::EPSILON),
        consume_rate: first.len() as f64 / (end - start).as_secs_f64().max(f64::EPSILON),
        consume_rate_during_flood: rate_until(&first, start, flood.end),
        produced,
        delivered: first.len() as u64,
        redeliveries: counters.redeliveries.load(Ordering::Relaxed),
        not_delivered: produced.saturating_sub(first.len() as u64),
        failed_produce_calls: counters.produce_failures.load(Ordering::Relaxed),
        first_produce_failure: counters.first_produce_failure.get().cloned(),
        quiet_latency: Percentiles::of(quiet_latencies),
        quiet_worst_producer: per_quiet_producer
            .into_iter()
            .map(|(producer, latencies)| (producer.to_owned(), Percentiles::of(latencies).p99_ms))
            .max_by(|a, b| a.1.total_cmp(&b.1)),
        quiet_produce_call: Percentiles::of(quiet_calls),
        flood_latency: Percentiles::of(flood_latencies),
        fairness: FairnessSummary::of(&windows),
        windows,
    }
}

/// Deliveries per second among `deliveries` between `start` and `until`.
fn rate_until(deliveries: &[&Received], start: Duration, until: Duration) -> f64 {
    let seconds = until.saturating_sub(start).as_secs_f64();
    if seconds <= 0.0 {
        return 0.0;
    }
    let delivered = deliveries.iter().filter(|r| r.at <= until).count();
    delivered as f64 / seconds
}

pub(super) fn print_summary(report: &NoisyReport) {
    let latency = |name: &str, p: &Percentiles| {
        println!(
            "  {name:<8} {:>7} msgs  p50 {:>9.1} ms  p99 {:>9.1} ms  max {:>9.1} ms",
            p.count, p.p50_ms, p.p99_ms, p.max_ms
        );
    };
    println!(
        "noisy-neighbor: {} flooder(s) sent {} messages in {:.1} s ({:.0} msg/s); {} quiet producers; sink {} msg/s ({})",
        report.flooders,
        report.flood_messages,
        report.flood_seconds,
        report.flood_produce_rate,
        report.quiet_producers,
        if report.sink_rate > 0.0 {
            format!("{:.0}", report.sink_rate)
        } else {
            "uncapped".into()
        },
        report.sink.name(),
    );
    println!(
        "consumed {} of {} produced at {:.0} msg/s, {:.0} msg/s while the flood lasted ({} redeliveries, {} not delivered, {} failed produce calls)",
        report.delivered,
        report.produced,
        report.consume_rate,
        report.consume_rate_during_flood,
        report.redeliveries,
        report.not_delivered,
        report.failed_produce_calls
    );
    if let Some(failure) = &report.first_produce_failure {
        println!("first failed produce call: {failure}");
    }
    println!("end-to-end latency (produce call to delivery):");
    latency("quiet", &report.quiet_latency);
    latency("  call", &report.quiet_produce_call);
    if let Some((producer, p99_ms)) = &report.quiet_worst_producer {
        println!("  slowest quiet producer: {producer}, p99 {p99_ms:.1} ms");
    }
    latency("flood", &report.flood_latency);
    println!(
        "fairness: Jain's index over backlogged producers, {} windows with 2 or more: median {:.3}, min {:.3}",
        report.fairness.contested_windows, report.fairness.jain_median, report.fairness.jain_min
    );
}

/// Per-second delivery rates per producer (flooders, and the quiet ones
/// as their mean) and per-second latency percentiles of each group.
pub(super) fn charts(received: &[Received], seconds: usize) -> Vec<Chart> {
    let mut rates: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut latencies: [Vec<Vec<Duration>>; 2] =
        [vec![Vec::new(); seconds], vec![Vec::new(); seconds]];
    for delivery in received.iter().filter(|r| r.attempt == 1) {
        let second = (delivery.at.as_secs_f64() / WINDOW.as_secs_f64()) as usize;
        if second >= seconds {
            continue;
        }
        rates
            .entry(delivery.producer.clone())
            .or_insert_with(|| vec![0.0; seconds])[second] += 1.0;
        if let Some(produced_at) = delivery.produced_at {
            let group = usize::from(!delivery.producer.starts_with(FLOOD_PRODUCER_PREFIX));
            latencies[group][second].push(delivery.at.saturating_sub(produced_at));
        }
    }
    let quiet: Vec<&Vec<f64>> = rates
        .iter()
        .filter(|(producer, _)| !producer.starts_with(FLOOD_PRODUCER_PREFIX))
        .map(|(_, rate)| rate)
        .collect();
    let mut rate_series: Vec<Series> = rates
        .iter()
        .filter(|(producer, _)| producer.starts_with(FLOOD_PRODUCER_PREFIX))
        .enumerate()
        .map(|(index, (producer, rate))| Series {
            name: producer.clone(),
            colour: plot::FLOOD_COLOURS[index % plot::FLOOD_COLOURS.len()],
            points: rate
                .iter()
                .enumerate()
                .map(|(s, r)| (s as f64, *r))
                .collect(),
        })
        .collect();
    if !quiet.is_empty() {
        rate_series.push(Series {
            name: format!("quiet (mean of {})", quiet.len()),
            colour: plot::QUIET_COLOURS[0],
            points: (0..seconds)
                .map(|s| {
                    (
                        s as f64,
                        quiet.iter().map(|rate| rate[s]).sum::<f64>() / quiet.len() as f64,
                    )
                })
                .collect(),
        });
    }
    let mut latency_series = Vec::new();
    for (group, name, colours) in [
        (1, "quiet", plot::QUIET_COLOURS),
        (0, "flood", plot::FLOOD_COLOURS),
    ] {
        let per_second: Vec<Percentiles> = latencies[group]
            .iter()
            .map(|l| Percentiles::of(l.clone()))
            .collect();
        for (index, (label, pick)) in [("p50", 0), ("p99", 1)].into_iter().enumerate() {
            latency_series.push(Series {
                name: format!("{name} {label}"),
                colour: colours[index],
                points: per_second
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.count > 0)
                    .map(|(s, p)| (s as f64, if pick == 0 { p.p50_ms } else { p.p99_ms }))
                    .collect(),
            });
        }
    }
    vec![
        Chart {
            title: "first deliveries per second, per producer".into(),
            value_label: "messages/s (log)".into(),
            logarithmic: true,
            series: rate_series,
        },
        Chart {
            title: "end-to-end latency by delivery second".into(),
            value_label: "ms (log)".into(),
            logarithmic: true,
            series: latency_series,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered_at(ms: u64) -> Received {
        Received {
            producer: "quiet-0".into(),
            attempt: 1,
            at: Duration::from_millis(ms),
            produced_at: None,
            bytes: 1,
        }
    }

    #[test]
    fn deliveries_after_the_flood_do_not_count_toward_its_consume_rate() {
        let received: Vec<_> = [500, 1_000, 1_500, 2_500, 9_000]
            .into_iter()
            .map(delivered_at)
            .collect();
        let first: Vec<&Received> = received.iter().collect();
        let rate = rate_until(
            &first,
            Duration::from_millis(500),
            Duration::from_millis(2_500),
        );
        assert!((rate - 2.0).abs() < 1e-9, "{rate}");
        assert_eq!(
            rate_until(&first, Duration::from_secs(3), Duration::from_secs(2)),
            0.0
        );
    }
}
