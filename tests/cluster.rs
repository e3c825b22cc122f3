//! Three real `floret serve` processes on loopback: any-node entry, leader
//! failover under load, a lost majority, and a node that lost its data dir.
//!
//! One cluster runs at a time (two would starve each other's heartbeats on
//! two cores). Every wait has a deadline; no test relies on a fixed sleep.

mod bounded;
mod consumer_moves;
mod dev_cluster;
mod first_start;
mod gossip_blocked;
mod grow_shrink;
mod harness;
mod health;
mod leaving;
mod membership;
mod peer_port;
mod retirement;
mod rolling_restart;
mod sink_failover;
mod sink_rate;
mod tenants;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floret_client::{Client, ConsumerEvent, Delivery, Message};
use floret_cluster::ShardPlacement;
use harness::{Cluster, eventually, one_cluster_at_a_time};
use tokio::sync::watch;
use tonic::Code;

/// Shards of the test clusters: several per node, few enough for two cores.
const SHARDS: &str = "8";
/// Upper bound for draining a test's messages.
const DRAIN_DEADLINE: Duration = Duration::from_secs(90);
/// Longest wait before a consumer tries to reopen a stream that failed to open.
const RECONNECT_WAIT: Duration = Duration::from_millis(100);
/// Credits of the test consumers: the in-flight window.
const CREDITS: u32 = 32;

fn message(producer: &str, counter: u64) -> Message {
    Message {
        payload: format!("{producer}:{counter}").into_bytes(),
        headers: HashMap::from([("counter".to_owned(), counter.to_string())]),
    }
}

fn key_of(delivery: &Delivery) -> (String, u64) {
    let counter = delivery.headers["counter"].parse().expect("counter header");
    (delivery.producer_id.clone(), counter)
}

/// What a consumer saw: every delivery in order, and the messages whose
/// acks were answered OK.
#[derive(Default)]
struct Consumed {
    deliveries: Vec<Delivery>,
    acked: HashSet<(String, u64)>,
    /// Deliveries of a message after its ack had been answered OK.
    returned_after_ack: Vec<(String, u64)>,
}

impl Consumed {
    fn first_deliveries(&self) -> HashSet<(String, u64)> {
        self.deliveries.iter().map(key_of).collect()
    }
}

