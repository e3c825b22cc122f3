//! The short chaos suite: every fault schedule of `floret-chaos` against
//! three real `floret serve` processes, a few rounds each, then a full
//! drain and the history checker: nothing acknowledged lost, nothing
//! unexpected or corrupted, first deliveries in order, replicas equal.
//! Plus the negative control (a node that drops applied entries must make
//! the checker report loss) and the fsync proof (an emulated power failure
//! loses nothing acknowledged, and loses everything once the log skips its
//! syncs).
//!
//! The fault points need `floret` built with `--features failpoints`
//! (`cargo test --workspace --all-features`, as CI runs it); without it
//! those tests are ignored. The long soak is `floret-chaos --minutes N`.

use std::time::Duration;

use floret_chaos::workload::WorkloadSpec;
use floret_chaos::{RunResult, RunSpec, Schedule, run};

/// One cluster at a time: two on two cores would starve each other's heartbeats.
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What a run should find: the suite's schedules must find nothing, the
/// negative controls must find loss.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    NoProblems,
    Loss,
}

/// Runs `schedule` in a temp dir, kept (and named on stderr) only when the
/// run did not find what `expect` says, so a failing test leaves its
/// history and node logs and a passing one leaves nothing.
async fn run_schedule(
    schedule: Schedule,
    rounds: u32,
    start_failpoints: &str,
    workload: WorkloadSpec,
    expect: Expect,
) -> RunResult {
    run_schedule_over(schedule, rounds, start_failpoints, workload, expect, false).await
}

/// [`run_schedule`], over TLS and mutual TLS when `tls` is set.
async fn run_schedule_over(
    schedule: Schedule,
    rounds: u32,
    start_failpoints: &str,
    workload: WorkloadSpec,
    expect: Expect,
    tls: bool,
) -> RunResult {
    let _alone = ONE_CLUSTER_AT_A_TIME.lock().await;
    let root = tempfile::tempdir().expect("temp dir");
    let result = run(RunSpec {
        schedule,
        rounds,
        binary: env!("CARGO_BIN_EXE_floret").into(),
        root: root.path().to_path_buf(),
        workload,
        start_failpoints: start_failpoints.to_owned(),
        load_between_faults: Duration::from_secs(1),
        tls,
        gossip_cut: false,
        tenants: None,
    })
    .await;
    let result = match result {
        Ok(result) => result,
        Err(error) => {
            let _kept = root.keep();
            panic!("{} could not run: {error:#}", schedule.name());
        }
    };
    eprintln!(
        "{}: {:.0} s, {} attempted, {} acknowledged, {} delivered, {} duplicated, {} recovered, unavailability {:?} ms, fairness {:?}; {:?}",
        result.schedule,
        result.seconds,
        result.report.attempted,
        result.report.acknowledged,
        result.report.delivered,
        result.report.duplicated,
        result.report.recovered,
        result.report.unavailability_ms,
        result.report.fairness,
        result.observations,
    );
    let as_expected = match expect {
        Expect::NoProblems => result.problems().is_empty(),
        Expect::Loss => !result.report.lost.is_empty(),
    };
    if !as_expected {
        eprintln!("history and node logs kept in {}", root.keep().display());
    }
    result
}

async fn passes(schedule: Schedule, rounds: u32) {
    passes_over(schedule, rounds, false).await;
}

/// [`passes`], over TLS and mutual TLS when `tls` is set.
async fn passes_over(schedule: Schedule, rounds: u32, tls: bool) {
    let result = run_schedule_over(
        schedule,
        rounds,
        "",
        WorkloadSpec::default(),
        Expect::NoProblems,
        tls,
    )
    .await;
    assert!(
        result.problems().is_empty(),
        "{}: {:#?}",
        schedule.name(),
        result.problems()
    );
    assert!(
        result.report.acknowledged > 100,
        "{} acknowledged only {} messages: the workload did not run",
        schedule.name(),
        result.report.acknowledged
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_message_lost_when_the_leader_is_killed() {
    passes(Schedule::KillLeader, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_message_lost_when_a_random_node_is_killed() {
    passes(Schedule::KillRandom, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deposed_leader_acknowledges_what_it_cannot_keep_after_a_pause() {
    passes(Schedule::PauseLeader, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_without_a_majority_when_two_nodes_die() {
    passes(Schedule::KillTwo, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_leader_keeps_acknowledging() {
    passes(Schedule::PartitionLeader, 2).await;
}

/// The peer links cut and healed under TLS: sessions break mid-stream and
/// are made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_leader_keeps_acknowledging_over_tls() {
    passes_over(Schedule::PartitionLeader, 2, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_that_cannot_reach_the_others_keeps_acknowledging() {
    passes(Schedule::PartitionOneWay, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_a_killed_consumer_are_never_redelivered() {
    passes(Schedule::KillConsumer, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_with_a_wiped_data_dir_loses_or_resurrects_messages() {
    passes(Schedule::WipeNode, 3).await;
}

/// Every node's gossip cut under load until every node warns that it hears
/// none (10-12 s): nothing is lost or stuck, and the view comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs floret built with --features failpoints"
)]
async fn delivery_stalls_while_gossip_is_cut() {
    passes(Schedule::CutGossip, 1).await;
}

/// Every node stopped with SIGTERM and started again in turn, under load:
/// each hands its shards off and drains; nothing is lost or stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_gracefully_loses_what_it_led() {
    passes(Schedule::RollingRestart, 1).await;
}

/// Nodes added under load, a member paused while shards move to one and
/// then removed alive, another killed mid-move, wiped and replaced in its
/// seat: nothing is lost, the replicas agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_message_lost_while_members_change() {
    passes(Schedule::MembershipChange, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_serves_wrong_data_from_a_damaged_log() {
    passes(Schedule::CorruptLog, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs floret built with --features failpoints"
)]
async fn crash_between_log_append_commit_apply_and_reply_loses_messages() {
    passes(Schedule::CrashAtFaultPoints, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs floret built with --features failpoints"
)]
async fn produce_acknowledged_before_its_fdatasync_is_lost_in_a_power_failure() {
    let result = run_schedule(
        Schedule::PowerLoss,
        2,
        "",
        WorkloadSpec::default(),
        Expect::NoProblems,
    )
    .await;
    assert!(result.problems().is_empty(), "{:#?}", result.problems());
    assert!(
        result.power_loss_dropped_bytes > 0,
        "the emulated power failures dropped no unsynced bytes, so they proved nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs floret built with --features failpoints"
)]
async fn checker_reports_loss_when_the_log_acknowledges_without_syncing() {
    // Consumers far slower than the producers, so acknowledged messages are
    // still queued when the power goes (else they were all delivered before
    // and nothing acknowledged could be lost).
    let slow_consumers = WorkloadSpec {
        capped_consume_rate: 10,
        ..WorkloadSpec::default()
    };
    let result = run_schedule(
        Schedule::PowerLoss,
        1,
        "wal-skip-sync=return",
        slow_consumers,
        Expect::Loss,
    )
    .await;
    assert!(
        !result.report.lost.is_empty(),
        "a log that never syncs lost nothing in a power failure: the emulation or the checker is blind; {:#?}",
        result.report
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs floret built with --features failpoints"
)]
async fn checker_reports_loss_when_nodes_drop_applied_entries() {
    let result = run_schedule(
        Schedule::KillConsumer,
        1,
        "apply-drop-enqueue=5*return",
        WorkloadSpec::default(),
        Expect::Loss,
    )
    .await;
    assert!(
        !result.report.lost.is_empty(),
        "nodes that drop applied entries lost nothing: the checker is blind; {:#?}",
        result.report
    );
}
