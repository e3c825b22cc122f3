//! Retiring a replica is crash-safe: a node that gives up a replica when
//! node 4 joins is armed to crash in the middle of its first retirement
//! (once its durable mark is written, before anything is deleted).
//! Restarted, it finishes the interrupted retirement before it opens the
//! shard, and carries on. Every acknowledged message is delivered and the
//! replicas agree. A node restarted after it retired replicas serves
//! again, though it starts with the placement of its first members.

use floret_cluster::ReplicaPlacement;

use super::drain_through;
use super::harness::{Cluster, eventually, one_cluster_at_a_time};
use super::membership::{
    MOVE_DEADLINE, SteadyProducers, add_node_4, retired_on, wait_for_equal_digests,
    wait_for_replicas_on, wait_for_retirements,
};
use super::{SHARDS, wait_for_acknowledged};

/// What a node logs when a fault point crashes it.
const CRASHED: &str = "crashing at a fault point";
/// What a node logs when it finishes a retirement a crash interrupted.
const FINISHED: &str = "finishing the retirement of a replica that a crash interrupted";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs floret built with --features failpoints"
)]
async fn a_replica_half_retired_by_a_crash_is_served_again() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    cluster.wait_for_preferred_leaders(1).await;
    let shard_count: u32 = SHARDS.parse().unwrap();
    let (before, after) = (
        ReplicaPlacement::new(shard_count, &[1, 2, 3], 3),
        ReplicaPlacement::new(shard_count, &[1, 2, 3, 4], 3),
    );
    let armed = (1..=3)
        .find(|&node| {
            (0..shard_count).any(|shard| {
                before.replicas(shard).contains(&node) && !after.replicas(shard).contains(&node)
            })
        })
        .expect("node 4 takes a replica of one of nodes 1-3");
    tokio::task::block_in_place(|| {
        cluster.restart_with_failpoints(armed, "retire-mid-delete=1*return");
    });
    cluster.wait_for_preferred_leaders(1).await;
    let producing = SteadyProducers::start(cluster.client_of(&cluster.addresses()));
    wait_for_acknowledged(&producing.acknowledged, 200, "before the change").await;

    // Asked through a node that does not crash, as the moves settle.
    let unarmed = if armed == 1 { 2 } else { 1 };
    let moved_to_4 = add_node_4(&mut cluster, unarmed).await;

    let crashed = format!("node {armed} crashed retiring a replica ({moved_to_4} moved to node 4)");
    eventually(MOVE_DEADLINE, &crashed, || async {
        cluster.log(armed).contains(CRASHED)
    })
    .await;
    tokio::task::block_in_place(|| cluster.restart(armed));
    wait_for_retirements(&cluster, &cluster.client(4), &[1, 2, 3], moved_to_4 - 1).await;
    assert_eq!(
        cluster.log(armed).matches(FINISHED).count(),
        1,
        "node {armed} did not finish the retirement its crash interrupted"
    );
    let before_stop = producing.acknowledged.lock().unwrap().len();
    wait_for_acknowledged(
        &producing.acknowledged,
        before_stop + 200,
        "after the crashes",
    )
    .await;
    let expected = producing.stop().await;
    drain_through(cluster.client(4), &expected).await;
    wait_for_equal_digests(&cluster, &[1, 2, 3, 4]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_after_retiring_replicas_never_becomes_ready() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", SHARDS]);
    cluster.wait_for_preferred_leaders(1).await;
    let moved_to_4 = add_node_4(&mut cluster, 1).await;
    wait_for_retirements(&cluster, &cluster.client(1), &[1, 2, 3], moved_to_4).await;
    let retired_one = (1..=3)
        .find(|&node| retired_on(&cluster, node) > 0)
        .expect("a node retired a replica");

    // Its first members placed the retired shards on it, and no leader
    // will reach their fresh groups: readiness must follow the members.
    tokio::task::block_in_place(|| cluster.restart(retired_one));
    wait_for_replicas_on(
        &cluster.client(retired_one),
        &[1, 2, 3, 4],
        "every shard led after the restart",
    )
    .await;
}
