//! A rolling restart: every node of a three-node cluster is stopped with
//! SIGTERM and started again, one after another, while 10 idempotent
//! producers and 3 consumers run through a client given every node. A
//! stopping node hands the shards it leads to caught-up replicas and ends
//! its consume streams so their clients move; callers never see a failed
//! produce, nothing acknowledged is lost, and neither producers nor
//! consumers stall for long.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floret_client::{Client, ConsumerEvent};
use tokio::sync::watch;

use super::harness::{Cluster, eventually, one_cluster_at_a_time};
use super::{CREDITS, DRAIN_DEADLINE, RECONNECT_WAIT, SHARDS, key_of, message};

const PRODUCERS: usize = 10;
const CONSUMERS: usize = 3;
/// Pause between one producer's produce calls.
const PRODUCE_PACE: Duration = Duration::from_millis(40);
/// The longest a stopped node may take to exit.
const EXIT_DEADLINE: Duration = Duration::from_secs(30);
/// The longest produce call the 99th percentile may take.
const MAX_PRODUCE_STALL_P99: Duration = Duration::from_secs(1);
/// The longest a consumer may go without a delivery while producers run.
const MAX_CONSUMER_GAP: Duration = Duration::from_secs(2);

/// What a producer saw.
#[derive(Default)]
pub(super) struct Produced {
    pub acknowledged: Vec<(String, u64)>,
    pub failures: Vec<String>,
    pub call_times: Vec<Duration>,
}

/// Sends one message per call for `producer` until `stop`, idempotently.
pub(super) async fn produce_steadily(
    client: Client,
    producer: String,
    stop: watch::Receiver<bool>,
) -> Produced {
    let mut produced = Produced::default();
    let mut sender = client.producer("default", &producer);
    let mut counter = 0;
    while !*stop.borrow() {
        let began = Instant::now();
        match sender.send(vec![message(&producer, counter)]).await {
            Ok(_) => produced.acknowledged.push((producer.clone(), counter)),
            Err(error) => produced.failures.push(error.to_string()),
        }
        produced.call_times.push(began.elapsed());
        counter += 1;
        tokio::time::sleep(PRODUCE_PACE).await;
    }
    produced
}

/// What a consumer saw: when each delivery came and whose it was, and
/// what was delivered.
#[derive(Default)]
pub(super) struct Consumed {
    pub delivered_at: Vec<(Instant, String)>,
    pub delivered: HashSet<(String, u64)>,
    pub ended: Vec<String>,
}

/// Consumes through one stream of `client` (which moves between nodes by
/// itself) until `stop`, acking and crediting every delivery.
pub(super) async fn consume_steadily(
    client: Client,
    consumed: Arc<Mutex<Consumed>>,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let mut consumer = match client.consume("default", CREDITS).await {
            Ok(consumer) => consumer,
            Err(error) => {
                consumed
                    .lock()
                    .unwrap()
                    .ended
                    .push(format!("cannot subscribe: {error}"));
                let _stopped_or_retry =
                    tokio::time::timeout(RECONNECT_WAIT, stop.wait_for(|stop| *stop)).await;
                continue;
            }
        };
        loop {
            let event = tokio::select! {
                event = consumer.next() => event,
                _ = stop.wait_for(|stop| *stop) => return,
            };
            match event {
                Ok(Some(ConsumerEvent::Delivery(delivery))) => {
                    {
                        let mut consumed = consumed.lock().unwrap();
                        consumed
                            .delivered_at
                            .push((Instant::now(), delivery.producer_id.clone()));
                        consumed.delivered.insert(key_of(&delivery));
                    }
                    if consumer.ack(vec![delivery.delivery_id]).await.is_err()
                        || consumer.credit(1).await.is_err()
                    {
                        consumed
                            .lock()
                            .unwrap()
                            .ended
                            .push("ack on a closed stream".into());
                        break;
                    }
                }
                Ok(Some(ConsumerEvent::Settled(_))) => {}
                Ok(None) => {
                    consumed
                        .lock()
                        .unwrap()
                        .ended
                        .push("the stream ended".into());
                    break;
                }
                Err(error) => {
                    consumed.lock().unwrap().ended.push(error.to_string());
                    break;
                }
            }
        }
    }
}

