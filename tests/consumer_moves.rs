//! A consumer of a client given every node follows the cluster: when the
//! node it consumes through dies, it goes on through another.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use floret_client::{Consumer, ConsumerEvent};

use super::harness::{Cluster, one_cluster_at_a_time};
use super::{CREDITS, DRAIN_DEADLINE, SHARDS, key_of, produce_all};

/// The consumer's next event within 10 s; panics naming `what` if none
/// comes, or the consumer fails or ends.
async fn next_event(consumer: &mut Consumer, what: &str) -> ConsumerEvent {
    tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .unwrap_or_else(|error| panic!("{what}: the consumer failed: {error}"))
        .unwrap_or_else(|| panic!("{what}: the stream ended"))
}

/// How soon after its node is killed the consumer must receive again.
const RECEIVING_AGAIN_WITHIN: Duration = Duration::from_secs(3);

/// 12 producers backlog 1,200 messages over three nodes; a consumer of a
/// client given all three takes 200 of them, then the node it consumes
/// through is SIGKILLed. It receives again within 3 s through another node
/// and gets every acknowledged message. Before, its stream just ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_stream_ends_when_its_node_dies() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    let every_node = cluster.client_of(&cluster.addresses());
    let acknowledged = produce_all(12, |_| every_node.clone(), 10, 10).await;
    let expected: HashSet<(String, u64)> = acknowledged.lock().unwrap().iter().cloned().collect();

    let mut consumer = every_node.consume("default", CREDITS).await.unwrap();
    let first_node = consumer.node().to_owned();
    let victim = (1..=3)
        .find(|&id| cluster.address(id) == first_node)
        .unwrap_or_else(|| panic!("the consumer is on {first_node}, not a node of the cluster"));
    let mut delivered: HashSet<(String, u64)> = HashSet::new();
    let mut killed_at: Option<Instant> = None;
    let mut received_again_after = None;
    let deadline = Instant::now() + DRAIN_DEADLINE;
    while !expected.is_subset(&delivered) {
        assert!(
            Instant::now() < deadline,
            "{} of {} acknowledged messages delivered within {DRAIN_DEADLINE:?}",
            delivered.len(),
            expected.len()
        );
        let event = next_event(&mut consumer, "an event within 10 s").await;
        let ConsumerEvent::Delivery(delivery) = event else {
            continue;
        };
        if let Some(killed_at) = killed_at
            && received_again_after.is_none()
            && consumer.node() != first_node
        {
            received_again_after = Some(killed_at.elapsed());
        }
        delivered.insert(key_of(&delivery));
        consumer.ack(vec![delivery.delivery_id]).await.unwrap();
        consumer.credit(1).await.unwrap();
        if delivered.len() == 200 && killed_at.is_none() {
            cluster.kill(victim);
            killed_at = Some(Instant::now());
        }
    }
    let received_again_after =
        received_again_after.expect("deliveries through another node after the kill");
    eprintln!(
        "consumer moved from node {victim} to {} and received again {received_again_after:?} after the kill",
        consumer.node()
    );
    assert_ne!(consumer.node(), first_node);
    assert!(
        received_again_after <= RECEIVING_AGAIN_WITHIN,
        "received again {received_again_after:?} after its node was killed"
    );
    assert!(
        delivered.is_subset(&expected),
        "delivered what no producer sent"
    );
}

/// A consumer that has used every credit it granted when its node is
/// killed (it acks and grants in batches) moves with none, and its next
/// grant reaches the new node. Before, every node refused a subscribe with
/// no credits and the consumer gave up after 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_without_credits_left_cannot_move() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    let every_node = cluster.client_of(&cluster.addresses());
    let acknowledged = produce_all(12, |_| every_node.clone(), 2, 10).await;
    let expected: HashSet<(String, u64)> = acknowledged.lock().unwrap().iter().cloned().collect();

    let mut consumer = every_node.consume("default", 8).await.unwrap();
    let first_node = consumer.node().to_owned();
    let mut delivered: HashSet<(String, u64)> = HashSet::new();
    let mut batch = Vec::new();
    while batch.len() < 8 {
        let event = next_event(&mut consumer, "an event within 10 s").await;
        if let ConsumerEvent::Delivery(delivery) = event {
            delivered.insert(key_of(&delivery));
            batch.push(delivery.delivery_id);
        }
    }
    let victim = (1..=3)
        .find(|&id| cluster.address(id) == first_node)
        .expect("the consumer's node");
    cluster.kill(victim);
    consumer.ack(batch).await.unwrap();
    consumer.credit(8).await.unwrap();
    let deadline = Instant::now() + DRAIN_DEADLINE;
    while !expected.is_subset(&delivered) {
        assert!(
            Instant::now() < deadline,
            "{} of {} delivered",
            delivered.len(),
            expected.len()
        );
        let event = next_event(&mut consumer, "an event within 10 s of the kill").await;
        if let ConsumerEvent::Delivery(delivery) = event {
            delivered.insert(key_of(&delivery));
            consumer.ack(vec![delivery.delivery_id]).await.unwrap();
            consumer.credit(1).await.unwrap();
        }
    }
    assert_ne!(consumer.node(), first_node);
}
