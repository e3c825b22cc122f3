//! `floret bench noisy-neighbor`: flooding producers push `--messages` as
//! fast as the cluster accepts them while quiet producers each send one
//! message every `--quiet-interval-ms`; a sink of `--sink-rate` messages per
//! second consumes everything. Reports how long quiet and flooding messages
//! took from produce call to delivery, and how fairly the backlogged
//! producers shared each one-second window.
//!
//! `--flooders 21 --quiet 0` is the variant in which every producer floods.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floret_client::{Client, Message};
use tokio::sync::watch;

use super::plot::{self, Chart, Series};
use super::progress::Progress;
use super::sink::{Counters, Received, Sink, SinkSpec};
use super::stats::{self, FairnessSummary, Percentiles, ProducerTimeline, WINDOW};
use super::{CommonArgs, stamp};

/// Back-off after a failed produce call, so a refusing cluster is not hammered.
const FAILED_PRODUCE_BACKOFF: Duration = Duration::from_millis(50);

#[derive(clap::Args, Debug, Clone)]
pub struct NoisyArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Messages the flooders send in all.
    #[arg(long, default_value_t = 200_000)]
    messages: u64,
    /// Payload size in bytes (at least 12, for the time stamp).
    #[arg(long, default_value_t = 128)]
    size: usize,
    /// Flooding producers (they share `--messages`).
    #[arg(long, default_value_t = 1)]
    flooders: usize,
    /// Quiet producers.
    #[arg(long, default_value_t = 20)]
    quiet: usize,
    /// Each quiet producer sends one message this often while the flood lasts.
    #[arg(long, default_value_t = 50)]
    quiet_interval_ms: u64,
    /// Messages per flood produce call.
    #[arg(long, default_value_t = 100)]
    flood_batch: usize,
    /// Produce calls in flight per flooder.
    #[arg(long, default_value_t = 8)]
    flood_concurrency: usize,
    /// Total consume rate of the sink, messages per second (0: uncapped).
    #[arg(long, default_value_t = 5_000.0)]
    sink_rate: f64,
    /// Consumers (connected to the nodes in turn).
    #[arg(long, default_value_t = 3)]
    consumers: usize,
    /// Credits each consumer keeps granted.
    #[arg(long, default_value_t = 64)]
    credits: u32,
    /// Acks per ack request.
    #[arg(long, default_value_t = 16)]
    ack_batch: usize,
    /// Give up retrying failed flood produces, and waiting for the last
    /// deliveries, after this long.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Draw per-producer delivery rates and latency percentiles over time.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
}

/// A producer's acknowledged produce calls: (when, how many messages).
type Acks = Vec<(Duration, u64)>;

/// What a quiet producer did: its acks, and how long each produce call took.
type QuietRecord = (String, Acks, Vec<Duration>);

#[derive(serde::Serialize)]
struct NoisyReport {
    scenario: &'static str,
    flood_messages: u64,
    flooders: usize,
    quiet_producers: usize,
    sink_rate: f64,
    flood_seconds: f64,
    flood_produce_rate: f64,
    consume_rate: f64,
    produced: u64,
    delivered: u64,
    redeliveries: u64,
    not_delivered: u64,
    failed_produce_calls: u64,
    quiet_latency: Percentiles,
    /// Of the quiet latency, the produce call (until durable on a majority).
    quiet_produce_call: Percentiles,
    /// The quiet producer with the highest p99, and that p99: a quiet
    /// producer sharing a shard with the flood waits behind its entries.
    quiet_worst_producer: Option<(String, f64)>,
    flood_latency: Percentiles,
    fairness: FairnessSummary,
    windows: Vec<stats::WindowFairness>,
}

