//! Changing members while the cluster serves: a node added to a running
//! three-node cluster takes the replicas the ring gives it, a member killed
//! and then removed gives its replicas to the others, and every message
//! acknowledged through the changes is still delivered after. A member
//! killed and wiped is replaced by a new node that takes its seat.
//! (`grow_shrink.rs` grows a cluster to five and back under load.)
//! A replica a move took away is retired: its node deletes its state (and
//! a member removed alive leaves only once it has), and a shard that
//! comes back to a node that retired it starts there afresh.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use floret_chaos::process::poll;
use floret_client::{Client, ClusterStatusResponse};
use floret_proto::v1::ShardStatus;

use super::harness::{Cluster, eventually, one_cluster_at_a_time};
use super::{SHARDS, drain_through, produce_into, wait_for_acknowledged};

const PRODUCERS: u64 = 6;
/// The longest every shard may take to reach its new replicas.
pub(super) const MOVE_DEADLINE: Duration = Duration::from_secs(90);

/// Whether `shard` has a leader, no learner, and its voters where the
/// placement puts it.
fn is_settled(shard: &ShardStatus) -> bool {
    let voters: BTreeSet<u64> = shard.voters.iter().copied().collect();
    let placed: BTreeSet<u64> = shard.placed.iter().copied().collect();
    let replicas: BTreeSet<u64> = shard.replicas.iter().map(|r| r.node_id).collect();
    shard.leader_id != 0 && replicas == voters && voters == placed
}

/// Each shard's voters in `status`, once every shard [`is_settled`].
fn settled_voters_in(status: &ClusterStatusResponse) -> Option<Vec<BTreeSet<u64>>> {
    status
        .shards
        .iter()
        .map(|shard| is_settled(shard).then(|| shard.voters.iter().copied().collect()))
        .collect()
}

/// Waits until every shard has three voters, all of them in `members`,
/// and the members together hold every shard `members` should, and
/// returns each shard's voters as that status reported them (a second
/// status could catch a leadership hand-off under way); past
/// [`MOVE_DEADLINE`] it panics naming each shard that had not settled.
pub(super) async fn wait_for_replicas_on(
    client: &Client,
    members: &[u64],
    what: &str,
) -> Vec<BTreeSet<u64>> {
    let members: BTreeSet<u64> = members.iter().copied().collect();
    let last_seen = Mutex::new(String::from("no cluster status"));
    let settled = poll(MOVE_DEADLINE, Duration::from_millis(20), || async {
        let status = match client.cluster_status().await {
            Ok(status) => status,
            Err(error) => {
                *last_seen.lock().unwrap() = format!("cluster status failed: {error}");
                return None;
            }
        };
        let Some(voters) = settled_voters_in(&status) else {
            *last_seen.lock().unwrap() = unsettled_shards(&status);
            return None;
        };
        let held: BTreeSet<u64> = voters.iter().flatten().copied().collect();
        let on_members = voters.len() == SHARDS.parse::<usize>().unwrap()
            && voters
                .iter()
                .all(|set| set.len() == 3 && set.is_subset(&members))
            && held == members;
        if !on_members {
            *last_seen.lock().unwrap() = format!("settled elsewhere: voters {voters:?}");
        }
        on_members.then_some(voters)
    })
    .await;
    settled.unwrap_or_else(|| {
        panic!(
            "{what} did not happen within {MOVE_DEADLINE:?}; last seen: {}",
            last_seen.lock().unwrap()
        )
    })
}

/// Each shard of `status` that has not settled: its leader, voters,
/// learners, placement and replicas' progress.
fn unsettled_shards(status: &ClusterStatusResponse) -> String {
    status
        .shards
        .iter()
        .filter(|shard| !is_settled(shard))
        .map(|shard| {
            let replicas: Vec<String> = shard
                .replicas
                .iter()
                .map(|r| format!("{}@{}{}", r.node_id, r.applied_index, if r.reachable { "" } else { "?" }))
                .collect();
            format!(
                "shard {} leader {} term {} voters {:?} learners {:?} placed {:?} committed {} replicas [{}]",
                shard.shard_id,
                shard.leader_id,
                shard.term,
                shard.voters,
                shard.learners,
                shard.placed,
                shard.configuration_committed,
                replicas.join(" ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Adds node 4 to the three-node `cluster` through node `via`, starts it,
/// waits until every shard settled over nodes 1-4, and returns how many
/// shards node 4 took.
pub(super) async fn add_node_4(cluster: &mut Cluster, via: u64) -> usize {
    let membership = cluster
        .client(via)
        .add_node(4, &cluster.next_peer_address())
        .await
        .expect("add node 4");
    let members: Vec<u64> = membership.members.iter().map(|m| m.node_id).collect();
    assert_eq!(members, [1, 2, 3, 4]);
    assert_eq!(tokio::task::block_in_place(|| cluster.join()), 4);
    wait_for_replicas_on(
        &cluster.client(via),
        &[1, 2, 3, 4],
        "every shard at three replicas over four nodes, node 4 among them",
    )
    .await
    .iter()
    .filter(|voters| voters.contains(&4))
    .count()
}

/// What a node logs each time it deletes a retired replica's state.
const RETIRED: &str = "retired this node's replica";

/// How many replicas node `id` has retired, as its log records them.
pub(super) fn retired_on(cluster: &Cluster, id: u64) -> usize {
    cluster.log(id).matches(RETIRED).count()
}

/// Waits until nodes `nodes` have retired `count` replicas together, and
/// no node the cluster status through `client` reports has one left.
pub(super) async fn wait_for_retirements(
    cluster: &Cluster,
    client: &Client,
    nodes: &[u64],
    count: usize,
) {
    let what = format!("{count} replicas retired on nodes {nodes:?}");
    eventually(MOVE_DEADLINE, &what, || async {
        let retired: usize = nodes.iter().map(|&node| retired_on(cluster, node)).sum();
        let none_left = client.cluster_status().await.is_ok_and(|status| {
            status
                .nodes
                .iter()
                .all(|node| !node.reachable || node.stale_replicas.is_empty())
        });
        retired == count && none_left
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
pub(super) async fn wait_for_members(client: &Client, members: &[u64], what: &str) {
    eventually(MOVE_DEADLINE, what, || async {
        member_ids(client).await == members
    })
    .await;
}

/// [`PRODUCERS`] idempotent producers sending 5 messages per call every
/// 20 ms through one client, until stopped.
pub(super) struct SteadyProducers {
    pub(super) acknowledged: Arc<Mutex<Vec<(String, u64)>>>,
    stop: Arc<AtomicBool>,
    producers: Vec<tokio::task::JoinHandle<Result<(), String>>>,
}

impl SteadyProducers {
    pub(super) fn start(client: Client) -> Self {
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
    pub(super) async fn stop(self) -> HashSet<(String, u64)> {
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

    let moved_to_4 = add_node_4(&mut cluster, 2).await;
    assert_eq!(member_ids(&cluster.client(4)).await, [1, 2, 3, 4]);
    assert!(moved_to_4 > 0, "node 4 took no replica");
    wait_for_retirements(&cluster, &cluster.client(1), &[1, 2, 3], moved_to_4).await;
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
    add_node_4(&mut cluster, 1).await;
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

/// Waits until every node of `nodes` reports, for every shard it holds,
/// the same applied index and state digest as the others.
pub(super) async fn wait_for_equal_digests(cluster: &Cluster, nodes: &[u64]) {
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
