//! `floret bench scale`: for each count in `--producers`, that many new
//! producers each get `--backlog` messages; then the backlog is consumed
//! uncapped. Reports the fill and dispatch rates and each node's resident
//! memory before the fill, with the backlog, and after the drain, from the
//! nodes' own status (`NodeStatus.resident_bytes`). `--plot` draws the fill
//! and drain rates and those memory readings over the whole run.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use floret_client::Client;
use tokio::sync::watch;

use super::CommonArgs;
use super::load::{self, LoadSpec};
use super::plot::{self, Chart, Series};
use super::progress::Progress;
use super::sink::{Counters, Sink, SinkSpec};
use super::stats::per_second;

const MIB: f64 = 1024.0 * 1024.0;

#[derive(clap::Args, Debug, Clone)]
pub struct ScaleArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Producer counts to step through, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    producers: Vec<usize>,
    /// Messages each producer gets.
    #[arg(long, default_value_t = 2)]
    backlog: usize,
    /// Messages per produce call while filling (at most the backlog). A
    /// larger call holds more memory in flight on every node while it is
    /// decoded and logged, which is not what this benchmark measures.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 128)]
    size: usize,
    /// Produce calls in flight while filling.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Consumers draining the backlog.
    #[arg(long, default_value_t = 3)]
    consumers: usize,
    /// Credits each consumer keeps granted.
    #[arg(long, default_value_t = 1_000)]
    credits: u32,
    /// Give up draining a step after this long.
    #[arg(long, default_value_t = 1_800)]
    timeout_s: u64,
    /// Draw the fill and drain rates and node memory over the whole run.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
}

/// What happened when, over every step, for `--plot`.
#[derive(Default)]
struct Timeline {
    /// Answer time and message count of every fill call.
    produced: Vec<(Instant, u64)>,
    /// Arrival of every delivery.
    delivered: Vec<Instant>,
    /// Each reading of the nodes' resident bytes, by node id.
    resident: Vec<(Instant, BTreeMap<u64, u64>)>,
}

#[derive(serde::Serialize)]
struct ScaleStep {
    producers: usize,
    messages: u64,
    fill_rate: f64,
    dispatch_rate: f64,
    delivered: u64,
    /// Per node id: resident MiB before the fill, with the backlog, after the drain.
    resident_mib: BTreeMap<u64, [f64; 3]>,
    /// The largest growth of one node's resident memory from before the fill
    /// to the full backlog, per backlogged producer.
    max_growth_bytes_per_producer: f64,
}

