//! `floret bench throughput`: `--producers` producers send `--batch`
//! messages per call with `--concurrency` calls in flight for
//! `--duration-s`, while `--consumers` uncapped consumers read and ack.
//! Reports produce and consume messages and megabytes per second, and
//! produce call latency percentiles; `--plot` draws the rates and the call
//! latency per second of the run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::load::{self, AcknowledgedCall, LoadSpec};
use super::plot::{self, Chart, Series};
use super::progress::Progress;
use super::sink::{Counters, Received, Sink, SinkSpec};
use super::stats::{per_second, percentiles_per_second};
use super::{CommonArgs, Percentiles};

#[derive(clap::Args, Debug, Clone)]
pub struct ThroughputArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Producers the load is spread over.
    #[arg(long, default_value_t = 100)]
    producers: usize,
    /// Consumers reading while the load runs (0: produce only).
    #[arg(long, default_value_t = 3)]
    consumers: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 128)]
    size: usize,
    /// Messages per produce call.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Produce calls in flight.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// How long to produce.
    #[arg(long, default_value_t = 10)]
    duration_s: u64,
    /// Credits each consumer keeps granted.
    #[arg(long, default_value_t = 1_000)]
    credits: u32,
    /// Acks per ack request.
    #[arg(long, default_value_t = 64)]
    ack_batch: usize,
    /// Draw produce and consume rates and produce call latency over time.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
}

#[derive(serde::Serialize)]
struct ThroughputReport {
    scenario: &'static str,
    producers: usize,
    consumers: usize,
    message_bytes: usize,
    batch: usize,
    concurrency: usize,
    seconds: f64,
    produced: u64,
    produce_rate: f64,
    produce_megabytes_per_second: f64,
    produce_latency: Percentiles,
    failed_produce_calls: u64,
    /// Why the first failed produce call failed.
    first_produce_failure: Option<String>,
    consumed: u64,
    consume_rate: f64,
    consume_megabytes_per_second: f64,
}

pub async fn run(args: ThroughputArgs) -> anyhow::Result<()> {
    let client = crate::dial(&args.common.addr)?;
    let run_start = Instant::now();
    let duration = Duration::from_secs(args.duration_s.max(1));
    let counters = Arc::new(Counters::default());
    let (_target, never) = watch::channel(None);
    let run_tag = super::run_tag("throughput");
    let queue = args.common.queue(&run_tag);
    let sink = if args.consumers > 0 {
        let spec = SinkSpec {
            addresses: args.common.addresses()?,
            queue: queue.clone(),
            run_tag: run_tag.clone(),
            consumers: args.consumers,
            rate_cap: 0.0,
            credits: args.credits,
            ack_batch: args.ack_batch,
        };
        Some(Sink::start(&spec, run_start, counters.clone(), never)?)
    } else {
        None
    };
    let progress = Progress::start(run_start, counters.clone(), None);
    let spec = LoadSpec {
        queue: queue.clone(),
        producer_prefix: format!("{run_tag}producer"),
        count: u64::MAX,
        size: args.size,
        producers: args.producers.max(1),
        batch: args.batch.max(1),
        concurrency: args.concurrency.max(1),
        idempotent: false,
        deadline: Some(run_start + duration),
        counters: counters.clone(),
    };
    let load = load::produce(&client, &spec).await?;
    let seconds = run_start.elapsed().as_secs_f64();
    let received = match sink {
        Some(sink) => sink.finish().await?,
        None => Vec::new(),
    };
    progress.finish();
    let consumed: Vec<_> = received
        .iter()
        .filter(|delivery| delivery.at.as_secs_f64() <= seconds)
        .collect();
    let consumed_bytes: usize = consumed.iter().map(|delivery| delivery.bytes).sum();
    let report = ThroughputReport {
        scenario: "throughput",
        producers: args.producers,
        consumers: args.consumers,
        message_bytes: args.size,
        batch: args.batch,
        concurrency: args.concurrency,
        seconds,
        produced: load.messages,
        produce_rate: load.rate(),
        produce_megabytes_per_second: load.bytes as f64 / seconds / 1e6,
        produce_latency: load.latency,
        failed_produce_calls: load.failures,
        first_produce_failure: load.first_failure.clone(),
        consumed: consumed.len() as u64,
        consume_rate: consumed.len() as f64 / seconds,
        consume_megabytes_per_second: consumed_bytes as f64 / seconds / 1e6,
    };
    println!(
        "throughput: {} producers, batch {}, {} calls in flight, {} B messages, {:.1} s",
        report.producers, report.batch, report.concurrency, report.message_bytes, report.seconds
    );
    println!(
        "  produce {:>9.0} msg/s {:>7.2} MB/s  call latency p50 {:.1} ms, p99 {:.1} ms, p999 {:.1} ms ({} failed calls)",
        report.produce_rate,
        report.produce_megabytes_per_second,
        report.produce_latency.p50_ms,
        report.produce_latency.p99_ms,
        report.produce_latency.p999_ms,
        report.failed_produce_calls
    );
    if let Some(failure) = &report.first_produce_failure {
        println!("  first failed produce call: {failure}");
    }
    println!(
        "  consume {:>9.0} msg/s {:>7.2} MB/s  ({} consumers)",
        report.consume_rate, report.consume_megabytes_per_second, report.consumers
    );
    if let Some(path) = &args.plot {
        plot::write_svg(path, &charts(run_start, &load.calls, &received))?;
        println!("plot written to {}", path.display());
    }
    args.common.write_json(&report)
}

/// Messages produced (by when their call was answered) and consumed per
/// second, and the produce calls' p50 and p99 latency per second.
fn charts(run_start: Instant, calls: &[AcknowledgedCall], received: &[Received]) -> Vec<Chart> {
    let since_start = |call: &AcknowledgedCall| call.answered.saturating_duration_since(run_start);
    let end = calls.iter().map(since_start).max().unwrap_or_default();
    let produced = per_second(
        calls
            .iter()
            .map(|call| (since_start(call), call.messages as f64)),
        end,
    );
    let consumed = per_second(received.iter().map(|delivery| (delivery.at, 1.0)), end);
    let latency =
        percentiles_per_second(calls.iter().map(|call| (since_start(call), call.latency)));
    let latency_series = |name: &str, colour, pick: fn(&Percentiles) -> f64| Series {
        name: name.into(),
        colour,
        points: latency
            .iter()
            .map(|(second, percentiles)| (*second, pick(percentiles)))
            .collect(),
    };
    vec![
        Chart {
            title: "messages per second".into(),
            value_label: "messages/s".into(),
            logarithmic: false,
            series: vec![
                Series {
                    name: "produced".into(),
                    colour: plot::QUIET_COLOURS[0],
                    points: produced,
                },
                Series {
                    name: "consumed".into(),
                    colour: plot::QUIET_COLOURS[1],
                    points: consumed,
                },
            ],
        },
        Chart {
            title: "produce call latency by the second it was answered".into(),
            value_label: "ms (log)".into(),
            logarithmic: true,
            series: vec![
                latency_series("p50", plot::QUIET_COLOURS[0], |p| p.p50_ms),
                latency_series("p99", plot::FLOOD_COLOURS[0], |p| p.p99_ms),
                latency_series("max", plot::FLOOD_COLOURS[2], |p| p.max_ms),
            ],
        },
    ]
}
