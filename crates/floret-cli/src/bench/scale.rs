//! `floret bench scale`: for each count in `--producers`, that many new
//! producers each get `--backlog` messages; then the backlog is consumed
//! uncapped. Reports the fill and dispatch rates and each node's resident
//! memory before the fill, with the backlog, and after the drain, from the
//! nodes' own status (`NodeStatus.resident_bytes`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use floret_client::Client;
use tokio::sync::watch;

use super::CommonArgs;
use super::progress::Progress;
use super::sink::{Counters, Sink, SinkSpec};
use crate::load::{self, LoadSpec};

const MIB: f64 = 1024.0 * 1024.0;

#[derive(clap::Args, Debug, Clone)]
pub struct ScaleArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Producer counts to step through, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    producers: Vec<usize>,
    /// Messages each producer gets (sent as one produce call).
    #[arg(long, default_value_t = 2)]
    backlog: usize,
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
    let client = Client::connect_lazy(&args.common.addr)?;
    let mut steps = Vec::new();
    for &producers in &args.producers {
        let step = run_step(&args, &client, producers).await?;
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
    args.common
        .write_json(&serde_json::json!({"scenario": "scale", "steps": steps}))
}

async fn run_step(
    args: &ScaleArgs,
    client: &Client,
    producers: usize,
) -> anyhow::Result<ScaleStep> {
    let before = resident_bytes(client).await?;
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
            batch: args.backlog.max(1),
            concurrency: args.concurrency.max(1),
            idempotent: false,
            deadline: None,
            counters: counters.clone(),
        },
    )
    .await?;
    let backlogged = resident_bytes(client).await?;
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
    let drained = resident_bytes(client).await?;
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

/// Each reachable node's resident memory, by node id.
async fn resident_bytes(client: &Client) -> anyhow::Result<BTreeMap<u64, u64>> {
    let status = client
        .cluster_status()
        .await
        .context("cannot read the cluster's status for node memory")?;
    Ok(status
        .nodes
        .iter()
        .filter(|node| node.reachable)
        .map(|node| (node.node_id, node.resident_bytes))
        .collect())
}
