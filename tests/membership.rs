//! Changing members while the cluster serves: a node added to a running
//! three-node cluster takes the replicas the ring gives it, a member killed
//! and then removed gives its replicas to the others, and every message
//! acknowledged through the changes is still delivered after. A member
//! killed and wiped is replaced by a new node that takes its seat. Grown to
//! five and shrunk back to three (one node dead, one alive) under 10
//! idempotent producers and 3 consumers given the first three addresses,
//! no produce call fails, the p99 stays under 2 s, and the replicas agree.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floret_client::Client;
use tokio::sync::watch;

use super::harness::{Cluster, eventually, one_cluster_at_a_time};
use super::rolling_restart::{
    Consumed, collect_produced, consume_steadily, percentile, produce_steadily,
    wait_for_every_delivery,
};
use super::{SHARDS, drain_through, produce_into, wait_for_acknowledged};

const PRODUCERS: u64 = 6;
/// The longest every shard may take to reach its new replicas.
const MOVE_DEADLINE: Duration = Duration::from_secs(90);

/// Each shard's voters as the cluster status through `client` reports
/// them, once every shard has a leader, no learner, and its voters where
/// the placement puts it.
async fn settled_voters(client: &Client) -> Option<Vec<BTreeSet<u64>>> {
    let status = client.cluster_status().await.ok()?;
    status
        .shards
        .iter()
        .map(|shard| {
            let voters: BTreeSet<u64> = shard.voters.iter().copied().collect();
            let placed: BTreeSet<u64> = shard.placed.iter().copied().collect();
            let replicas: BTreeSet<u64> = shard.replicas.iter().map(|r| r.node_id).collect();
            (shard.leader_id != 0 && replicas == voters && voters == placed).then_some(voters)
        })
        .collect()
}

/// Waits until every shard has three voters, all of them in `members`,
/// and the members together hold every shard `members` should.
async fn wait_for_replicas_on(client: &Client, members: &[u64], what: &str) {
    let members: BTreeSet<u64> = members.iter().copied().collect();
    eventually(MOVE_DEADLINE, what, || {
        let (client, members) = (client.clone(), members.clone());
        async move {
            let Some(voters) = settled_voters(&client).await else {
                return false;
            };
            let held: BTreeSet<u64> = voters.iter().flatten().copied().collect();
            voters.len() == SHARDS.parse::<usize>().unwrap()
                && voters
                    .iter()
                    .all(|set| set.len() == 3 && set.is_subset(&members))
                && held == members
        }
    })
    .await;
}

async fn member_ids(client: &Client) -> Vec<u64> {
    let status = client.cluster_status().await.expect("cluster status");
    status
        .membership
        .expect("a membership")
        .members
        .iter()
        .map(|member| member.node_id)
        .collect()
}

/// Waits until the members, as the cluster status through `client` shows
/// them, are `members`.
async fn wait_for_members(client: &Client, members: &[u64], what: &str) {
    eventually(MOVE_DEADLINE, what, || async {
        member_ids(client).await == members
    })
    .await;
}

/// [`PRODUCERS`] idempotent producers sending 5 messages per call every
/// 20 ms through one client, until stopped.
struct SteadyProducers {
    acknowledged: Arc<Mutex<Vec<(String, u64)>>>,
    stop: Arc<AtomicBool>,
    producers: Vec<tokio::task::JoinHandle<Result<(), String>>>,
}

impl SteadyProducers {
    fn start(client: Client) -> Self {
        let acknowledged: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let producers = (0..PRODUCERS)
            .map(|n| {
                tokio::spawn(produce_into(
                    client.clone(),
                    format!("p{n}"),
                    u64::MAX,
                    5,
                    Duration::from_millis(20),
                    acknowledged.clone(),
                    stop.clone(),
                ))
            })
            .collect();
        Self {
            acknowledged,
            stop,
            producers,
        }
    }

