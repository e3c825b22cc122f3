//! Fairness across nodes, on three real `floret serve` processes: producers
//! placed unevenly over the nodes still get equal shares of one consumer,
//! because consumer credits are split by the backlogged weight each node
//! gossips; and a dead node drops out of the split.
//!
//! One cluster runs at a time; every wait has a deadline.

mod harness;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use floret_client::{Client, ConsumerEvent, Message};
use floret_cluster::ShardPlacement;
use harness::{Cluster, eventually, one_cluster_at_a_time};

/// Shards of the test clusters.
const SHARDS: u32 = 8;
/// Messages each producer has backlogged before the consumer starts.
const BACKLOG: u64 = 600;
/// Deliveries skipped before the window, while the view settles.
const WARM_UP: usize = 150;
/// Length of the measured window.
const WINDOW: Duration = Duration::from_secs(8);
/// The consumer's pause per delivery: a sink slower than the cluster.
const SINK_PAUSE: Duration = Duration::from_millis(4);

/// Jain's fairness index of `shares`: 1 when all are equal, 1/n when one has all.
fn jain(shares: &[f64]) -> f64 {
    let sum: f64 = shares.iter().sum();
    let squares: f64 = shares.iter().map(|s| s * s).sum();
    sum * sum / (shares.len() as f64 * squares)
}

/// Producer names whose shards node `node` leads, `count` of them.
fn producers_led_by(
    leaders: &BTreeMap<u32, u64>,
    node: u64,
    count: usize,
    prefix: &str,
) -> Vec<String> {
    let placement = ShardPlacement::new(SHARDS);
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|p| leaders[&placement.shard_of("default", p)] == node)
        .take(count)
        .collect()
}

/// Every shard's leader, once every shard has a reachable one.
async fn leaders(cluster: &Cluster, via: u64) -> BTreeMap<u32, u64> {
    let mut leaders = BTreeMap::new();
    for shard in 0..SHARDS {
        leaders.insert(shard, cluster.leader_of(shard, via).await);
    }
    leaders
}

async fn backlog(client: &Client, producers: &[String]) {
    backlog_of(client, "default", producers, BACKLOG).await;
}

/// Produces `messages` messages (in batches of 100) for each of
/// `producers` on `queue`, one producer after another.
async fn backlog_of(client: &Client, queue: &str, producers: &[String], messages: u64) {
    for producer in producers {
        let mut sender = client.producer(queue, producer);
        for batch in 0..messages / 100 {
            let messages = (0..100)
                .map(|i| Message {
                    payload: format!("{producer}:{}", batch * 100 + i).into_bytes(),
                    headers: HashMap::new(),
                })
                .collect();
            sender.send(messages).await.expect("backlog produce");
        }
    }
}

/// Consumes through `client` at the sink's pace; returns each of
/// `producers`' share of the deliveries in the window after the warm-up.
async fn measure_shares(client: &Client, producers: &[String]) -> Vec<f64> {
    let mut consumer = client.consume("default", 8).await.expect("subscribe");
    let mut delivered = 0usize;
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut window_end: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while window_end.is_none_or(|end| Instant::now() < end) {
        assert!(Instant::now() < deadline, "the window never ended");
        let event = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .expect("a delivery within 10 s")
            .expect("consume stream")
            .expect("stream open");
        let ConsumerEvent::Delivery(delivery) = event else {
            continue;
        };
        delivered += 1;
        if delivered == WARM_UP {
            window_end = Some(Instant::now() + WINDOW);
        } else if delivered > WARM_UP {
            *counts.entry(delivery.producer_id.clone()).or_insert(0) += 1;
        }
        tokio::time::sleep(SINK_PAUSE).await;
        consumer.ack(vec![delivery.delivery_id]).await.expect("ack");
        consumer.credit(1).await.expect("credit");
    }
    let total: u64 = counts.values().sum();
    producers
        .iter()
        .map(|p| counts.get(p).copied().unwrap_or(0) as f64 / total as f64)
        .collect()
}

/// Starts three nodes (8 shards, `extra_args`), backlogs `count` producers
/// named `prefix-…` on the shards each `(node, count, prefix)` of `placement`
/// leads, and consumes through node `consumer`; returns the shares (in
/// placement order), the producers, and the queue statistics after.
async fn placed_shares(
    extra_args: &[&str],
    placement: &[(u64, usize, &str)],
    consumer: u64,
) -> (Vec<f64>, Vec<String>, floret_client::QueueStatsResponse) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--shards", "8"];
    args.extend_from_slice(extra_args);
    let cluster = Cluster::start(dir.path(), 3, &args);
    cluster.wait_for_preferred_leaders(1).await;
    let leaders = leaders(&cluster, 1).await;
    let mut producers = Vec::new();
    for &(node, count, prefix) in placement {
        let placed = producers_led_by(&leaders, node, count, prefix);
        backlog(&cluster.client(node), &placed).await;
        producers.extend(placed);
    }
    let shares = measure_shares(&cluster.client(consumer), &producers).await;
    assert_eq!(
        self::leaders(&cluster, 1).await,
        leaders,
        "leadership moved during the measurement: the placement was not the one tested"
    );
    let stats = cluster.client(1).queue_stats("default").await.unwrap();
    (shares, producers, stats)
}