pub async fn run(args: NoisyArgs) -> anyhow::Result<()> {
    let addresses = args.common.addresses()?;
    let client = Client::connect_lazy(&args.common.addr)?;
    let run_start = Instant::now();
    let counters = Arc::new(Counters::default());
    let (target, target_seen) = watch::channel(None);
    let run_tag = super::run_tag("noisy");
    let queue = args.common.queue(&run_tag);
    let sink = Sink::start(
        &SinkSpec {
            addresses,
            queue: queue.clone(),
            run_tag: run_tag.clone(),
            consumers: args.consumers.max(1),
            rate_cap: args.sink_rate,
            credits: args.credits,
            ack_batch: args.ack_batch,
        },
        run_start,
        counters.clone(),
        target_seen,
    )?;
    let progress = Progress::start(run_start, counters.clone(), None);

    let flood_over = Arc::new(AtomicBool::new(false));
    let quiet_tasks: Vec<_> = (0..args.quiet)
        .map(|index| {
            let producer = format!("quiet-{index}");
            let tagged = format!("{run_tag}{producer}");
            tokio::spawn(quiet_producer(
                client.clone(),
                args.clone(),
                queue.clone(),
                (producer, tagged),
                run_start,
                counters.clone(),
                flood_over.clone(),
            ))
        })
        .collect();
    let mut flood_tasks = Vec::new();
    let per_flooder = args.messages / args.flooders.max(1) as u64;
    for flooder in 0..args.flooders {
        let producer = format!("flooder-{flooder}");
        let tagged = format!("{run_tag}{producer}");
        let batches = Arc::new(AtomicU64::new(
            per_flooder.div_ceil(args.flood_batch.max(1) as u64),
        ));
        for _ in 0..args.flood_concurrency.max(1) {
            flood_tasks.push(tokio::spawn(flood_worker(
                client.clone(),
                args.clone(),
                queue.clone(),
                (producer.clone(), tagged.clone()),
                batches.clone(),
                run_start,
                counters.clone(),
            )));
        }
    }
    let mut acks: BTreeMap<String, Acks> = BTreeMap::new();
    for task in flood_tasks {
        let (producer, worker_acks) = task.await?;
        acks.entry(producer).or_default().extend(worker_acks);
    }
    let flood_seconds = run_start.elapsed().as_secs_f64();
    flood_over.store(true, Ordering::Relaxed);
    let mut quiet_calls = Vec::new();
    for task in quiet_tasks {
        let (producer, quiet_acks, calls) = task.await?;
        acks.insert(producer, quiet_acks);
        quiet_calls.extend(calls);
    }
    let produced = counters.produced.load(Ordering::Relaxed);
    target.send_replace(Some(produced));
    let received = sink
        .finish_by(Instant::now() + Duration::from_secs(args.timeout_s))
        .await?;
    progress.finish();

    let report = analyse(
        &args,
        acks,
        quiet_calls,
        &received,
        &counters,
        flood_seconds,
    );
    print_summary(&report);
    args.common.write_json(&report)?;
    if let Some(path) = &args.plot {
        plot::write_svg(path, &charts(&received, report.windows.len()))?;
        println!("plot written to {}", path.display());
    }
    Ok(())
}

/// A producer's name in the report, and its id on the wire (with the run tag).
type Names = (String, String);

async fn flood_worker(
    client: Client,
    args: NoisyArgs,
    queue: String,
    (producer, tagged): Names,
    batches_left: Arc<AtomicU64>,
    run_start: Instant,
    counters: Arc<Counters>,
) -> (String, Acks) {
    let give_up_after = Duration::from_secs(args.timeout_s);
    let mut acks = Vec::new();
    while batches_left
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            left.checked_sub(1)
        })
        .is_ok()
    {
        let called_at = run_start.elapsed();
        let batch = || -> Vec<Message> {
            (0..args.flood_batch.max(1))
                .map(|_| Message {
                    payload: stamp::payload(called_at, args.size),
                    headers: Default::default(),
                })
                .collect()
        };
        let count = args.flood_batch.max(1) as u64;
        loop {
            match client.produce(&queue, &tagged, batch()).await {
                Ok(_) => {
                    acks.push((run_start.elapsed(), count));
                    counters.produced.fetch_add(count, Ordering::Relaxed);
                    break;
                }
                Err(error) => {
                    counters.produce_failures.fetch_add(1, Ordering::Relaxed);
                    if run_start.elapsed() > give_up_after {
                        tracing::warn!(%error, "flood produce still failing at the run's timeout; this worker stops");
                        return (producer, acks);
                    }
                    tracing::debug!(%error, "flood produce failed; retrying");
                    tokio::time::sleep(FAILED_PRODUCE_BACKOFF).await;
                }
            }
        }
    }
    (producer, acks)
}

