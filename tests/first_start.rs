//! A brand-new cluster's first start is quiet: a newcomer who runs three
//! nodes for the first time sees no warning, since a new cluster is not a
//! damaged one (the vote guard warns only for a node rejoining an existing
//! cluster with a new or cut log).

use super::harness::{Cluster, one_cluster_at_a_time};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_greets_a_newcomer_with_warnings() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &[]);
    cluster.wait_for_preferred_leaders(1).await;
    let client = cluster.client(1);
    client
        .produce(
            "first",
            "p1",
            vec![floret_client::Message {
                payload: b"hello".to_vec(),
                headers: Default::default(),
            }],
        )
        .await
        .unwrap();
    for id in 1..=3 {
        let log = cluster.log(id);
        let warnings: Vec<&str> = log
            .lines()
            .filter(|line| line.contains("WARN") || line.contains("ERROR"))
            .collect();
        assert!(
            warnings.is_empty(),
            "node {id} warned on a healthy first start:\n{}",
            warnings.join("\n")
        );
    }
}