pub async fn run(args: ScaleArgs) -> anyhow::Result<()> {
    let client = crate::dial(&args.common.addr)?;
    let run_start = Instant::now();
    let mut timeline = Timeline::default();
    let mut steps = Vec::new();
    for &producers in &args.producers {
        let step = run_step(&args, &client, producers, &mut timeline).await?;
        println!(
            "{:>9} producers, {:>9} messages: fill {:>7.0} msg/s, dispatch {:>7.0} msg/s, max node growth {:>6.0} B/producer; resident MiB per node (before / backlogged / drained): {}",
            step.producers,
            step.messages,
            step.fill_rate,
            step.dispatch_rate,
            step.max_growth_bytes_per_producer,
            step.resident_mib
                .iter()
                .map(|(node, [before, full, after])| format!(
                    "{node}: {before:.0} / {full:.0} / {after:.0}"
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        steps.push(step);
    }
    if let Some(path) = &args.plot {
        plot::write_svg(path, &charts(run_start, &timeline))?;
        println!("plot written to {}", path.display());
    }
    args.common
        .write_json(&serde_json::json!({"scenario": "scale", "steps": steps}))
}

/// Messages per fill call: `batch`, at most the backlog, made a divisor of
/// it so that every producer gets exactly its backlog.
fn fill_batch(backlog: usize, batch: usize) -> usize {
    let backlog = backlog.max(1);
    (1..=batch.clamp(1, backlog))
        .rev()
        .find(|size| backlog.is_multiple_of(*size))
        .unwrap_or(1)
}

async fn run_step(
    args: &ScaleArgs,
    client: &Client,
    producers: usize,
    timeline: &mut Timeline,
) -> anyhow::Result<ScaleStep> {
    let before = resident_bytes(client, timeline).await?;
    let run_start = Instant::now();
    let counters = Arc::new(Counters::default());
    let messages = (producers * args.backlog.max(1)) as u64;
    let run_tag = super::run_tag(&format!("scale{producers}"));
    let queue = args.common.queue(&run_tag);
    let progress = Progress::start(run_start, counters.clone(), Some(messages));
    let fill = load::produce(
        client,
        &LoadSpec {
            queue: queue.clone(),
            producer_prefix: format!("{run_tag}producer"),
            count: messages,
            size: args.size,
            producers,
            batch: fill_batch(args.backlog, args.batch),
            concurrency: args.concurrency.max(1),
            idempotent: false,
            deadline: None,
            counters: counters.clone(),
        },
    )
    .await?;
    timeline
        .produced
        .extend(fill.calls.iter().map(|call| (call.answered, call.messages)));
    let backlogged = resident_bytes(client, timeline).await?;
    let (target, target_seen) = watch::channel(Some(fill.messages));
    let drain_start = Instant::now();
    let sink = Sink::start(
        &SinkSpec {
            addresses: args.common.addresses()?,
            queue: queue.clone(),
            run_tag,
            consumers: args.consumers.max(1),
            rate_cap: 0.0,
            credits: args.credits,
            ack_batch: 64,
        },
        drain_start,
        counters.clone(),
        target_seen,
    )?;
    let received = sink
        .finish_by(drain_start + Duration::from_secs(args.timeout_s))
        .await?;
    drop(target);
    progress.finish();
    let first: Vec<_> = received.iter().filter(|r| r.attempt == 1).collect();
    let drain_seconds = first
        .iter()
        .map(|r| r.at)
        .max()
        .unwrap_or_default()
        .as_secs_f64();
    timeline
        .delivered
        .extend(received.iter().map(|delivery| drain_start + delivery.at));
    let drained = resident_bytes(client, timeline).await?;
    let resident_mib = before
        .iter()
        .map(|(&node, &before)| {
            let at = |map: &BTreeMap<u64, u64>| map.get(&node).copied().unwrap_or(0) as f64 / MIB;
            (node, [before as f64 / MIB, at(&backlogged), at(&drained)])
        })
        .collect();
    let max_growth = before
        .iter()
        .map(|(node, &before)| {
            backlogged
                .get(node)
                .copied()
                .unwrap_or(0)
                .saturating_sub(before)
        })
        .max()
        .unwrap_or(0);
    Ok(ScaleStep {
        producers,
        messages: fill.messages,
        fill_rate: fill.rate(),
        dispatch_rate: first.len() as f64 / drain_seconds.max(f64::EPSILON),
        delivered: first.len() as u64,
        resident_mib,
        max_growth_bytes_per_producer: max_growth as f64 / producers.max(1) as f64,
    })
}

/// How long a status read for node memory is retried: the connection it
/// goes over sat idle through the fill, and a node may have closed it (a
/// 10,000,000-message fill once ended in a broken pipe here, with every
/// message in).
const STATUS_READ_RETRIES_FOR: Duration = Duration::from_secs(10);

/// Each reachable node's resident memory, by node id; the reading is also
/// kept in `timeline`.
async fn resident_bytes(
    client: &Client,
    timeline: &mut Timeline,
) -> anyhow::Result<BTreeMap<u64, u64>> {
    let give_up_at = Instant::now() + STATUS_READ_RETRIES_FOR;
    let status = loop {
        match client.cluster_status().await {
            Ok(status) => break status,
            Err(error) if Instant::now() < give_up_at => {
                tracing::debug!(%error, "status read for node memory failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => {
                return Err(error).context("cannot read the cluster's status for node memory");
            }
        }
    };
    let resident: BTreeMap<u64, u64> = status
        .nodes
        .iter()
        .filter(|node| node.reachable)
        .map(|node| (node.node_id, node.resident_bytes))
        .collect();
    timeline.resident.push((Instant::now(), resident.clone()));
    Ok(resident)
}

/// Fill and drain rates per second, and each node's resident memory at
/// every reading, over the whole run.
fn charts(run_start: Instant, timeline: &Timeline) -> Vec<Chart> {
    let seconds = |at: Instant| at.saturating_duration_since(run_start);
    let end = timeline
        .resident
        .last()
        .map(|(at, _)| seconds(*at))
        .unwrap_or_default();
    let nodes: std::collections::BTreeSet<u64> = timeline
        .resident
        .iter()
        .flat_map(|(_, resident)| resident.keys().copied())
        .collect();
    let memory_series = nodes
        .iter()
        .enumerate()
        .map(|(index, node)| Series {
            name: format!("node {node}"),
            colour: plot::QUIET_COLOURS[index % plot::QUIET_COLOURS.len()],
            points: timeline
                .resident
                .iter()
                .filter_map(|(at, resident)| {
                    let bytes = resident.get(node)?;
                    Some((seconds(*at).as_secs_f64(), *bytes as f64 / MIB))
                })
                .collect(),
        })
        .collect();
    vec![
        Chart {
            title: "messages per second: each step's fill, then its drain".into(),
            value_label: "messages/s".into(),
            logarithmic: false,
            series: vec![
                Series {
                    name: "produced".into(),
                    colour: plot::QUIET_COLOURS[0],
                    points: per_second(
                        timeline
                            .produced
                            .iter()
                            .map(|(at, messages)| (seconds(*at), *messages as f64)),
                        end,
                    ),
                },
                Series {
                    name: "delivered".into(),
                    colour: plot::FLOOD_COLOURS[0],
                    points: per_second(
                        timeline.delivered.iter().map(|at| (seconds(*at), 1.0)),
                        end,
                    ),
                },
            ],
        },
        Chart {
            title: "node resident memory before each fill, backlogged, drained".into(),
            value_label: "MiB".into(),
            logarithmic: false,
            series: memory_series,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::fill_batch;

    #[test]
    fn fill_calls_give_every_producer_exactly_its_backlog() {
        assert_eq!(fill_batch(2, 100), 2);
        assert_eq!(fill_batch(100, 100), 100);
        assert_eq!(fill_batch(1000, 100), 100);
        assert_eq!(fill_batch(150, 100), 75);
        assert_eq!(fill_batch(7, 5), 1);
        assert_eq!(fill_batch(0, 0), 1);
    }
}