    /// Stops them, checks that every produce was acknowledged, and
    /// returns every acknowledged message.
    async fn stop(self) -> HashSet<(String, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        for producer in self.producers {
            producer.await.unwrap().expect("every produce acknowledged");
        }
        self.acknowledged.lock().unwrap().iter().cloned().collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_message_lost_when_a_node_joins_and_a_dead_member_is_removed() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    cluster.wait_for_preferred_leaders(1).await;
    let producing = SteadyProducers::start(cluster.client_of(&cluster.addresses()));
    let acknowledged = producing.acknowledged.clone();
    wait_for_acknowledged(&acknowledged, 200, "before the change").await;

    let membership = cluster
        .client(2)
        .add_node(4, &cluster.next_peer_address())
        .await
        .expect("add node 4");
    let members: Vec<u64> = membership.members.iter().map(|m| m.node_id).collect();
    assert_eq!(members, [1, 2, 3, 4]);
    let joined = tokio::task::block_in_place(|| cluster.join());
    assert_eq!(joined, 4);
    wait_for_replicas_on(
        &cluster.client(1),
        &[1, 2, 3, 4],
        "every shard at three replicas over four nodes, node 4 among them",
    )
    .await;
    assert_eq!(member_ids(&cluster.client(4)).await, [1, 2, 3, 4]);
    let before_kill = acknowledged.lock().unwrap().len();
    wait_for_acknowledged(&acknowledged, before_kill + 200, "after node 4 joined").await;

    cluster.kill(2);
    let membership = cluster
        .client(3)
        .remove_node(2)
        .await
        .expect("remove the dead node 2");
    let leaving: Vec<(u64, bool)> = membership
        .members
        .iter()
        .map(|m| (m.node_id, m.leaving))
        .collect();
    assert_eq!(leaving, [(1, false), (2, true), (3, false), (4, false)]);
    wait_for_replicas_on(
        &cluster.client(4),
        &[1, 3, 4],
        "every shard at three replicas over nodes 1, 3 and 4",
    )
    .await;
    let client_4 = cluster.client(4);
    wait_for_members(&client_4, &[1, 3, 4], "node 2 out of the membership group").await;
    let before_stop = acknowledged.lock().unwrap().len();
    wait_for_acknowledged(&acknowledged, before_stop + 200, "after node 2 left").await;

    let expected = producing.stop().await;
    drain_through(cluster.client(4), &expected).await;
}

/// Each member's id and seat, as the cluster status through `client`
/// reports them.
async fn member_seats(client: &Client) -> Vec<(u64, u64)> {
    let status = client.cluster_status().await.expect("cluster status");
    status
        .membership
        .expect("a membership")
        .members
        .iter()
        .map(|member| (member.node_id, member.seat))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_message_lost_when_a_wiped_node_is_replaced_by_a_new_one() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    cluster.wait_for_preferred_leaders(1).await;
    let producing = SteadyProducers::start(cluster.client_of(&cluster.addresses()));
    let acknowledged = producing.acknowledged.clone();
    wait_for_acknowledged(&acknowledged, 200, "before node 2 dies").await;

    cluster.kill(2);
    std::fs::remove_dir_all(cluster.data_dir(2)).expect("wipe node 2's data dir");
    let peer_address = cluster.next_peer_address();
    let membership = cluster
        .client(1)
        .replace_node(2, 4, &peer_address)
        .await
        .expect("replace the dead node 2 by node 4");
    let seats: Vec<(u64, u64, bool)> = membership
        .members
        .iter()
        .map(|m| (m.node_id, m.seat, m.leaving))
        .collect();
    assert_eq!(
        seats,
        [(1, 1, false), (2, 2, true), (3, 3, false), (4, 2, false)]
    );
    let again = cluster
        .client(3)
        .replace_node(2, 4, &peer_address)
        .await
        .expect("the same replacement again changes nothing");
    assert_eq!(again.members.len(), 4);
    let refused = cluster
        .client(1)
        .replace_node(3, 1, &peer_address)
        .await
        .expect_err("a member cannot replace another");
    assert!(
        refused.to_string().contains("already a member"),
        "{refused}"
    );
    assert_eq!(tokio::task::block_in_place(|| cluster.join()), 4);
    wait_for_replicas_on(
        &cluster.client(1),
        &[1, 3, 4],
        "every shard at three replicas over nodes 1, 3 and 4",
    )
    .await;
    let client_4 = cluster.client(4);
    wait_for_members(&client_4, &[1, 3, 4], "node 2 out of the membership group").await;
    assert_eq!(member_seats(&client_4).await, [(1, 1), (3, 3), (4, 2)]);
    let status = client_4.cluster_status().await.expect("cluster status");
    let nodes: Vec<u64> = status.nodes.iter().map(|node| node.node_id).collect();
    assert!(nodes.contains(&4), "node 4 in the status: {nodes:?}");
    let refused = cluster
        .client(1)
        .add_node(2, &cluster.peer_address(2))
        .await
        .expect_err("node 2's seat is node 4's now");
    assert!(refused.to_string().contains("seat 2"), "{refused}");
    let before_stop = acknowledged.lock().unwrap().len();
    wait_for_acknowledged(&acknowledged, before_stop + 200, "after node 4 took over").await;

    let expected = producing.stop().await;
    drain_through(cluster.client(4), &expected).await;
    wait_for_equal_digests(&cluster, &[1, 3, 4]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_member_below_the_replication_factor_is_refused() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    let refused = cluster
        .client(1)
        .remove_node(3)
        .await
        .expect_err("3 members and a replication factor of 3");
    assert!(
        refused
            .to_string()
            .contains("fewer than the replication factor"),
        "{refused}"
    );
    assert_eq!(member_ids(&cluster.client(3)).await, [1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joining_a_tls_cluster_is_refused_by_the_peer_port() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start_tls(dir.path(), 3, &["--shards", SHARDS]);
    let acknowledged: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let never = Arc::new(AtomicBool::new(false));
    produce_into(
        cluster.client(1),
        "before".into(),
        10,
        5,
        Duration::ZERO,
        acknowledged.clone(),
        never.clone(),
    )
    .await
    .expect("produce before the change");
    cluster
        .client(1)
        .add_node(4, &cluster.next_peer_address())
        .await
        .expect("add node 4");
    tokio::task::block_in_place(|| cluster.join());
    wait_for_replicas_on(
        &cluster.client(1),
        &[1, 2, 3, 4],
        "every shard at three replicas over four nodes over mutual TLS",
    )
    .await;
    produce_into(
        cluster.client(4),
        "after".into(),
        10,
        5,
        Duration::ZERO,
        acknowledged.clone(),
        never,
    )
    .await
    .expect("produce through the new node");
    let expected: HashSet<_> = acknowledged.lock().unwrap().iter().cloned().collect();
    drain_through(cluster.client(4), &expected).await;
}

/// The longest a produce call may take at the 99th percentile while
/// shards move.
const MAX_PRODUCE_STALL_P99: Duration = Duration::from_secs(2);

/// Waits until every node of `nodes` reports, for every shard it holds,
/// the same applied index and state digest as the others.
async fn wait_for_equal_digests(cluster: &Cluster, nodes: &[u64]) {
    eventually(MOVE_DEADLINE, "equal replica digests", || async {
        let mut by_shard: std::collections::BTreeMap<u32, BTreeSet<(u64, u64)>> =
            Default::default();
        for &node in nodes {
            let Ok(replicas) = cluster.client(node).replica_digests().await else {
                return false;
            };
            for replica in replicas {
                by_shard
                    .entry(replica.shard_id)
                    .or_default()
                    .insert((replica.applied_index, replica.digest));
            }
        }
        by_shard.values().all(|states| states.len() == 1)
    })
    .await;
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
    let producers: Vec<_> = (0..10)
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
    for (node, members) in [(4, vec![1, 2, 3, 4]), (5, vec![1, 2, 3, 4, 5])] {
        let began = Instant::now();
        cluster
            .client(1)
            .add_node(node, &cluster.next_peer_address())
            .await
            .unwrap_or_else(|e| panic!("add node {node}: {e}"));
        assert_eq!(tokio::task::block_in_place(|| cluster.join()), node);
        wait_for_replicas_on(
            &cluster.client(1),
            &members,
            "the new node's replicas moved",
        )
        .await;
        took.push((format!("add {node}"), began.elapsed()));
    }
    let began = Instant::now();
    cluster.kill(2);
    cluster
        .client(1)
        .remove_node(2)
        .await
        .expect("remove the dead node 2");
    wait_for_replicas_on(&cluster.client(1), &[1, 3, 4, 5], "node 2's replicas moved").await;
    took.push(("remove 2 (dead)".to_owned(), began.elapsed()));
    let began = Instant::now();
    cluster
        .client(1)
        .remove_node(3)
        .await
        .expect("remove node 3");
    let client_1 = cluster.client(1);
    wait_for_members(&client_1, &[1, 4, 5], "node 3 out of the membership group").await;
    let exit = cluster.terminate(3, MOVE_DEADLINE);
    assert!(
        exit.is_some_and(|status| status.success()),
        "node 3 stopped: {exit:?}"
    );
    wait_for_replicas_on(
        &cluster.client(1),
        &[1, 4, 5],
        "every shard on nodes 1, 4 and 5",
    )
    .await;
    took.push(("remove 3 (alive)".to_owned(), began.elapsed()));
    tokio::time::sleep(Duration::from_secs(2)).await;
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
        "grow to five, shrink to three: {calls} produce calls, 0 failed, p99 {p99:?}, slowest {slowest:?}; {} acknowledged, all delivered; each change until its shards settled: {took:?}",
        acknowledged.len()
    );
}
