//! One chaos run: a fresh three-node cluster, the workload, some rounds of
//! one schedule, then heal, drain, compare replica digests and check the
//! history.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use floret_client::Client;
use serde::Serialize;

use crate::checker::{Report, check};
use crate::cluster::{Cluster, ClusterSpec};
use crate::history::{Event, Recorder};
use crate::schedule::Schedule;
use crate::workload::{QUEUE, Workload, WorkloadSpec};

/// How long the drain may take once every node is back.
const DRAIN_DEADLINE: Duration = Duration::from_secs(90);
/// How long replicas may take to apply the same entries after the drain.
const DIGEST_DEADLINE: Duration = Duration::from_secs(30);
/// How long leaderships a fault moved may take to be handed back; the
/// round counts as healed only then (a hand-back pauses its shard).
const LEADERSHIP_RETURN_DEADLINE: Duration = Duration::from_secs(30);

/// What to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The schedule.
    pub schedule: Schedule,
    /// Faults to inject.
    pub rounds: u32,
    /// The `floret` binary (built with the `failpoints` feature for the
    /// schedules that use fault points).
    pub binary: PathBuf,
    /// A fresh directory for data dirs, logs and the history.
    pub root: PathBuf,
    /// Producers, payload, consumer cap.
    pub workload: WorkloadSpec,
    /// `FAILPOINTS` every node starts with (for negative controls).
    pub start_failpoints: String,
    /// Load before the first fault and after each heal.
    pub load_between_faults: Duration,
    /// Run the cluster over TLS and mutual TLS.
    pub tls: bool,
    /// Cut every node's gossip for the whole run.
    pub gossip_cut: bool,
    /// Give the nodes token keys, and produce as this many tenants (none:
    /// no tokens, one anonymous tenant).
    pub tenants: Option<u32>,
}

/// What a run found.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// The schedule's name.
    pub schedule: &'static str,
    /// Rounds run.
    pub rounds: u32,
    /// The checker's report on the history.
    pub report: Report,
    /// Shards whose replicas differ after the drain.
    pub digest_mismatches: Vec<String>,
    /// Whether the drain finished before its deadline.
    pub drained: bool,
    /// Expectations of the schedule that failed (a node serving on a
    /// corrupt log, a fault that could not be injected).
    pub schedule_failures: Vec<String>,
    /// What the schedule saw along the way.
    pub observations: Vec<String>,
    /// Bytes of unsynced raft log the power-loss emulation dropped.
    pub power_loss_dropped_bytes: u64,
    /// Wall time of the run.
    pub seconds: f64,
}

impl RunResult {
    /// Every problem: checker violations, differing replicas, an unfinished
    /// drain, failed schedule expectations. Empty when the run passed.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.report.violations();
        problems.extend(
            self.digest_mismatches
                .iter()
                .map(|m| format!("replicas differ: {m}")),
        );
        if !self.drained {
            problems.push(format!(
                "the drain did not finish within {DRAIN_DEADLINE:?}"
            ));
        }
        problems.extend(self.schedule_failures.iter().cloned());
        problems
    }
}

