//! `floret bench moves`: what changes of members cost a cluster that
//! serves. It fills the shards with `--backlog` messages, then keeps an
//! idempotent produce load and a capped shared sink (`--consumers`,
//! `--sink-rate`) running while it runs each `--change` command in turn
//! (a shell command that adds, removes or replaces a node, such as
//! `deploy/local-cluster.sh add 4`), polling the cluster status meanwhile.
//! For each change it reports the share of shards that moved and of
//! replicas and stored bytes copied next to the least any placement could
//! copy, the time each shard's move took, how long until every shard had
//! settled, and the produce rate meanwhile; then, over `--after-s` seconds
//! once the shards settled, the produce rate (the steady state next to
//! the moves) and Jain's index over the producers' deliveries per second
//! (cross-node fairness: every producer is backlogged, as the load
//! produces far faster than the sink takes).
//!
//! `tracker.rs` does the bookkeeping from status polls, given their time;
//! this module is the I/O.
//!
//! IMPLEMENTATION CAVEATS
//! - Bytes copied are the stored bytes of the shards each new replica
//!   copies, as their leader reports them when the change begins (what a
//!   snapshot carries); the raft log sent with it is not counted.
//! - A shard's move time is measured between status polls (every
//!   [`POLL_INTERVAL`]): a move shorter than that shows as one interval.
//! - The nodes the commands start are not dialled by the load: it goes
//!   through `--addr`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use floret_client::Client;

use super::load::{self, LoadSpec};
use super::progress::Progress;
use super::sink::{Received, Sink, SinkSpec};
use super::stats::jain;
use super::{CommonArgs, Counters};

mod tracker;

use tracker::{ChangeFigures, ChangeTracker, Poll};

/// How often the cluster status is polled while members change.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

#[derive(clap::Args, Debug, Clone)]
pub struct MovesArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Shell commands that each change the members, run in order (each
    /// once the shards settled after the last), e.g. `deploy/local-cluster.sh add 4`.
    #[arg(long = "change", required = true)]
    changes: Vec<String>,
    /// Messages stored before the first change, so moves copy data.
    #[arg(long, default_value_t = 200_000)]
    backlog: u64,
    /// Producers the load is spread over.
    #[arg(long, default_value_t = 64)]
    producers: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 512)]
    size: usize,
    /// Messages per produce call of the load that runs through the changes.
    #[arg(long, default_value_t = 10)]
    batch: usize,
    /// Produce calls in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// How long the load runs before the first change: the steady rate.
    #[arg(long, default_value_t = 10)]
    steady_s: u64,
    /// How long after each change settled the rate and fairness are
    /// measured, before the next change.
    #[arg(long, default_value_t = 5)]
    after_s: u64,
    /// Consumers of the shared sink (0: none, and no fairness figures).
    #[arg(long, default_value_t = 3)]
    consumers: usize,
    /// The shared sink's capacity, messages per second over all consumers:
    /// below the produce rate, so every producer stays backlogged.
    #[arg(long, default_value_t = 5_000.0)]
    sink_rate: f64,
    /// The longest a change may take until every shard settled.
    #[arg(long, default_value_t = 300)]
    settle_timeout_s: u64,
}

#[derive(serde::Serialize)]
struct MovesReport {
    scenario: &'static str,
    producers: usize,
    message_bytes: usize,
    batch: usize,
    concurrency: usize,
    backlog: u64,
    steady_rate: f64,
    failed_produce_calls: u64,
    first_produce_failure: Option<String>,
    changes: Vec<ChangeReport>,
}

#[derive(serde::Serialize)]
struct ChangeReport {
    command: String,
    seconds: f64,
    produce_rate: f64,
    figures: ChangeFigures,
    /// When the shards settled, from the start of the load.
    settled_at_s: f64,
    /// The produce rate over the window after the shards settled.
    produce_rate_after: f64,
    /// Jain's index over the producers' deliveries in each second of that
    /// window: median and least (None without consumers).
    jain_after_median: Option<f64>,
    jain_after_min: Option<f64>,
}

