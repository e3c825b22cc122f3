//! A member removed alive keeps running a moment after it left (until its
//! operator stops it), and clients may still call it. Its peers refuse its
//! calls then (mutual TLS names it no member); the produces it forwards
//! must come back to its clients as UNAVAILABLE with a retry hint, which
//! sends them to another node, not as PERMISSION_DENIED, which a client
//! takes as its own fault and gives up on.

use floret_client::{ClientError, Message};
use tonic::Code;

use super::SHARDS;
use super::harness::{Cluster, one_cluster_at_a_time};
use super::membership::{add_node_4, wait_for_members};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_through_a_member_that_left_is_refused_as_permission_denied() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start_tls(dir.path(), 3, &["--shards", SHARDS]);
    add_node_4(&mut cluster, 1).await;
    cluster
        .client(1)
        .remove_node(3)
        .await
        .expect("remove node 3");
    wait_for_members(&cluster.client(1), &[1, 2, 4], "node 3 out").await;

    let through_3 = cluster.client(3);
    for producer in 0..8 {
        let message = Message {
            payload: b"after node 3 left".to_vec(),
            headers: Default::default(),
        };
        let answer = through_3
            .produce("default", &format!("p{producer}"), vec![message])
            .await;
        match answer {
            Err(ClientError::Status(status)) => assert_eq!(
                status.code(),
                Code::Unavailable,
                "producer p{producer} through node 3, which left: {status:?}"
            ),
            other => panic!("producer p{producer} through node 3, which left: {other:?}"),
        }
    }
}