/// Runs `spec` to the end; errors only when the cluster cannot be started
/// or brought back (the history is kept in `spec.root` either way).
pub async fn run(spec: RunSpec) -> anyhow::Result<RunResult> {
    let started = Instant::now();
    let mut cluster = Cluster::start(ClusterSpec {
        binary: spec.binary.clone(),
        root: spec.root.clone(),
        size: 3,
        config: spec.schedule.config(),
        start_failpoints: spec.start_failpoints.clone(),
        tls: spec.tls,
        gossip_cut: spec.gossip_cut,
        tenants: spec.tenants.is_some(),
    })
    .await?;
    let recorder = Recorder::new();
    let consumer_addresses: Vec<String> =
        cluster.addresses().split(',').map(str::to_owned).collect();
    let mut workload = Workload::start(
        spec.workload.clone(),
        recorder.clone(),
        &cluster.addresses(),
        &consumer_addresses,
        cluster.client_tls(),
        match spec.tenants {
            Some(tenants) => cluster.workload_tokens(tenants)?,
            None => None,
        },
    )?;
    let mut observations = Vec::new();
    let mut schedule_failures = Vec::new();
    for round in 0..spec.rounds {
        tokio::time::sleep(spec.load_between_faults).await;
        recorder.record(Event::Fault {
            what: format!("round {round} begins"),
            leader_loss: false,
        });
        match spec
            .schedule
            .inject(round, &mut cluster, &mut workload, &recorder)
            .await
        {
            Ok(seen) => observations.extend(seen),
            Err(error) => {
                schedule_failures.push(format!("round {round}: {error:#}"));
                cluster.heal().await?;
            }
        }
        if !cluster
            .wait_for_preferred_leaders(LEADERSHIP_RETURN_DEADLINE)
            .await
        {
            observations.push(format!(
                "round {round}: leadership not back at the preferred replicas within {LEADERSHIP_RETURN_DEADLINE:?}"
            ));
        }
        recorder.record(Event::Healed);
    }
    tokio::time::sleep(spec.load_between_faults).await;
    workload.stop_producing().await;
    cluster.heal().await?;
    let stats = cluster.client_of(&cluster.addresses())?;
    let drained = workload
        .drain(DRAIN_DEADLINE, || holds_nothing(&stats))
        .await;
    if !drained {
        schedule_failures.push(format!(
            "after the drain the cluster reports {}",
            describe_stats(&stats).await
        ));
    }
    let digest_mismatches = cluster.digest_mismatches(DIGEST_DEADLINE).await?;
    let (report, lines) = recorder.read(|history| {
        let lines: Vec<String> = history
            .iter()
            .filter_map(|r| serde_json::to_string(r).ok())
            .collect();
        (check(history), lines)
    });
    std::fs::write(spec.root.join("history.jsonl"), lines.join("\n"))?;
    let power_loss_dropped_bytes = cluster
        .ids()
        .into_iter()
        .map(|id| power_loss_dropped_bytes(&cluster.log_path(id)))
        .sum();
    Ok(RunResult {
        schedule: spec.schedule.name(),
        rounds: spec.rounds,
        report,
        digest_mismatches,
        drained,
        schedule_failures,
        observations,
        power_loss_dropped_bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Whether the cluster reports no stored message of the workload's queue.
async fn holds_nothing(client: &Client) -> bool {
    match client.queue_stats(QUEUE).await {
        Ok(stats) => stats
            .queues
            .iter()
            .all(|q| q.backlog_messages == 0 && q.in_flight == 0),
        Err(_) => false,
    }
}

/// The queue's backlog and leases as the cluster reports them, for a failed drain.
async fn describe_stats(client: &Client) -> String {
    match client.queue_stats(QUEUE).await {
        Ok(stats) => stats
            .queues
            .iter()
            .map(|q| {
                let producers: Vec<String> = q
                    .producers
                    .iter()
                    .filter(|p| p.backlog_messages > 0 || p.in_flight > 0)
                    .map(|p| {
                        format!(
                            "{} (backlog {}, in flight {}, ready {}, led {})",
                            p.producer_id, p.backlog_messages, p.in_flight, p.ready, p.led
                        )
                    })
                    .collect();
                format!(
                    "backlog {}, in flight {}: {}",
                    q.backlog_messages,
                    q.in_flight,
                    producers.join(", ")
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        Err(error) => format!("no stats ({error})"),
    }
}

/// Sums `dropped_log_bytes=N` over the power-loss lines of a node's log
/// (its colour codes removed).
fn power_loss_dropped_bytes(log: &std::path::Path) -> u64 {
    let plain = crate::cluster::strip_colours(&std::fs::read_to_string(log).unwrap_or_default());
    plain
        .lines()
        .filter(|line| line.contains("emulated power loss"))
        .filter_map(|line| {
            let (_, rest) = line.split_once("dropped_log_bytes=")?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}
