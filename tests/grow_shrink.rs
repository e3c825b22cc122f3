//! Grown to five and shrunk back to three (one node dead, one alive)
//! under 10 idempotent producers and 3 consumers given the first three
//! addresses: no produce call fails, the p99 stays under 2 s, every
//! acknowledged message is delivered, the replicas agree, the producers'
//! deliveries are even again (Jain's index >= 0.95) once each change
//! settles (its replicas moved and every shard led by its preferred
//! replica), and the member removed alive leaves only once it has retired
//! every replica it held.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floret_sched::jain_index;
use tokio::sync::watch;

use super::SHARDS;
use super::harness::{Cluster, one_cluster_at_a_time};
use super::membership::{
    MOVE_DEADLINE, retired_on, wait_for_equal_digests, wait_for_members, wait_for_replicas_on,
};
use super::rolling_restart::{
    Consumed, collect_produced, consume_steadily, percentile, produce_steadily,
    wait_for_every_delivery,
};

/// The longest a produce call may take at the 99th percentile while
/// shards move.
const MAX_PRODUCE_STALL_P99: Duration = Duration::from_secs(2);
/// How long the deliveries are counted per producer after a change settles.
const FAIRNESS_WINDOW: Duration = Duration::from_secs(2);
/// The least Jain's index over the producers' deliveries in that window.
const MIN_JAIN_AFTER_A_CHANGE: f64 = 0.95;
/// The steady producers.
const PRODUCERS: usize = 10;

/// How many deliveries each of the [`PRODUCERS`] got in the
/// [`FAIRNESS_WINDOW`] that begins at `settled`, once it is over, and
/// Jain's index over them.
async fn fairness_after(
    consumed: &[Arc<Mutex<Consumed>>],
    settled: Instant,
) -> (f64, BTreeMap<String, u64>) {
    tokio::time::sleep_until((settled + FAIRNESS_WINDOW).into()).await;
    let mut per_producer: BTreeMap<String, u64> =
        (0..PRODUCERS).map(|n| (format!("p{n}"), 0)).collect();
    for record in consumed {
        let record = record.lock().unwrap();
        let in_window = record
            .delivered_at
            .iter()
            .filter(|(at, _)| *at >= settled && *at < settled + FAIRNESS_WINDOW);
        for (_, producer) in in_window {
            *per_producer.entry(producer.clone()).or_default() += 1;
        }
    }
    let shares: Vec<f64> = per_producer.values().map(|&count| count as f64).collect();
    (jain_index(&shares).unwrap_or(0.0), per_producer)
}

/// Waits until a change has settled: every shard's replicas on `members`
/// (`what` names that in a failure) and every shard led by its preferred
/// replica, as node 1 reports it; returns each shard's voters.
async fn settle(cluster: &Cluster, members: &[u64], what: &str) -> Vec<BTreeSet<u64>> {
    let voters = wait_for_replicas_on(&cluster.client(1), members, what).await;
    cluster.wait_for_preferred_leaders(1).await;
    voters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_grown_to_five_and_shrunk_to_three_under_load_loses_or_stalls() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    cluster.wait_for_preferred_leaders(1).await;
    let client = cluster.client_of(&cluster.addresses());
    let (stop_producing, producing) = watch::channel(false);
    let (stop_consuming, consuming) = watch::channel(false);
    let consumed: Vec<Arc<Mutex<Consumed>>> = (0..3).map(|_| Arc::default()).collect();
    let consumers: Vec<_> = consumed
        .iter()
        .map(|record| {
            tokio::spawn(consume_steadily(
                client.clone(),
                record.clone(),
                consuming.clone(),
            ))
        })
        .collect();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|n| {
            tokio::spawn(produce_steadily(
                client.clone(),
                format!("p{n}"),
                producing.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut took = Vec::new();
    let mut fairness = Vec::new();
    for (node, members) in [(4, vec![1, 2, 3, 4]), (5, vec![1, 2, 3, 4, 5])] {
        let began = Instant::now();
        cluster
            .client(1)
            .add_node(node, &cluster.next_peer_address())
            .await
            .unwrap_or_else(|e| panic!("add node {node}: {e}"));
        assert_eq!(tokio::task::block_in_place(|| cluster.join()), node);
        settle(&cluster, &members, "the new node's replicas moved").await;
        took.push((format!("add {node}"), began.elapsed()));
        fairness.push(fairness_after(&consumed, Instant::now()).await);
    }
    let began = Instant::now();
    cluster.kill(2);
    cluster
        .client(1)
        .remove_node(2)
        .await
        .expect("remove the dead node 2");
    let voters = settle(&cluster, &[1, 3, 4, 5], "node 2's replicas moved").await;
    took.push(("remove 2 (dead)".to_owned(), began.elapsed()));
    fairness.push(fairness_after(&consumed, Instant::now()).await);
    let began = Instant::now();
    let held_by_3 = voters.iter().filter(|shard| shard.contains(&3)).count();
    let retired_by_3 = retired_on(&cluster, 3);
    cluster
        .client(1)
        .remove_node(3)
        .await
        .expect("remove node 3");
    let client_1 = cluster.client(1);
    wait_for_members(&client_1, &[1, 4, 5], "node 3 out of the membership group").await;
    assert_eq!(
        retired_on(&cluster, 3),
        retired_by_3 + held_by_3,
        "node 3 left before it retired every replica it held"
    );
    let exit = cluster.terminate(3, MOVE_DEADLINE);
    assert!(
        exit.is_some_and(|status| status.success()),
        "node 3 stopped: {exit:?}"
    );
    settle(&cluster, &[1, 4, 5], "every shard on nodes 1, 4 and 5").await;
    took.push(("remove 3 (alive)".to_owned(), began.elapsed()));
    fairness.push(fairness_after(&consumed, Instant::now()).await);
    stop_producing.send_replace(true);

    let (acknowledged, failures, call_times) = collect_produced(producers).await;
    assert!(failures.is_empty(), "produce calls failed: {failures:?}");
    let calls = call_times.len();
    let slowest = call_times.iter().max().copied().unwrap_or_default();
    let p99 = percentile(call_times, 0.99);
    assert!(
        p99 < MAX_PRODUCE_STALL_P99,
        "produce p99 {p99:?} over {calls} calls"
    );
    wait_for_every_delivery(&consumed, &acknowledged).await;
    stop_consuming.send_replace(true);
    for consumer in consumers {
        consumer.await.unwrap();
    }
    wait_for_equal_digests(&cluster, &[1, 4, 5]).await;
    eprintln!(
        "grow to five, shrink to three: {calls} produce calls, 0 failed, p99 {p99:?}, slowest {slowest:?}; {} acknowledged, all delivered; each change until its shards settled: {took:?}; Jain's index in the {FAIRNESS_WINDOW:?} after each: {:.3?}",
        acknowledged.len(),
        fairness.iter().map(|(jain, _)| *jain).collect::<Vec<_>>()
    );
    let uneven: Vec<String> = took
        .iter()
        .zip(&fairness)
        .filter(|(_, (jain, _))| *jain < MIN_JAIN_AFTER_A_CHANGE)
        .map(|((change, _), (jain, deliveries))| {
            format!(
                "after {change}: Jain's index {jain:.3}, deliveries per producer {deliveries:?}"
            )
        })
        .collect();
    assert!(
        uneven.is_empty(),
        "deliveries uneven in the {FAIRNESS_WINDOW:?} after a change settled: {uneven:?}"
    );
}
