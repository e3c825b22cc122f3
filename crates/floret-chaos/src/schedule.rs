//! The named fault schedules. A schedule injects one fault per round into
//! a cluster under load and heals it; [`crate::run`] runs the rounds,
//! drains and checks.

use std::time::Duration;

use anyhow::{Context, bail};

use crate::cluster::{Cluster, FULL_VIEW_DEADLINE, NodeId, flip_bit};
use crate::history::{Event, Recorder};
use crate::process::poll;
use crate::workload::Workload;

mod membership;

use membership::change_members;

/// How long a paused or partitioned leader stays so: beyond the leader
/// lease plus the longest election timeout, so the others elect.
const DEPOSE_HOLD: Duration = Duration::from_secs(5);
/// How long a node stopped with SIGTERM may take to exit (its drain is
/// bounded by `shutdown.drain_timeout_ms`, 20 s by default).
const STOP_DEADLINE: Duration = Duration::from_secs(30);
/// How long two killed nodes stay down.
const MAJORITY_DOWN_HOLD: Duration = Duration::from_secs(3);
/// How long a node started with a fault point may take to hit it.
const FAULT_POINT_DEADLINE: Duration = Duration::from_secs(20);
/// How long shards may go without a reachable leader.
const LEADER_DEADLINE: Duration = Duration::from_secs(30);
/// How long a wiped or damaged node may take to catch up again (an
/// operator waits for that before touching another node).
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(60);
/// How long after gossip is cut every node must warn of it: the warning
/// comes 10 s after the last member was heard, checked every 2 s.
const GOSSIP_WARNING_DEADLINE: Duration = Duration::from_secs(25);
/// The shard whose leader the leader faults target.
const TARGET_SHARD: u32 = 0;

/// The crash points a [`Schedule::CrashAtFaultPoints`] round cycles through,
/// with how often each fires.
const CRASH_POINTS: [(&str, &str); 3] = [
    ("wal-after-append", "3%return"),
    ("proposer-before-reply", "3%return"),
    ("apply-mid-batch", "10%return"),
];

/// One kind of fault, injected once per round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// SIGKILL of the leader of shard 0; restart once another leads it.
    KillLeader,
    /// SIGKILL of a node picked at random; restart.
    KillRandom,
    /// SIGSTOP of the leader past the election timeout, then SIGCONT.
    PauseLeader,
    /// SIGKILL of the leader and one other node at once; restart both.
    KillTwo,
    /// The leader cut off from both others, both ways; heal.
    PartitionLeader,
    /// The leader cannot reach the others, they can reach it; heal.
    PartitionOneWay,
    /// A consumer killed while it holds leases and unsent acks.
    KillConsumer,
    /// A node killed, its data dir deleted, restarted empty.
    WipeNode,
    /// A node killed and restarted on a damaged raft log: a flipped bit
    /// (it must refuse to start; then it is wiped and resyncs) or a cut-off
    /// tail (it must start and resync).
    CorruptLog,
    /// The leader restarted with a crash point armed (after the log append
    /// before the sync, after commit before the reply, in the middle of an
    /// apply); restarted clean once it crashed.
    CrashAtFaultPoints,
    /// Every node killed at once and restarted as after a power failure:
    /// what was written and never synced is gone.
    PowerLoss,
    /// Every node's gossip datagrams dropped (TCP untouched) past the
    /// silence warning, which the nodes must give; healed, the view must
    /// become complete again.
    CutGossip,
    /// Every node stopped with SIGTERM (it hands the shards it leads to
    /// other replicas and drains) and started again, one after another.
    RollingRestart,
    /// A new node added (`floret cluster add-node`, then started with
    /// `--join`), then a member other than node 1 taken out. On even rounds
    /// that member is paused past the election timeout while the shards
    /// move to the new node, and once they settled, removed alive and
    /// stopped after it left. On odd rounds it is killed while the shards
    /// still move, its data dir wiped, and replaced by another new node in
    /// its seat (`floret cluster replace-node`).
    MembershipChange,
}