/// What the producers' tasks saw, together: every acknowledged message,
/// every failed call, every call's time.
pub(super) async fn collect_produced(
    producers: Vec<tokio::task::JoinHandle<Produced>>,
) -> (HashSet<(String, u64)>, Vec<String>, Vec<Duration>) {
    let mut acknowledged = HashSet::new();
    let mut failures = Vec::new();
    let mut call_times = Vec::new();
    for producer in producers {
        let produced = producer.await.unwrap();
        acknowledged.extend(produced.acknowledged);
        failures.extend(produced.failures);
        call_times.extend(produced.call_times);
    }
    (acknowledged, failures, call_times)
}

/// Waits until the consumers of `consumed` were delivered every message
/// of `acknowledged` (panics after [`DRAIN_DEADLINE`]).
pub(super) async fn wait_for_every_delivery(
    consumed: &[Arc<Mutex<Consumed>>],
    acknowledged: &HashSet<(String, u64)>,
) {
    eventually(
        DRAIN_DEADLINE,
        "every acknowledged message delivered",
        || async {
            let mut delivered = HashSet::new();
            for record in consumed {
                delivered.extend(record.lock().unwrap().delivered.iter().cloned());
            }
            acknowledged.is_subset(&delivered)
        },
    )
    .await;
}

pub(super) fn percentile(mut times: Vec<Duration>, fraction: f64) -> Duration {
    times.sort_unstable();
    let index = ((times.len() as f64 * fraction).ceil() as usize).clamp(1, times.len()) - 1;
    times[index]
}

/// The longest time between two deliveries (or from `from` to the first)
/// up to `until`.
fn longest_gap(delivered_at: &[(Instant, String)], from: Instant, until: Instant) -> Duration {
    let mut last = from;
    let mut longest = Duration::ZERO;
    for &(at, _) in delivered_at.iter().filter(|(at, _)| *at <= until) {
        longest = longest.max(at.saturating_duration_since(last));
        last = at.max(last);
    }
    longest.max(until.saturating_duration_since(last))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_failed_calls_or_stalled_producers_and_consumers() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    cluster.wait_for_preferred_leaders(1).await;
    let client = cluster.client_of(&cluster.addresses());
    let (stop_producing, producing) = watch::channel(false);
    let (stop_consuming, consuming) = watch::channel(false);
    let consumed: Vec<Arc<Mutex<Consumed>>> = (0..CONSUMERS).map(|_| Arc::default()).collect();
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
    let began = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut stop_times = Vec::new();
    for id in 1..=3 {
        let stopping = Instant::now();
        let exit = cluster.terminate(id, EXIT_DEADLINE);
        stop_times.push(stopping.elapsed());
        assert!(
            exit.is_some_and(|status| status.success()),
            "node {id} did not stop cleanly within {EXIT_DEADLINE:?}: {exit:?}\n{}",
            cluster.log(id)
        );
        let log = cluster.log(id);
        assert!(
            log.contains("leaderships handed off") && log.contains("still_led=0"),
            "node {id} stopped while still leading shards:\n{log}"
        );
        cluster.restart(id);
        cluster.wait_for_preferred_leaders(id % 3 + 1).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_producing.send_replace(true);
    let stopped_producing = Instant::now();

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
    let mut gaps = Vec::new();
    for (n, record) in consumed.iter().enumerate() {
        let record = record.lock().unwrap();
        let gap = longest_gap(&record.delivered_at, began, stopped_producing);
        gaps.push(gap);
        assert!(
            gap < MAX_CONSUMER_GAP,
            "consumer {n} went {gap:?} without a delivery (its stream: {:?})",
            record.ended
        );
    }
    eprintln!(
        "rolling restart: {calls} produce calls, 0 failed, p99 {p99:?}, slowest {slowest:?}; {} acknowledged, all delivered; longest consumer gaps {gaps:?}; nodes stopped in {stop_times:?}",
        acknowledged.len()
    );
}