/// One producer on node 1's shards, nine on node 2's, consumed through node 3.
async fn uneven_placement_shares(
    extra_args: &[&str],
) -> (Vec<f64>, Vec<String>, floret_client::QueueStatsResponse) {
    placed_shares(extra_args, &[(1, 1, "lone"), (2, 9, "crowd")], 3).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lone_producer_on_its_own_node_takes_as_much_as_nine_on_another() {
    let _one = one_cluster_at_a_time().await;
    let (shares, producers, stats) = uneven_placement_shares(&[]).await;
    let index = jain(&shares);
    let reported = &stats.queues[0];
    eprintln!(
        "QueueStats: Jain {:.3}; dwell p99 per producer {:?}",
        reported.jain_index,
        reported
            .producers
            .iter()
            .map(|p| p.dwell_p99_ms)
            .collect::<Vec<_>>()
    );
    assert!(
        reported.jain_index >= 0.95,
        "QueueStats' own Jain index {:.3}",
        reported.jain_index
    );
    assert!(
        reported
            .producers
            .iter()
            .all(|p| p.led && p.window_deliveries > 0 && p.weight == 1),
        "every producer reported by its shard's leader with recent deliveries: {:?}",
        reported.producers
    );
    eprintln!("cross-node split on: Jain {index:.3}, shares {shares:.3?} of {producers:?}");
    for (producer, share) in producers.iter().zip(&shares) {
        assert!(
            (share - 0.1).abs() <= 0.015,
            "{producer} got {:.1}% of deliveries, not 10% ± 15%: {shares:.3?}",
            share * 100.0
        );
    }
    assert!(index >= 0.98, "Jain's index {index:.3}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_cross_node_split_the_lone_producer_takes_a_node_share() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("floret.toml");
    std::fs::write(&config, "[fairness]\ncross_node_split = false\n").unwrap();
    let (shares, producers, _) =
        uneven_placement_shares(&["--config", config.to_str().unwrap()]).await;
    let index = jain(&shares);
    eprintln!("cross-node split off: Jain {index:.3}, shares {shares:.3?} of {producers:?}");
    assert!(
        shares[0] > 0.3 && index < 0.8,
        "without the split the lone producer should take about half: {shares:.3?}, Jain {index:.3}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_node_stays_in_the_split() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", "8"]);
    cluster.wait_for_preferred_leaders(1).await;
    let leaders = leaders(&cluster, 1).await;
    let on_1 = producers_led_by(&leaders, 1, 3, "one");
    let on_2 = producers_led_by(&leaders, 2, 3, "two");
    backlog(&cluster.client(1), &on_1).await;
    backlog(&cluster.client(2), &on_2).await;

    cluster.kill(2);
    let killed_at = Instant::now();
    let survivor = cluster.client(3);
    // chitchat's phi is the silence divided by the mean heartbeat interval
    // it learned, and phi 8 means dead. Intervals up to ten gossip rounds
    // (2 s) count towards the mean, so a node is declared dead after 1.6 s
    // of silence on an idle machine and up to 16 s when the backlog fill
    // stretched the intervals (15 s was once too short on a loaded CI run).
    eventually(
        Duration::from_secs(30),
        "the view marking node 2 dead",
        || {
            let survivor = survivor.clone();
            async move {
                survivor.cluster_status().await.is_ok_and(|status| {
                    status
                        .nodes
                        .iter()
                        .any(|n| n.node_id == 2 && n.liveness == "dead")
                })
            }
        },
    )
    .await;
    eprintln!(
        "node 2 marked dead {:?} after the kill",
        killed_at.elapsed()
    );
    let now_led = self::leaders(&cluster, 3).await;
    eprintln!(
        "every shard led again {:?} after the kill",
        killed_at.elapsed()
    );

    let survivors: Vec<String> = on_1.iter().chain(&on_2).cloned().collect();
    let shares = measure_shares(&survivor, &survivors).await;
    let index = jain(&shares);
    let placement = ShardPlacement::new(SHARDS);
    let placed: Vec<(String, u32, u64)> = on_1
        .iter()
        .chain(&on_2)
        .map(|p| {
            let shard = placement.shard_of("default", p);
            (p.clone(), shard, now_led[&shard])
        })
        .collect();
    eprintln!(
        "after the kill: Jain {index:.3}, shares {shares:.3?}; (producer, shard, leader): {placed:?}"
    );
    assert!(
        index >= 0.95,
        "fairness among the surviving producers: Jain {index:.3}, {shares:.3?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_with_one_credit_stalls_when_the_backlog_sits_on_one_node() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &["--shards", "8"]);
    cluster.wait_for_preferred_leaders(1).await;
    let leaders = leaders(&cluster, 1).await;
    let producer = producers_led_by(&leaders, 1, 1, "solo");
    backlog(&cluster.client(1), &producer).await;
    let mut consumer = cluster
        .client(3)
        .consume("default", 1)
        .await
        .expect("subscribe");
    let status_client = cluster.client(1);
    eventually(
        Duration::from_secs(10),
        "the merged consumer counted once, not once per node",
        || {
            let status_client = status_client.clone();
            async move {
                status_client
                    .queue_stats("default")
                    .await
                    .is_ok_and(|stats| stats.queues.first().is_some_and(|q| q.consumers == 1))
            }
        },
    )
    .await;
    let mut delivered = 0;
    while delivered < BACKLOG {
        let event = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .unwrap_or_else(|_| panic!("stalled after {delivered} deliveries with one credit"))
            .expect("consume stream")
            .expect("stream open");
        if let ConsumerEvent::Delivery(delivery) = event {
            delivered += 1;
            consumer.ack(vec![delivery.delivery_id]).await.expect("ack");
            consumer.credit(1).await.expect("credit");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_node_over_serves_its_own_producers() {
    let _one = one_cluster_at_a_time().await;
    let (shares, _, _) = placed_shares(&[], &[(1, 4, "remote"), (3, 2, "local")], 3).await;
    let index = jain(&shares);
    eprintln!("consumer on the node of 2 of 6 producers: Jain {index:.3}, shares {shares:.3?}");
    assert!(index >= 0.98, "Jain {index:.3}, shares {shares:.3?}");
}

/// Producers backlogged before the first-burst consumer subscribes.
const BURST_PRODUCERS: usize = 24;
/// Messages each of them backlogs.
const BURST_BACKLOG: u64 = 400;
/// Deliveries the first burst is judged over.
const FIRST_DELIVERIES: usize = 1_000;

/// Runs of the first-burst test (`FLORET_FIRST_BURST_RUNS`, 3 by default):
/// each on a queue of its own, with a merge of its own.
fn first_burst_runs() -> usize {
    std::env::var("FLORET_FIRST_BURST_RUNS")
        .ok()
        .and_then(|runs| runs.parse().ok())
        .unwrap_or(3)
}

/// 24 producers placed by hash over three nodes backlog 400 messages each;
/// a consumer subscribing through node 1 right after gets Jain >= 0.95
/// over its first 1,000 deliveries. Before, the split waited for the
/// gossip view to learn each node's weight, and node 1 took most of the
/// first credits (Jain 0.89 to 0.98).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_deliveries_go_to_the_consumers_own_node() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &["--shards", "8"]);
    cluster.wait_for_preferred_leaders(1).await;
    let every_node = cluster.client_of(&cluster.addresses());
    let mut indexes = Vec::new();
    for run in 0..first_burst_runs() {
        let queue = format!("burst-{run}");
        let producers: Vec<String> = (0..BURST_PRODUCERS).map(|i| format!("p{i}")).collect();
        backlog_of(&every_node, &queue, &producers, BURST_BACKLOG).await;

        let mut consumer = cluster
            .client(1)
            .consume(&queue, 64)
            .await
            .expect("subscribe");
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        let mut delivered = 0;
        while delivered < FIRST_DELIVERIES {
            let event = tokio::time::timeout(Duration::from_secs(10), consumer.next())
                .await
                .unwrap_or_else(|_| panic!("run {run}: stalled after {delivered} deliveries"))
                .expect("consume stream")
                .expect("stream open");
            if let ConsumerEvent::Delivery(delivery) = event {
                delivered += 1;
                *counts.entry(delivery.producer_id.clone()).or_default() += 1;
                consumer.ack(vec![delivery.delivery_id]).await.expect("ack");
                consumer.credit(1).await.expect("credit");
            }
        }
        let shares: Vec<f64> = producers
            .iter()
            .map(|p| counts.get(p).copied().unwrap_or(0) as f64)
            .collect();
        let index = jain(&shares);
        eprintln!(
            "run {run}: Jain {index:.3} over the first {FIRST_DELIVERIES} deliveries, per producer {shares:?}"
        );
        indexes.push(index);
    }
    assert!(
        indexes.iter().all(|&index| index >= 0.95),
        "Jain's index of the first {FIRST_DELIVERIES} deliveries per run: {indexes:.3?}"
    );
}