impl Schedule {
    /// Every schedule.
    pub const ALL: [Schedule; 14] = [
        Schedule::KillLeader,
        Schedule::KillRandom,
        Schedule::PauseLeader,
        Schedule::KillTwo,
        Schedule::PartitionLeader,
        Schedule::PartitionOneWay,
        Schedule::KillConsumer,
        Schedule::WipeNode,
        Schedule::CorruptLog,
        Schedule::CrashAtFaultPoints,
        Schedule::PowerLoss,
        Schedule::CutGossip,
        Schedule::RollingRestart,
        Schedule::MembershipChange,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::KillLeader => "kill-leader",
            Schedule::KillRandom => "kill-random",
            Schedule::PauseLeader => "pause-leader",
            Schedule::KillTwo => "kill-two",
            Schedule::PartitionLeader => "partition-leader",
            Schedule::PartitionOneWay => "partition-one-way",
            Schedule::KillConsumer => "kill-consumer",
            Schedule::WipeNode => "wipe-node",
            Schedule::CorruptLog => "corrupt-log",
            Schedule::CrashAtFaultPoints => "crash-at-fault-points",
            Schedule::PowerLoss => "power-loss",
            Schedule::CutGossip => "cut-gossip",
            Schedule::RollingRestart => "rolling-restart",
            Schedule::MembershipChange => "membership-change",
        }
    }

    /// The schedule called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The nodes' configuration for this schedule. Leases are short so a
    /// killed consumer's messages come back quickly; snapshots are frequent
    /// so rejoining nodes install them, except under power loss, whose
    /// emulation needs a log that was never purged. Snapshots every 500
    /// entries and small log segments make every shard purge within a run,
    /// so that segments are sealed, kept for the messages that point into
    /// them and deleted while faults are injected.
    pub fn config(self) -> String {
        let snapshot_every = match self {
            Schedule::PowerLoss => 1_000_000_000,
            _ => 500,
        };
        format!(
            "[delivery]\nlease_timeout_ms = 3000\n\n[raft]\nsnapshot_every_entries = {snapshot_every}\nlogs_kept_after_snapshot = 200\n\n[storage]\nlog_segment_bytes = 262144\n"
        )
    }

    /// Injects this schedule's fault for round `round` and heals it.
    /// Returns what it observed; an error is a failed expectation.
    pub async fn inject(
        self,
        round: u32,
        cluster: &mut Cluster,
        workload: &mut Workload,
        recorder: &Recorder,
    ) -> anyhow::Result<Vec<String>> {
        let fault = |what: String, leader_loss: bool| {
            recorder.record(Event::Fault { what, leader_loss });
        };
        let mut observed = Vec::new();
        let leader = leader(cluster).await?;
        let others: Vec<NodeId> = cluster.ids().into_iter().filter(|&n| n != leader).collect();
        let random = |salt: u64| {
            let ids = cluster.ids();
            ids[(mix(u64::from(round) ^ salt) % ids.len() as u64) as usize]
        };
        match self {
            Schedule::KillLeader => {
                fault(format!("kill leader {leader}"), true);
                cluster.kill(leader).await;
                let next = cluster
                    .leader_of(TARGET_SHARD, LEADER_DEADLINE)
                    .await
                    .context("no new leader after killing the old one")?;
                observed.push(format!("node {next} took over from {leader}"));
                cluster.restart(leader, "").await?;
                recorder.record(Event::Restarted { node: leader });
            }
            Schedule::KillRandom => {
                let victim = random(1);
                fault(format!("kill node {victim}"), true);
                cluster.kill(victim).await;
                wait_for_leader(cluster).await?;
                cluster.restart(victim, "").await?;
                recorder.record(Event::Restarted { node: victim });
            }
            Schedule::RollingRestart => {
                for node in cluster.ids() {
                    fault(
                        format!("stop node {node} (SIGTERM) and start it again"),
                        true,
                    );
                    let took = cluster.stop(node, STOP_DEADLINE).await?;
                    observed.push(format!("node {node} stopped in {} ms", took.as_millis()));
                    cluster.restart(node, "").await?;
                    recorder.record(Event::Restarted { node });
                    wait_for_leader(cluster).await?;
                }
            }
            Schedule::PauseLeader => {
                fault(format!("pause leader {leader}"), true);
                cluster.set_paused(leader, true).await?;
                tokio::time::sleep(DEPOSE_HOLD).await;
                cluster.set_paused(leader, false).await?;
            }
            Schedule::KillTwo => {
                let second = others[(round as usize) % others.len()];
                fault(format!("kill nodes {leader} and {second}"), true);
                cluster.kill(leader).await;
                cluster.kill(second).await;
                tokio::time::sleep(MAJORITY_DOWN_HOLD).await;
                cluster.restart_all(&[leader, second], "").await?;
                for node in [leader, second] {
                    recorder.record(Event::Restarted { node });
                }
            }
            Schedule::PartitionLeader => {
                fault(format!("isolate leader {leader}"), true);
                cluster.isolate(leader);
                tokio::time::sleep(DEPOSE_HOLD).await;
            }
            Schedule::PartitionOneWay => {
                fault(format!("cut leader {leader} -> others"), true);
                for &other in &others {
                    cluster.set_cut(leader, other, true);
                }
                tokio::time::sleep(DEPOSE_HOLD).await;
            }
            Schedule::KillConsumer => {
                let index = round as usize % workload.consumer_count();
                fault(format!("kill consumer {index}"), false);
                workload.kill_consumer(index).await?;
            }
            Schedule::WipeNode => {
                let victim = random(2);
                fault(format!("wipe node {victim}"), victim == leader);
                cluster.kill(victim).await;
                cluster.wipe(victim)?;
                cluster.restart(victim, "").await?;
                cluster.wait_caught_up(victim, CATCH_UP_DEADLINE).await?;
            }
            Schedule::CorruptLog => {
                let victim = random(3);
                fault(format!("damage the log of node {victim}"), victim == leader);
                cluster.kill(victim).await;
                observed.push(damage_log(cluster, victim, round).await?);
                cluster.wait_caught_up(victim, CATCH_UP_DEADLINE).await?;
            }
            Schedule::CrashAtFaultPoints => {
                let (point, action) = CRASH_POINTS[round as usize % CRASH_POINTS.len()];
                fault(format!("restart leader {leader} with {point}"), true);
                cluster
                    .start_armed(leader, &format!("{point}={action}"))
                    .await?;
                let crashed = cluster.wait_for_exit(leader, FAULT_POINT_DEADLINE).await;
                fault(
                    format!("node {leader} crashed at {point}: {crashed}"),
                    false,
                );
                observed.push(if crashed {
                    format!("node {leader} crashed at {point}")
                } else {
                    format!("{point} did not fire on node {leader} within {FAULT_POINT_DEADLINE:?}")
                });
                cluster.restart(leader, "").await?;
            }
            Schedule::PowerLoss => {
                fault("power loss of every node".into(), true);
                let every_node = cluster.ids();
                cluster
                    .restart_all(&every_node, "power-loss-on-open=return")
                    .await?;
            }
            Schedule::MembershipChange => {
                observed.extend(change_members(round, cluster, &fault).await?);
            }
            Schedule::CutGossip => {
                fault("cut every node's gossip".into(), false);
                cluster.set_gossip_cut(true)?;
                let cut_at = tokio::time::Instant::now();
                let every_node = cluster.serving();
                let warned = poll(
                    GOSSIP_WARNING_DEADLINE,
                    Duration::from_millis(500),
                    || async {
                        let warning = cluster.warning_of_gossip_silence().await;
                        (warning == every_node).then_some(())
                    },
                )
                .await;
                if warned.is_none() {
                    bail!(
                        "nodes {:?} of {every_node:?} warned that they hear no gossip {GOSSIP_WARNING_DEADLINE:?} after it was cut",
                        cluster.warning_of_gossip_silence().await
                    );
                }
                observed.push(format!(
                    "nodes {every_node:?} warned that they hear no gossip {:.1} s after it was cut",
                    cut_at.elapsed().as_secs_f64()
                ));
                if !cluster.gossip_cut_throughout() {
                    cluster.set_gossip_cut(false)?;
                    cluster.wait_for_full_view(FULL_VIEW_DEADLINE).await?;
                }
            }
        }
        cluster.heal().await?;
        wait_for_leader(cluster).await?;
        Ok(observed)
    }
}

