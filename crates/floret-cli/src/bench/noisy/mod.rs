//! `floret bench noisy-neighbor`: flooding producers push `--messages` as
//! fast as the cluster accepts them while quiet producers each send one
//! message every `--quiet-interval-ms`; a sink of `--sink-rate` messages per
//! second consumes everything. Reports how long quiet and flooding messages
//! took from produce call to delivery, and how fairly the backlogged
//! producers shared each one-second window.
//!
//! `--flooders 21 --quiet 0` is the variant in which every producer floods.
//! `--sink` says what the sink is: consumers pulling from floret (the
//! default), a floret sink pushing into a gRPC sink served here or into
//! RabbitMQ, or RabbitMQ alone, published into straight (`outlet.rs`). The
//! analysis of a run and its summary and charts are `report.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floret_client::Message;
use tokio::sync::watch;

use super::plot;
use super::progress::Progress;
use super::sink::{Counters, FLOOD_PRODUCER_PREFIX, Sink, SinkSpec};
use super::{CommonArgs, stamp};

mod outlet;
mod report;

use outlet::{Front, Outlet, SinkKind};
use report::{analyse, charts, print_summary};

/// Back-off after a failed produce call, so a refusing cluster is not hammered.
const FAILED_PRODUCE_BACKOFF: Duration = Duration::from_millis(50);

/// How much of the sink's rate its consumers keep granted by default. A
/// credit comes back only after a delivery's round trip (ack through the
/// consumer's node to the shard's leader, delivery back), so a window
/// shorter than that round trip caps the sink below its rate. 64 credits
/// per consumer of three at 5,000 msg/s is about this long; one consumer
/// gets the same window in time, not a third of it.
const SINK_CREDIT_WINDOW: Duration = Duration::from_millis(40);
/// Fewest credits a consumer keeps granted by default.
const MIN_DEFAULT_CREDITS: u32 = 64;

/// Credits per consumer that keep [`SINK_CREDIT_WINDOW`] of the sink's
/// rate granted over `consumers` consumers (uncapped sinks get the minimum).
fn window_credits(sink_rate: f64, consumers: usize) -> u32 {
    let per_consumer = sink_rate.max(0.0) / consumers as f64;
    let credits = (per_consumer * SINK_CREDIT_WINDOW.as_secs_f64()).ceil();
    (credits.min(f64::from(u32::MAX)) as u32).max(MIN_DEFAULT_CREDITS)
}

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
    /// How long the flood lasts for the quiet producers: `produce`, until
    /// its produce calls are acknowledged; `backlog`, until its messages are
    /// delivered too (the quiet ones then wait behind its whole backlog).
    #[arg(long, value_enum, default_value_t = QuietWhile::Produce)]
    quiet_while: QuietWhile,
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
    /// Credits each consumer keeps granted (default: enough for
    /// `SINK_CREDIT_WINDOW` of its share of `--sink-rate`, at least 64).
    #[arg(long)]
    credits: Option<u32>,
    /// Acks per ack request.
    #[arg(long, default_value_t = 16)]
    ack_batch: usize,
    /// What the sink is: `consumers` pull from floret at --sink-rate;
    /// `grpc`: the queue's floret sink pushes into a gRPC sink served here,
    /// capped at --sink-rate; `amqp`: it pushes into a RabbitMQ queue
    /// (--amqp-uri) drained at --sink-rate; `rabbitmq-alone`: the producers
    /// publish straight into that RabbitMQ queue, without floret.
    #[arg(long, value_enum, default_value_t = SinkKind::Consumers)]
    sink: SinkKind,
    /// The RabbitMQ of `--sink amqp` and `--sink rabbitmq-alone`.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp_uri: String,
    /// The floret sink's rate cap, messages/s (default: --sink-rate for
    /// grpc; 95% of it for amqp, so RabbitMQ's own queue stays short).
    #[arg(long)]
    sink_cap: Option<u32>,
    /// The floret sink's batch_max.
    #[arg(long, default_value_t = 100)]
    sink_batch_max: u32,
    /// The floret sink's linger, ms.
    #[arg(long, default_value_t = 5)]
    sink_linger_ms: u32,
    /// The floret sink's max_in_flight, batches for the whole cluster (0:
    /// one per node).
    #[arg(long, default_value_t = 0)]
    sink_max_in_flight: u32,
    /// Give up retrying failed flood produces, and waiting for the last
    /// deliveries, after this long.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Draw per-producer delivery rates and latency percentiles over time.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
}

