//! Health tells the truth in a cluster: a node whose shards have lost their
//! majority answers NOT_SERVING (a load balancer stops sending it calls it
//! cannot commit), and SERVING again once every shard has a leader.

use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use super::harness::{Cluster, one_cluster_at_a_time};

/// Waits until the node at `address` answers `wanted` (panics after `within`).
async fn wait_for_health(address: &str, wanted: ServingStatus, within: Duration) {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap();
    let answered = floret_chaos::process::poll(within, Duration::from_millis(100), || {
        let endpoint = endpoint.clone();
        async move {
            let channel = endpoint.connect().await.ok()?;
            let answer = HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .ok()?;
            (answer.into_inner().status() == wanted).then_some(())
        }
    })
    .await;
    assert!(
        answered.is_some(),
        "{address} did not answer {wanted:?} within {within:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_shards_lost_their_majority_still_says_serving() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &[]);
    let survivor = cluster.address(1);
    wait_for_health(&survivor, ServingStatus::Serving, Duration::from_secs(30)).await;

    cluster.kill(2);
    cluster.kill(3);
    wait_for_health(
        &survivor,
        ServingStatus::NotServing,
        Duration::from_secs(20),
    )
    .await;
    assert!(
        cluster.log(1).contains("health turns NOT_SERVING"),
        "the node says why"
    );

    cluster.restart(2);
    wait_for_health(&survivor, ServingStatus::Serving, Duration::from_secs(30)).await;
}