pub async fn run(args: MovesArgs) -> anyhow::Result<()> {
    let client = crate::dial(&args.common.addr)?;
    let run_tag = super::run_tag("moves");
    let queue = args.common.queue(&run_tag);
    let producers = args.producers.max(1);
    let counters = Arc::new(Counters::default());
    let fill = LoadSpec {
        queue: queue.clone(),
        producer_prefix: format!("{run_tag}producer"),
        count: args.backlog,
        size: args.size,
        producers,
        batch: 100,
        concurrency: 8,
        idempotent: false,
        deadline: None,
        counters: Arc::new(Counters::default()),
    };
    let filled = load::produce(&client, &fill).await?;
    anyhow::ensure!(
        filled.failures == 0,
        "filling the backlog failed: {:?}",
        filled.first_failure
    );
    println!(
        "moves: {} messages of {} B stored; load: {producers} producers, batch {}, {} calls in flight",
        filled.messages, args.size, args.batch, args.concurrency
    );
    let run_start = Instant::now();
    let sink = if args.consumers > 0 {
        let spec = SinkSpec {
            addresses: args.common.addresses()?,
            queue: queue.clone(),
            run_tag: run_tag.clone(),
            consumers: args.consumers,
            rate_cap: args.sink_rate,
            credits: 100,
            ack_batch: 16,
        };
        let (_no_target, never) = tokio::sync::watch::channel(None);
        Some(Sink::start(&spec, run_start, counters.clone(), never)?)
    } else {
        None
    };
    let progress = Progress::start(run_start, counters.clone(), None);
    let steady = LoadSpec {
        count: u64::MAX,
        batch: args.batch.max(1),
        concurrency: args.concurrency.max(1),
        idempotent: true,
        counters: counters.clone(),
        ..fill
    };
    let load = {
        let client = client.clone();
        tokio::spawn(async move { load::produce(&client, &steady).await })
    };
    let produced = || counters.produced.load(Ordering::Relaxed);
    let steady_from = produced();
    tokio::time::sleep(Duration::from_secs(args.steady_s.max(1))).await;
    let steady_rate =
        (produced() - steady_from) as f64 / run_start.elapsed().as_secs_f64().max(f64::EPSILON);
    let mut changes = Vec::new();
    for command in &args.changes {
        let began = Instant::now();
        let produced_before = produced();
        let figures = follow_change(
            &client,
            command,
            run_start,
            Duration::from_secs(args.settle_timeout_s),
        )
        .await?;
        let seconds = began.elapsed().as_secs_f64();
        let produce_rate = (produced() - produced_before) as f64 / seconds.max(f64::EPSILON);
        let settled_at = run_start.elapsed();
        let produced_settled = produced();
        tokio::time::sleep(Duration::from_secs(args.after_s.max(1))).await;
        let after = run_start.elapsed() - settled_at;
        changes.push(ChangeReport {
            command: command.clone(),
            seconds,
            produce_rate,
            figures,
            settled_at_s: settled_at.as_secs_f64(),
            produce_rate_after: (produced() - produced_settled) as f64
                / after.as_secs_f64().max(f64::EPSILON),
            jain_after_median: None,
            jain_after_min: None,
        });
    }
    load.abort();
    if let Some(sink) = sink {
        let received = sink.finish().await?;
        for change in &mut changes {
            let indexes = jain_per_second(&received, change.settled_at_s, args.after_s.max(1));
            change.jain_after_median = indexes.get(indexes.len() / 2).copied();
            change.jain_after_min = indexes.first().copied();
        }
    }
    progress.finish();
    let report = MovesReport {
        scenario: "moves",
        producers,
        message_bytes: args.size,
        batch: args.batch,
        concurrency: args.concurrency,
        backlog: filled.messages,
        steady_rate,
        failed_produce_calls: counters.produce_failures.load(Ordering::Relaxed),
        first_produce_failure: counters.first_produce_failure.get().cloned(),
        changes,
    };
    print_report(&report);
    args.common.write_json(&report)
}