/// The leader of the target shard (an error when none is reachable).
async fn leader(cluster: &Cluster) -> anyhow::Result<NodeId> {
    cluster
        .leader_of(TARGET_SHARD, LEADER_DEADLINE)
        .await
        .with_context(|| format!("shard {TARGET_SHARD} has no reachable leader"))
}

async fn wait_for_leader(cluster: &Cluster) -> anyhow::Result<()> {
    leader(cluster).await.map(|_| ())
}

/// Damages node `victim`'s raft log (down) and restarts it; even rounds
/// flip a bit inside the oldest segment, odd rounds cut off its newest
/// segment's tail. Returns what happened. A bit is flipped only in a
/// sealed segment: in the last frame of the active one, damage cannot be
/// told from a torn write, and the log rightly cuts it off.
async fn damage_log(cluster: &mut Cluster, victim: NodeId, round: u32) -> anyhow::Result<String> {
    let segments = cluster.log_segments(victim)?;
    let (Some(oldest), Some(newest)) = (segments.first(), segments.last()) else {
        bail!("node {victim} has no raft log segment");
    };
    let oldest_len = std::fs::metadata(oldest)?.len();
    let oldest_is_sealed = segments.len() >= 2;
    if round.is_multiple_of(2) && oldest_is_sealed && oldest_len > 64 * 1024 {
        flip_bit(oldest, oldest_len / 2)?;
        let log_before = std::fs::metadata(cluster.log_path(victim))?.len();
        let exit = cluster
            .start_expecting_exit(victim, Duration::from_secs(20))
            .await?;
        let log = std::fs::read_to_string(cluster.log_path(victim))?;
        let said = log
            .get(log_before as usize..)
            .unwrap_or_default()
            .lines()
            .find(|line| line.contains("corrupt"))
            .map(str::to_owned);
        match (exit, said) {
            (Some(status), Some(line)) if !status.success() => {
                cluster.wipe(victim)?;
                cluster.restart(victim, "").await?;
                Ok(format!(
                    "node {victim} refused a bit-flipped log ({line}); wiped, it resynced"
                ))
            }
            (exit, said) => bail!(
                "node {victim} on a bit-flipped log: exit {exit:?}, error line {said:?}; it must refuse to start"
            ),
        }
    } else {
        let newest_len = std::fs::metadata(newest)?.len();
        let cut = newest_len.min(100);
        std::fs::OpenOptions::new()
            .write(true)
            .open(newest)?
            .set_len(newest_len - cut)?;
        cluster.restart(victim, "").await?;
        Ok(format!(
            "node {victim} started on a log missing its last {cut} bytes"
        ))
    }
}

/// A well-mixed 64-bit value (splitmix64) for picking nodes by round.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