async fn quiet_producer(
    client: Client,
    args: NoisyArgs,
    queue: String,
    (producer, tagged): Names,
    run_start: Instant,
    counters: Arc<Counters>,
    flood_over: Arc<AtomicBool>,
) -> QuietRecord {
    let mut acks = Vec::new();
    let mut calls = Vec::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(args.quiet_interval_ms.max(1)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !flood_over.load(Ordering::Relaxed) {
        ticks.tick().await;
        let called_at = run_start.elapsed();
        let message = Message {
            payload: stamp::payload(called_at, args.size),
            headers: Default::default(),
        };
        match client.produce(&queue, &tagged, vec![message]).await {
            Ok(_) => {
                let acked_at = run_start.elapsed();
                acks.push((acked_at, 1));
                calls.push(acked_at.saturating_sub(called_at));
                counters.produced.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                counters.produce_failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%error, "quiet produce failed");
            }
        }
    }
    (producer, acks, calls)
}

fn analyse(
    args: &NoisyArgs,
    acks: BTreeMap<String, Acks>,
    quiet_calls: Vec<Duration>,
    received: &[Received],
    counters: &Counters,
    flood_seconds: f64,
) -> NoisyReport {
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
            if delivery.producer.starts_with("flooder-") {
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
        .filter(|(producer, _)| producer.starts_with("flooder-"))
        .flat_map(|(_, timeline)| timeline.acknowledged.iter().map(|(_, count)| count))
        .sum();
    NoisyReport {
        scenario: "noisy-neighbor",
        flood_messages: args.messages,
        flooders: args.flooders,
        quiet_producers: args.quiet,
        sink_rate: args.sink_rate,
        flood_seconds,
        flood_produce_rate: flood_produced as f64 / flood_seconds.max(f64::EPSILON),
        consume_rate: first.len() as f64 / (end - start).as_secs_f64().max(f64::EPSILON),
        produced,
        delivered: first.len() as u64,
        redeliveries: counters.redeliveries.load(Ordering::Relaxed),
        not_delivered: produced.saturating_sub(first.len() as u64),
        failed_produce_calls: counters.produce_failures.load(Ordering::Relaxed),
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

fn print_summary(report: &NoisyReport) {
    let latency = |name: &str, p: &Percentiles| {
        println!(
            "  {name:<8} {:>7} msgs  p50 {:>9.1} ms  p99 {:>9.1} ms  max {:>9.1} ms",
            p.count, p.p50_ms, p.p99_ms, p.max_ms
        );
    };
    println!(
        "noisy-neighbor: {} flooder(s) sent {} messages in {:.1} s ({:.0} msg/s); {} quiet producers; sink {} msg/s",
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
    );
    println!(
        "consumed {} of {} produced at {:.0} msg/s ({} redeliveries, {} not delivered, {} failed produce calls)",
        report.delivered,
        report.produced,
        report.consume_rate,
        report.redeliveries,
        report.not_delivered,
        report.failed_produce_calls
    );
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
fn charts(received: &[Received], seconds: usize) -> Vec<Chart> {
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
            let group = usize::from(!delivery.producer.starts_with("flooder-"));
            latencies[group][second].push(delivery.at.saturating_sub(produced_at));
        }
    }
    let quiet: Vec<&Vec<f64>> = rates
        .iter()
        .filter(|(producer, _)| !producer.starts_with("flooder-"))
        .map(|(_, rate)| rate)
        .collect();
    let mut rate_series: Vec<Series> = rates
        .iter()
        .filter(|(producer, _)| producer.starts_with("flooder-"))
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