/// Runs `command` while polling the cluster status, until it has exited
/// and every shard settled after the change (within `timeout`).
async fn follow_change(
    client: &Client,
    command: &str,
    run_start: Instant,
    timeout: Duration,
) -> anyhow::Result<ChangeFigures> {
    let deadline = Instant::now() + timeout;
    let poll = || async {
        loop {
            match client.cluster_status().await {
                Ok(status) => return Ok(Poll::of(&status)),
                Err(error) if Instant::now() < deadline => {
                    tracing::warn!(%error, "cluster status failed; asking again");
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
                Err(error) => {
                    anyhow::bail!("no cluster status within {timeout:?} of {command:?}: {error}")
                }
            }
        }
    };
    let mut tracker = ChangeTracker::new(run_start.elapsed(), poll().await?);
    // A change given up on is not left running.
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", command])
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot run {command:?}"))?;
    let mut exited = None;
    loop {
        tokio::time::sleep(POLL_INTERVAL).await;
        if exited.is_none() {
            exited = child.try_wait()?;
        }
        let settled = tracker.observe(run_start.elapsed(), poll().await?);
        match exited {
            Some(status) if !status.success() => {
                anyhow::bail!("{command:?} failed: {status}")
            }
            Some(_) if settled => return Ok(tracker.figures()),
            _ if Instant::now() >= deadline => {
                anyhow::bail!("the shards did not settle within {timeout:?} of {command:?}")
            }
            _ => {}
        }
    }
}

/// Jain's index over each producer's first deliveries in each whole second
/// of the `seconds` from `from_s`, least first. Every producer that had a
/// delivery at all in the run counts, with 0 where it had none in a second.
fn jain_per_second(received: &[Received], from_s: f64, seconds: u64) -> Vec<f64> {
    let producers: BTreeSet<&str> = received
        .iter()
        .map(|delivery| delivery.producer.as_str())
        .collect();
    let mut indexes: Vec<f64> = (0..seconds)
        .map(|second| {
            let start = from_s + second as f64;
            let mut counts: BTreeMap<&str, f64> = producers.iter().map(|&p| (p, 0.0)).collect();
            for delivery in received.iter().filter(|delivery| {
                delivery.attempt == 1 && (start..start + 1.0).contains(&delivery.at.as_secs_f64())
            }) {
                *counts.entry(delivery.producer.as_str()).or_default() += 1.0;
            }
            jain(&counts.into_values().collect::<Vec<f64>>())
        })
        .collect();
    indexes.sort_by(f64::total_cmp);
    indexes
}

fn print_report(report: &MovesReport) {
    println!(
        "steady: {:.0} msg/s acknowledged before the first change ({} failed produce calls)",
        report.steady_rate, report.failed_produce_calls
    );
    if let Some(failure) = &report.first_produce_failure {
        println!("  first failed produce call: {failure}");
    }
    for change in &report.changes {
        let figures = &change.figures;
        let moves = &figures.shard_move_seconds;
        let median = moves.get(moves.len() / 2).copied().unwrap_or(0.0);
        let longest = moves.last().copied().unwrap_or(0.0);
        println!(
            "{}: members {:?} -> {:?}, settled in {:.1} s",
            change.command, figures.members_before, figures.members_after, change.seconds
        );
        println!(
            "  shards moved {}/{}; replicas copied {:.2}, stored bytes copied {:.2} ({:.1} MB) against the least possible {:.2}",
            figures.shards_moved,
            figures.shards,
            figures.replicas_copied_share,
            figures.bytes_copied_share,
            figures.bytes_copied as f64 / 1e6,
            figures.ideal_share
        );
        println!(
            "  shard moves: median {median:.1} s, longest {longest:.1} s; produce {:.0} msg/s meanwhile, {:.0} msg/s once settled ({:.2} of that)",
            change.produce_rate,
            change.produce_rate_after,
            change.produce_rate / change.produce_rate_after.max(f64::EPSILON)
        );
        if let (Some(median), Some(least)) = (change.jain_after_median, change.jain_after_min) {
            println!(
                "  fairness once settled: Jain's index per second over the producers' deliveries, median {median:.3}, least {least:.3}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(producer: &str, at: f64) -> Received {
        Received {
            producer: producer.into(),
            attempt: 1,
            at: Duration::from_secs_f64(at),
            produced_at: None,
            bytes: 1,
        }
    }

    #[test]
    fn a_producer_with_no_delivery_in_a_second_pulls_that_seconds_fairness_down() {
        let received = vec![
            delivery("a", 10.1),
            delivery("b", 10.2),
            delivery("a", 11.1),
            delivery("a", 11.5),
            delivery("b", 3.0),
        ];
        let indexes = jain_per_second(&received, 10.0, 2);
        assert_eq!(indexes.len(), 2);
        assert!((indexes[0] - 0.5).abs() < 1e-9, "{indexes:?}");
        assert!((indexes[1] - 1.0).abs() < 1e-9, "{indexes:?}");
    }
}