/// Consumes through `client` until `stop` turns true, acking every
/// delivery on the stream and reopening the stream if it breaks.
async fn consume_into(
    client: Client,
    consumed: Arc<Mutex<Consumed>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut pending_acks: HashMap<String, (String, u64)> = HashMap::new();
    while !*stop.borrow() {
        let Ok(mut consumer) = client.consume("default", CREDITS).await else {
            let _stopped_or_retry =
                tokio::time::timeout(RECONNECT_WAIT, stop.wait_for(|stop| *stop)).await;
            continue;
        };
        loop {
            let event = tokio::select! {
                event = consumer.next() => event,
                _ = stop.wait_for(|stop| *stop) => return,
            };
            match event {
                Ok(Some(ConsumerEvent::Delivery(delivery))) => {
                    let key = key_of(&delivery);
                    {
                        let mut consumed = consumed.lock().unwrap();
                        if consumed.acked.contains(&key) {
                            consumed.returned_after_ack.push(key.clone());
                        }
                        consumed.deliveries.push(delivery.clone());
                    }
                    pending_acks.insert(delivery.delivery_id.clone(), key);
                    if consumer.ack(vec![delivery.delivery_id]).await.is_err()
                        || consumer.credit(1).await.is_err()
                    {
                        break;
                    }
                }
                Ok(Some(ConsumerEvent::Settled(outcomes))) => {
                    let mut consumed = consumed.lock().unwrap();
                    for outcome in outcomes {
                        if let Some(key) = pending_acks.remove(&outcome.delivery_id)
                            && outcome.code == Code::Ok as i32
                        {
                            consumed.acked.insert(key);
                        }
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
}

/// Consumes through `client` until every message of `expected` was
/// delivered at least once (panics after [`DRAIN_DEADLINE`]).
async fn drain_through(client: Client, expected: &HashSet<(String, u64)>) -> Consumed {
    let consumed: Arc<Mutex<Consumed>> = Arc::default();
    let (stop, stopped) = watch::channel(false);
    let consumer = tokio::spawn(consume_into(client, consumed.clone(), stopped));
    eventually(DRAIN_DEADLINE, "every expected message delivered", || {
        let consumed = consumed.clone();
        async move { expected.is_subset(&consumed.lock().unwrap().first_deliveries()) }
    })
    .await;
    stop.send_replace(true);
    consumer.await.unwrap();
    Arc::try_unwrap(consumed)
        .map(|m| m.into_inner().unwrap())
        .unwrap_or_else(|_| panic!("the consumer task still holds the record"))
}

/// Sends `messages_per_batch`-message batches for `producer` through
/// `client` until `stop` is set or `batches` were sent, recording what was
/// acknowledged; pauses `pace` between batches.
async fn produce_into(
    client: Client,
    producer: String,
    batches: u64,
    messages_per_batch: u64,
    pace: Duration,
    acknowledged: Arc<Mutex<Vec<(String, u64)>>>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let mut idempotent = client.producer("default", &producer);
    for batch in 0..batches {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let counters = batch * messages_per_batch..(batch + 1) * messages_per_batch;
        let messages = counters.clone().map(|c| message(&producer, c)).collect();
        idempotent
            .send(messages)
            .await
            .map_err(|e| format!("{producer} batch {batch}: {e}"))?;
        acknowledged
            .lock()
            .unwrap()
            .extend(counters.map(|c| (producer.clone(), c)));
        tokio::time::sleep(pace).await;
    }
    Ok(())
}

/// Sends 5 batches of 5 messages for each of 4 producers `{prefix}-<i>`
/// through `client`, one producer after another; panics naming `nodes_up`
/// if one is not acknowledged.
async fn produce_five_batches_each(
    client: &Client,
    prefix: &str,
    acknowledged: &Arc<Mutex<Vec<(String, u64)>>>,
    nodes_up: &str,
) {
    let never = Arc::new(AtomicBool::new(false));
    for i in 0..4u64 {
        produce_into(
            client.clone(),
            format!("{prefix}-{i}"),
            5,
            5,
            Duration::ZERO,
            acknowledged.clone(),
            never.clone(),
        )
        .await
        .unwrap_or_else(|e| panic!("produce with {nodes_up}: {e}"));
    }
}

/// Sends `batches` batches of `per_batch` messages for each of `count`
/// producers `tenant-<i>` at once, producer i through `client_of(i)`;
/// returns what was acknowledged (all of it, or the test fails).
async fn produce_all(
    count: u64,
    client_of: impl Fn(u64) -> Client,
    batches: u64,
    per_batch: u64,
) -> Arc<Mutex<Vec<(String, u64)>>> {
    let acknowledged: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let never = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..count)
        .map(|i| {
            tokio::spawn(produce_into(
                client_of(i),
                format!("tenant-{i}"),
                batches,
                per_batch,
                Duration::ZERO,
                acknowledged.clone(),
                never.clone(),
            ))
        })
        .collect();
    for producer in producers {
        producer.await.unwrap().expect("produce");
    }
    acknowledged
}

/// Waits (30 s at most) until `at_least` produces were acknowledged.
async fn wait_for_acknowledged(
    acknowledged: &Arc<Mutex<Vec<(String, u64)>>>,
    at_least: usize,
    what: &str,
) {
    eventually(Duration::from_secs(30), what, || {
        let count = acknowledged.lock().unwrap().len();
        async move { count >= at_least }
    })
    .await;
}

/// Per producer, whether first deliveries came in counter order.
fn order_violations(deliveries: &[Delivery]) -> Vec<String> {
    let mut seen: HashSet<(String, u64)> = HashSet::new();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    let mut violations = Vec::new();
    for delivery in deliveries {
        let key = key_of(delivery);
        if !seen.insert(key.clone()) {
            continue;
        }
        if let Some(&previous) = last.get(&key.0)
            && key.1 < previous
        {
            violations.push(format!("{} got {} after {previous}", key.0, key.1));
        }
        last.insert(key.0, key.1);
    }
    violations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_produced_through_a_non_leader_is_lost_or_duplicated() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    let acknowledged = produce_all(9, |i| cluster.client(i % 3 + 1), 20, 10).await;
    let consumed: Arc<Mutex<Consumed>> = Arc::default();
    let (stop, stopped) = watch::channel(false);
    let consumer = tokio::spawn(consume_into(cluster.client(2), consumed.clone(), stopped));
    eventually(
        DRAIN_DEADLINE,
        "draining 1,800 messages through node 2",
        || {
            let consumed = consumed.clone();
            async move {
                let consumed = consumed.lock().unwrap();
                consumed.deliveries.len() >= 1_800 && consumed.acked.len() >= 1_800
            }
        },
    )
    .await;
    stop.send_replace(true);
    consumer.await.unwrap();

    {
        let consumed = consumed.lock().unwrap();
        let expected: HashSet<_> = acknowledged.lock().unwrap().iter().cloned().collect();
        assert_eq!(expected.len(), 1_800);
        assert_eq!(consumed.first_deliveries(), expected);
        assert_eq!(
            consumed.deliveries.len(),
            1_800,
            "duplicates without a fault"
        );
        assert!(consumed.deliveries.iter().all(|d| d.attempt == 1));
        assert_eq!(order_violations(&consumed.deliveries), Vec::<String>::new());
    }
    let follower_view = cluster.client(3);
    eventually(
        Duration::from_secs(10),
        "every ack applied on node 3",
        || {
            let follower_view = follower_view.clone();
            async move {
                let stats = follower_view.queue_stats("default").await.unwrap();
                stats.queues[0].backlog_messages == 0
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_message_lost_when_a_shard_leader_is_killed() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    kill_a_shard_leader_under_load(cluster, DRAIN_DEADLINE).await;
}

/// The same over TLS on the client ports and mutual TLS between the nodes,
/// with certificates `floret certs` made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_message_lost_when_a_shard_leader_is_killed_over_tls() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start_tls(dir.path(), 3, &["--shards", SHARDS]);
    kill_a_shard_leader_under_load(cluster, DRAIN_DEADLINE).await;
}

/// Produces through every node and consumes through one while shard 0's
/// leader is killed and restarted: every acknowledged message is delivered,
/// nothing unexpected is, in order, with few duplicates; the last of them
/// within `drained_after_restart` of the restart.
async fn kill_a_shard_leader_under_load(mut cluster: Cluster, drained_after_restart: Duration) {
    let victim = cluster.leader_of(0, 1).await;
    let survivor = victim % 3 + 1;

    let consumed: Arc<Mutex<Consumed>> = Arc::default();
    let (stop_consuming, consuming_stopped) = watch::channel(false);
    let consumer = tokio::spawn(consume_into(
        cluster.client(survivor),
        consumed.clone(),
        consuming_stopped,
    ));
    let acknowledged: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let stop_producing = Arc::new(AtomicBool::new(false));
    let every_node = cluster.client_of(&cluster.addresses());
    let placement = ShardPlacement::new(SHARDS.parse().unwrap());
    let on_shard_0: Vec<String> = (0..)
        .map(|i| format!("tenant-{i}"))
        .filter(|p| placement.shard_of("default", p) == 0)
        .take(3)
        .collect();
    let tenants: Vec<String> = (0..9)
        .map(|i| format!("tenant-{i}"))
        .chain(on_shard_0.iter().cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let producers: Vec<_> = tenants
        .iter()
        .map(|tenant| {
            tokio::spawn(produce_into(
                every_node.clone(),
                tenant.clone(),
                u64::MAX,
                4,
                Duration::from_millis(20),
                acknowledged.clone(),
                stop_producing.clone(),
            ))
        })
        .collect();
    wait_for_acknowledged(&acknowledged, 500, "500 acknowledged produces").await;

    let before_kill = acknowledged.lock().unwrap().len();
    cluster.kill(victim);
    let killed_at = Instant::now();
    eventually(
        Duration::from_secs(30),
        "an acknowledged produce on shard 0 after its leader was killed",
        || {
            let (acknowledged, on_shard_0) = (acknowledged.clone(), on_shard_0.clone());
            async move {
                acknowledged.lock().unwrap()[before_kill..]
                    .iter()
                    .any(|(producer, _)| on_shard_0.contains(producer))
            }
        },
    )
    .await;
    let recovered_after = killed_at.elapsed();
    let new_leader = cluster.leader_of(0, survivor).await;
    assert_ne!(new_leader, victim, "shard 0 still led by the killed node");
    wait_for_acknowledged(
        &acknowledged,
        before_kill + 300,
        "300 more acknowledged produces after the failover",
    )
    .await;
    tokio::task::block_in_place(|| cluster.restart(victim));
    let restarted_at = Instant::now();
    let before_restart = acknowledged.lock().unwrap().len();
    wait_for_acknowledged(
        &acknowledged,
        before_restart + 300,
        "300 more acknowledged produces after the restart",
    )
    .await;
    stop_producing.store(true, Ordering::Relaxed);
    for producer in producers {
        producer
            .await
            .unwrap()
            .expect("no produce failed across the failover");
    }

    let expected: HashSet<_> = acknowledged.lock().unwrap().iter().cloned().collect();
    eventually(
        drained_after_restart.saturating_sub(restarted_at.elapsed()),
        "every acknowledged message delivered",
        || {
            let (consumed, expected) = (consumed.clone(), expected.clone());
            async move {
                let consumed = consumed.lock().unwrap();
                expected.is_subset(&consumed.first_deliveries())
            }
        },
    )
    .await;
    stop_consuming.send_replace(true);
    consumer.await.unwrap();

    let consumed = consumed.lock().unwrap();
    let delivered = consumed.first_deliveries();
    assert!(
        delivered.is_subset(&expected),
        "delivered what no producer sent"
    );
    assert_eq!(consumed.returned_after_ack, Vec::<(String, u64)>::new());
    assert_eq!(order_violations(&consumed.deliveries), Vec::<String>::new());
    let duplicates = consumed.deliveries.len() - delivered.len();
    // One in-flight window lost with the killed leader's leases, one more
    // when its shards' leadership returns to it.
    assert!(
        duplicates <= 2 * (CREDITS as usize + 3),
        "{duplicates} duplicates for an in-flight window of {CREDITS}"
    );
    eprintln!(
        "{} acknowledged, {} deliveries, {duplicates} duplicates; produce on the killed leader's shard resumed {recovered_after:?} after the kill; all delivered {:?} after the restart",
        expected.len(),
        consumed.deliveries.len(),
        restarted_at.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_acknowledged_without_a_majority() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("floret.toml");
    std::fs::write(&config, "[batching]\ncommit_timeout_ms = 2000\n").unwrap();
    let commit_timeout = Duration::from_millis(2_000);
    let config = config.to_str().unwrap().to_owned();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS, "--config", &config]);
    let acknowledged: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    produce_five_batches_each(&cluster.client(1), "tenant", &acknowledged, "every node up").await;

    cluster.kill(2);
    cluster.kill(3);
    let survivor = cluster.client(1);
    let refused = Arc::new(AtomicU64::new(0));
    let slowest = Arc::new(Mutex::new(Duration::ZERO));
    let attempts = (0..1_000u64).map(|i| {
        let (survivor, refused, slowest) = (survivor.clone(), refused.clone(), slowest.clone());
        async move {
            let started = Instant::now();
            let producer = format!("tenant-{i}");
            let result = survivor
                .produce("default", &producer, vec![message(&producer, 1_000 + i)])
                .await;
            match result {
                Err(floret_client::ClientError::Status(status))
                    if status.code() == Code::Unavailable =>
                {
                    refused.fetch_add(1, Ordering::Relaxed);
                    let took = started.elapsed();
                    let mut slowest = slowest.lock().unwrap();
                    *slowest = (*slowest).max(took);
                }
                other => panic!("produce with two of three nodes down answered {other:?}"),
            }
        }
    });
    futures::future::join_all(attempts).await;
    assert_eq!(refused.load(Ordering::Relaxed), 1_000);
    let slowest = *slowest.lock().unwrap();
    assert!(
        slowest < commit_timeout + Duration::from_secs(1),
        "the slowest of 1,000 queued produces was refused after {slowest:?}, past the commit timeout"
    );
    let status = survivor
        .cluster_status()
        .await
        .expect("status still answers");
    let reachable: Vec<bool> = status.nodes.iter().map(|n| n.reachable).collect();
    assert_eq!(reachable, [true, false, false]);

    tokio::task::block_in_place(|| {
        cluster.restart(2);
        cluster.restart(3);
    });
    let expected: HashSet<_> = acknowledged.lock().unwrap().iter().cloned().collect();
    drain_through(cluster.client(3), &expected).await;
}

/// A produce's answer names its shard's leader, also through a node that
/// forwarded it, so a client can send that producer's next produces there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_answer_names_a_node_that_does_not_lead_the_shard() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    cluster.wait_for_preferred_leaders(1).await;
    let placement = ShardPlacement::new(SHARDS.parse().unwrap());
    let producer = (0..)
        .map(|i| format!("tenant-{i}"))
        .find(|p| placement.shard_of("default", p) == 0)
        .expect("some producer lands on shard 0");
    let leader = cluster.leader_of(0, 1).await;
    let follower = leader % 3 + 1;

    let through_follower = cluster
        .client(follower)
        .produce("default", &producer, vec![message(&producer, 0)])
        .await
        .expect("produce through a follower");
    assert_eq!(through_follower.leader_address, cluster.address(leader));

    let every_node = Client::connect_lazy(&cluster.addresses()).unwrap();
    let mut routed = every_node.producer("default", &producer);
    for counter in 1..=3 {
        let answer = routed
            .send(vec![message(&producer, counter)])
            .await
            .expect("produce through any node");
        assert_eq!(answer.leader_address, cluster.address(leader));
    }
    let expected: HashSet<_> = (0..=3).map(|c| (producer.clone(), c)).collect();
    drain_through(cluster.client(follower), &expected).await;
}

/// Appends reach a node on long-lived streams from its peers; a stopping
/// node must end them itself instead of waiting out its drain timeout for
/// the peers to close them, and the survivors must carry on without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_waits_for_peers_to_close_their_streams() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    let acknowledged: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    produce_five_batches_each(&cluster.client(1), "tenant", &acknowledged, "every node up").await;

    let exit = tokio::task::block_in_place(|| cluster.terminate(3, Duration::from_secs(30)));
    let log = cluster.log(3);
    assert!(
        exit.is_some_and(|status| status.success()),
        "node 3 did not stop cleanly ({exit:?}); its log:\n{log}"
    );
    assert!(
        log.contains("node stopped") && !log.contains("drain timeout"),
        "node 3 waited out its drain timeout; its log:\n{log}"
    );

    produce_five_batches_each(
        &cluster.client(1),
        "after",
        &acknowledged,
        "two of three nodes up",
    )
    .await;
    let expected: HashSet<_> = acknowledged.lock().unwrap().iter().cloned().collect();
    assert_eq!(expected.len(), 200);
    drain_through(cluster.client(2), &expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_with_wiped_data_dir_stays_behind() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("floret.toml");
    std::fs::write(
        &config,
        "[raft]\nsnapshot_every_entries = 50\nlogs_kept_after_snapshot = 5\n",
    )
    .unwrap();
    let config = config.to_str().unwrap().to_owned();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS, "--config", &config]);
    let acknowledged = produce_all(10, |i| cluster.client(i % 2 + 1), 100, 1).await;

    let node_3_log = cluster.data_dir(3).with_extension("log");
    let foundings = || {
        std::fs::read_to_string(&node_3_log)
            .unwrap()
            .matches("founding shard")
            .count()
    };
    let founded_before_wipe = foundings();
    assert!(
        founded_before_wipe > 0,
        "node 3 founded its preferred shards"
    );
    cluster.kill(3);
    std::fs::remove_dir_all(cluster.data_dir(3)).unwrap();
    tokio::task::block_in_place(|| cluster.restart(3));
    let rejoined = cluster.client(3);
    eventually(
        Duration::from_secs(60),
        "node 3 caught up on every shard",
        || {
            let rejoined = rejoined.clone();
            async move {
                let Ok(status) = rejoined.cluster_status().await else {
                    return false;
                };
                status.shards.iter().all(|shard| {
                    shard
                        .replicas
                        .iter()
                        .any(|r| r.node_id == 3 && r.reachable && r.lag == 0 && r.applied_index > 0)
                })
            }
        },
    )
    .await;
    assert_eq!(
        foundings(),
        founded_before_wipe,
        "node 3 founded a shard again after losing its data dir"
    );
    let log = std::fs::read_to_string(&node_3_log).unwrap();
    assert!(
        log.lines().any(|line| line.contains("WARN")
            && line.contains("rejoining a shard after losing this node's data")),
        "a node that lost its data dir says so (a new cluster's slow member does not)"
    );
    let peer = cluster.client(2);
    eventually(
        Duration::from_secs(30),
        "node 3's own replicas hold what node 2's hold",
        || {
            let (rejoined, peer) = (rejoined.clone(), peer.clone());
            async move {
                let (Ok(own), Ok(other)) = (
                    rejoined.replica_digests().await,
                    peer.replica_digests().await,
                ) else {
                    return false;
                };
                !own.is_empty() && own == other
            }
        },
    )
    .await;

    cluster.kill(1);
    eventually(
        Duration::from_secs(30),
        "the membership group, node 3's wiped replica in it, elects a leader without node 1",
        || {
            let rejoined = rejoined.clone();
            async move {
                let Some(membership) = membership_via(&rejoined).await else {
                    return false;
                };
                assert_eq!(
                    members_and_votes(&membership),
                    [(1, true), (2, true), (3, true)]
                );
                membership.leader_id == 2 || membership.leader_id == 3
            }
        },
    )
    .await;
    let expected: HashSet<_> = acknowledged.lock().unwrap().iter().cloned().collect();
    drain_through(cluster.client(3), &expected).await;
}

/// The member list as the node `client` dials reports it, once founded.
async fn membership_via(client: &Client) -> Option<floret_client::Membership> {
    let status = client.cluster_status().await.ok()?;
    status
        .membership
        .filter(|membership| membership.epoch.is_some())
}

fn members_and_votes(membership: &floret_client::Membership) -> Vec<(u64, bool)> {
    membership
        .members
        .iter()
        .map(|member| (member.node_id, member.voter))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_founds_its_membership_group_once_with_every_member_voting() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    let peer_address_of_3 = cluster.peer_address(3);
    for node in 1..=3 {
        let (client, peer_address_of_3) = (cluster.client(node), peer_address_of_3.clone());
        eventually(
            Duration::from_secs(20),
            "every node reports the founding members",
            || {
                let (client, peer_address_of_3) = (client.clone(), peer_address_of_3.clone());
                async move {
                    let Some(membership) = membership_via(&client).await else {
                        return false;
                    };
                    assert_eq!(
                        members_and_votes(&membership),
                        [(1, true), (2, true), (3, true)]
                    );
                    assert_eq!(membership.members[2].peer_address, peer_address_of_3);
                    membership.leader_id != 0
                }
            },
        )
        .await;
    }
    for node in 1..=3 {
        tokio::task::block_in_place(|| cluster.restart(node));
    }
    let client = cluster.client(2);
    eventually(
        Duration::from_secs(20),
        "the restarted nodes hold the same members",
        || {
            let client = client.clone();
            async move {
                membership_via(&client).await.is_some_and(|membership| {
                    members_and_votes(&membership) == [(1, true), (2, true), (3, true)]
                        && membership.leader_id != 0
                })
            }
        },
    )
    .await;
    let foundings: usize = (1..=3)
        .map(|node| {
            std::fs::read_to_string(cluster.data_dir(node).with_extension("log"))
                .unwrap()
                .matches("founding the membership group")
                .count()
        })
        .sum();
    assert_eq!(
        foundings, 1,
        "the membership group is founded once, by node 1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_forgotten_when_its_shard_leader_is_killed() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    let placement = ShardPlacement::new(SHARDS.parse().unwrap());
    let shard = placement.shard_of("default", "capped");
    let victim = cluster.leader_of(shard, 1).await;
    let survivor = victim % 3 + 1;
    let set_through = victim % 3 + 1;
    let client = cluster.client(set_through);
    let limit = floret_client::Policy {
        max_messages: Some(2),
        overflow: floret_client::Overflow::Reject as i32,
        ..Default::default()
    };
    client
        .set_policy("default", "capped", limit, false)
        .await
        .expect("set through a node that does not lead the shard");
    let queue_defaults = floret_client::Policy {
        weight: Some(2),
        ..Default::default()
    };
    client
        .set_policy("default", "", queue_defaults, false)
        .await
        .expect("queue defaults committed in every shard");
    client
        .produce(
            "default",
            "capped",
            vec![message("capped", 0), message("capped", 1)],
        )
        .await
        .unwrap();

    cluster.kill(victim);
    let new_leader = cluster.leader_of(shard, survivor).await;
    assert_ne!(new_leader, victim);
    let impatient = cluster
        .client(survivor)
        .with_retry(floret_client::RetryPolicy {
            give_up_after: Duration::ZERO,
            ..Default::default()
        });
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        match impatient
            .produce("default", "capped", vec![message("capped", 2)])
            .await
        {
            Err(floret_client::ClientError::Status(status))
                if status.code() != Code::Unavailable =>
            {
                break status.code();
            }
            Ok(_) => panic!("the limit was forgotten after failover"),
            Err(error) => {
                assert!(
                    Instant::now() < deadline,
                    "no answer from the new leader: {error}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(refused, Code::ResourceExhausted);
    let answer = cluster
        .client(survivor)
        .get_policy("default", "capped")
        .await
        .unwrap();
    assert_eq!(answer.producer_override.unwrap().max_messages, Some(2));
    assert_eq!(answer.effective.unwrap().weight, Some(2));
}
