//! Delivery with the gossip view cut off: every node drops each gossip
//! datagram it would send (the `gossip-send-drop` fault point), as behind a
//! firewall that passes only TCP. Nothing that delivers messages may wait
//! for that view.

use std::time::Duration;

use super::harness::{Cluster, eventually, one_cluster_at_a_time};
use super::{SHARDS, kill_a_shard_leader_under_load};

/// How soon after the restart every acknowledged message must be delivered.
const DRAINED_AFTER_RESTART: Duration = Duration::from_secs(15);

/// A consumer on a surviving node gets every acknowledged message of a
/// kill and restart within 15 s of the restart, though no node ever hears
/// another's gossip: merges split credits by what each node reports on its
/// own consume stream. Before, a node the view had not heard from got one
/// credit at a time and its backlog waited. The nodes say in cluster status
/// that they hear no gossip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs floret built with --features failpoints"
)]
async fn messages_stranded_on_a_restarted_node_while_gossip_is_blocked() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start_with_failpoints(
        dir.path(),
        3,
        &["--shards", SHARDS],
        "gossip-send-drop=return",
    );
    let node_1 = cluster.client(1);
    eventually(
        Duration::from_secs(30),
        "node 1 warning in cluster status that it hears no gossip",
        || {
            let node_1 = node_1.clone();
            async move {
                node_1.cluster_status().await.is_ok_and(|status| {
                    status
                        .nodes
                        .iter()
                        .any(|node| node.node_id == 1 && node.gossip_warning.contains("no gossip"))
                })
            }
        },
    )
    .await;
    let status = node_1.cluster_status().await.unwrap();
    let heard: Vec<_> = status
        .nodes
        .iter()
        .filter(|node| node.node_id != 1 && node.liveness == "alive")
        .map(|node| node.node_id)
        .collect();
    assert!(
        heard.is_empty(),
        "gossip still flows: node 1 hears {heard:?}"
    );
    kill_a_shard_leader_under_load(cluster, DRAINED_AFTER_RESTART).await;
}

/// Nodes gossiping on ports other than their peer ports' numbers (which
/// is where the others first look) still find each other: each learns the
/// others' gossip addresses over the peer API. Before, every node stayed
/// alone in its view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_gossiping_off_their_peer_ports_never_meet() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start_gossiping_elsewhere(dir.path(), 3, &["--shards", SHARDS]);
    for id in 1..=3 {
        let client = cluster.client(id);
        eventually(
            Duration::from_secs(30),
            &format!("node {id} hearing both others' gossip"),
            || {
                let client = client.clone();
                async move {
                    client.cluster_status().await.is_ok_and(|status| {
                        status.nodes.len() == 3
                            && status.nodes.iter().all(|node| {
                                node.liveness == "alive" && node.gossip_warning.is_empty()
                            })
                    })
                }
            },
        )
        .await;
    }
}
