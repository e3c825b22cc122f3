//! `floret bench`: scenarios that show what a cluster does for fairness and
//! throughput, run against any floret (a `floret dev`, a deployed cluster).
//!
//! - `noisy-neighbor` ([`noisy`]): flooders and quiet producers through a
//!   capped shared sink; latency per group and fairness per window.
//! - `throughput` ([`throughput`]): produce and consume rates and produce
//!   latency for a given load.
//! - `scale` ([`scale`]): many producers with small backlogs; dispatch rate
//!   and node memory as the producer count grows.
//! - `moves` ([`moves`]): changes of members under load; what each moves,
//!   how long the shards' moves take, and the produce rate meanwhile.
//! - [`load`]: the produce load generator that `throughput`, `scale` and
//!   `floret produce --count` drive.
//!
//! Each prints a summary, writes `--json FILE` and `--plot FILE.svg` (its
//! rates and latencies or memory over time), and shows a live progress
//! line on stderr.
//!
//! IMPLEMENTATION CAVEATS
//! - Latency is measured in this process (produce call start to arrival at
//!   a consumer), so the client's own scheduling is part of it.
//! - Fairness assumes every producer has weight 1.

pub(crate) mod load;
mod moves;
mod noisy;
mod plot;
mod progress;
mod pushed;
mod scale;
mod sink;
mod stats;
mod throughput;

use std::path::{Path, PathBuf};

use clap::Subcommand;

pub use sink::Counters;
pub use stats::Percentiles;

use crate::DEFAULT_ADDRESS;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// One (or more) producers flood while quiet ones send a message every
    /// 50 ms, through a shared sink of limited capacity.
    NoisyNeighbor(noisy::NoisyArgs),
    /// Produce (and consume) as fast as the cluster takes it.
    Throughput(throughput::ThroughputArgs),
    /// Many producers, each with a small backlog.
    Scale(scale::ScaleArgs),
    /// Changes of members (shell commands) under a produce load: data
    /// moved, time per shard move, and the produce rate meanwhile.
    Moves(moves::MovesArgs),
}

/// Where a scenario runs and where its results go.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Nodes, comma separated: producers spread calls over all of them and
    /// consumers connect to them in turn.
    #[arg(long, default_value = DEFAULT_ADDRESS)]
    addr: String,
    /// Queue to use; by default a new queue per run, so that no backlog of
    /// an earlier run takes a share of the sink.
    #[arg(long)]
    queue: Option<String>,
    /// Write the results as JSON to this file (`-` for stdout).
    #[arg(long)]
    json: Option<PathBuf>,
}

impl CommonArgs {
    fn addresses(&self) -> anyhow::Result<Vec<String>> {
        let addresses: Vec<String> = self
            .addr
            .split(',')
            .map(str::trim)
            .filter(|address| !address.is_empty())
            .map(str::to_owned)
            .collect();
        anyhow::ensure!(!addresses.is_empty(), "--addr names no node");
        Ok(addresses)
    }

    /// The queue of a run tagged `run_tag` (see [`run_tag`]).
    fn queue(&self, run_tag: &str) -> String {
        self.queue
            .clone()
            .unwrap_or_else(|| format!("bench-{}", run_tag.trim_end_matches('-')))
    }

    /// Writes `report` where `--json` says, if it says.
    fn write_json(&self, report: &impl serde::Serialize) -> anyhow::Result<()> {
        let Some(path) = &self.json else {
            return Ok(());
        };
        let text = serde_json::to_string_pretty(report)?;
        if path == Path::new("-") {
            println!("{text}");
        } else {
            std::fs::write(path, text + "\n")?;
        }
        Ok(())
    }
}

/// A prefix for the producer ids of one run, so that its sink counts only
/// its own messages even on a queue that holds others (an earlier run's
/// leftovers, real traffic).
fn run_tag(scenario: &str) -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    format!("{scenario}-{millis:x}-")
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.scenario {
        Scenario::NoisyNeighbor(args) => noisy::run(args).await,
        Scenario::Throughput(args) => throughput::run(args).await,
        Scenario::Scale(args) => scale::run(args).await,
        Scenario::Moves(args) => moves::run(args).await,
    }
}

/// The time stamp a benchmark message carries at the front of its payload:
/// when its produce call started, from the start of the run.
mod stamp {
    use std::time::Duration;

    /// Marks a payload as stamped by `floret bench`.
    const MAGIC: &[u8; 4] = b"flbt";
    /// Magic plus microseconds as a little-endian u64.
    pub const LEN: usize = 12;

    /// A payload of `size` bytes (at least [`LEN`]) stamped with `at`.
    pub fn payload(at: Duration, size: usize) -> Vec<u8> {
        let mut payload = Vec::with_capacity(size.max(LEN));
        payload.extend_from_slice(MAGIC);
        payload.extend_from_slice(&(at.as_micros() as u64).to_le_bytes());
        payload.resize(size.max(LEN), b'x');
        payload
    }

    /// The stamp of a payload, if it has one.
    pub fn read(payload: &[u8]) -> Option<Duration> {
        let micros = payload.strip_prefix(MAGIC)?.get(..8)?;
        Some(Duration::from_micros(u64::from_le_bytes(
            micros.try_into().ok()?,
        )))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn stamp_survives_the_payload_and_pads_it_to_size() {
            let at = Duration::from_micros(1_234_567);
            let payload = payload(at, 128);
            assert_eq!(payload.len(), 128);
            assert_eq!(read(&payload), Some(at));
            assert_eq!(read(b"hello, not stamped"), None);
        }
    }
}