/// How long the quiet producers send.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuietWhile {
    /// While the flood's produce calls last.
    Produce,
    /// Until the flood's messages are delivered.
    Backlog,
}

/// How often the quiet producers' end is checked for with `--quiet-while
/// backlog`.
const BACKLOG_POLL: Duration = Duration::from_millis(20);

/// A producer's acknowledged produce calls: (when, how many messages).
type Acks = Vec<(Duration, u64)>;

/// What a quiet producer did: its acks, and how long each produce call took.
type QuietRecord = (String, Acks, Vec<Duration>);

pub async fn run(args: NoisyArgs) -> anyhow::Result<()> {
    let addresses = args.common.addresses()?;
    let client = crate::dial(&args.common.addr)?;
    let run_start = Instant::now();
    let counters = Arc::new(Counters::default());
    let (target, target_seen) = watch::channel(None);
    let run_tag = super::run_tag("noisy");
    let queue = args.common.queue(&run_tag);
    let sink = match args.sink {
        SinkKind::Consumers => Outlet::Consumers(Sink::start(
            &SinkSpec {
                addresses,
                queue: queue.clone(),
                run_tag: run_tag.clone(),
                consumers: args.consumers.max(1),
                rate_cap: args.sink_rate,
                credits: args
                    .credits
                    .unwrap_or_else(|| window_credits(args.sink_rate, args.consumers.max(1))),
                ack_batch: args.ack_batch,
            },
            run_start,
            counters.clone(),
            target_seen,
        )?),
        _ => {
            Outlet::pushed(
                &args,
                &client,
                &queue,
                (&run_tag, run_start),
                counters.clone(),
                target_seen,
            )
            .await?
        }
    };
    let front = Front::for_run(&args, &client, &queue).await?;
    let flood_started = run_start.elapsed();
    let progress = Progress::start(run_start, counters.clone(), None);

    let flood_over = Arc::new(AtomicBool::new(false));
    let quiet_tasks: Vec<_> = (0..args.quiet)
        .map(|index| {
            let producer = format!("quiet-{index}");
            let tagged = format!("{run_tag}{producer}");
            tokio::spawn(quiet_producer(
                front.clone(),
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
        let producer = format!("{FLOOD_PRODUCER_PREFIX}{flooder}");
        let tagged = format!("{run_tag}{producer}");
        let batches = Arc::new(AtomicU64::new(
            per_flooder.div_ceil(args.flood_batch.max(1) as u64),
        ));
        for _ in 0..args.flood_concurrency.max(1) {
            flood_tasks.push(tokio::spawn(flood_worker(
                front.clone(),
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
    let flood = flood_started..run_start.elapsed();
    if args.quiet_while == QuietWhile::Backlog {
        let flood_acknowledged: u64 = acks.values().flatten().map(|(_, count)| count).sum();
        let give_up = Instant::now() + Duration::from_secs(args.timeout_s);
        while counters.flood_first_deliveries.load(Ordering::Relaxed) < flood_acknowledged
            && Instant::now() < give_up
        {
            tokio::time::sleep(BACKLOG_POLL).await;
        }
    }
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
        .finish_by(
            &client,
            &queue,
            Instant::now() + Duration::from_secs(args.timeout_s),
        )
        .await?;
    progress.finish();

    let report = analyse(&args, acks, quiet_calls, &received, &counters, flood);
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
    front: Front,
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
            match front.produce(&queue, &tagged, batch()).await {
                Ok(_) => {
                    acks.push((run_start.elapsed(), count));
                    counters.produced.fetch_add(count, Ordering::Relaxed);
                    break;
                }
                Err(error) => {
                    counters.produce_failed(&error);
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
    front: Front,
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
        match front.produce(&queue, &tagged, vec![message]).await {
            Ok(_) => {
                let acked_at = run_start.elapsed();
                acks.push((acked_at, 1));
                calls.push(acked_at.saturating_sub(called_at));
                counters.produced.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                counters.produce_failed(&error);
                tracing::debug!(%error, "quiet produce failed");
            }
        }
    }
    (producer, acks, calls)
}

#[cfg(test)]
mod tests {
    use super::window_credits;

    #[test]
    fn one_consumer_gets_a_third_of_the_credit_window_three_consumers_get() {
        assert_eq!(window_credits(5_000.0, 3), 67);
        assert_eq!(window_credits(5_000.0, 1), 200);
    }

    #[test]
    fn slow_or_uncapped_sinks_keep_the_minimum_window() {
        assert_eq!(window_credits(100.0, 1), 64);
        assert_eq!(window_credits(0.0, 3), 64);
    }
}
