//! The node-to-node API lives on the peer port alone: on the client port
//! every `floret.peer.v1.Peer` method answers UNIMPLEMENTED and reflection
//! does not list it, so a client cannot forge raft traffic, install a
//! snapshot or propose an unchecked operation there. On the peer port,
//! raft messages that would break a shard (a term about to overflow, a
//! snapshot chunk far past its end) are refused before openraft sees them.
//! Over mutual TLS, the peer port serves only members, each as itself.

use floret_chaos::process::ClusterCerts;
use floret_proto::peer::v1::peer_client::PeerClient;
use floret_proto::peer::v1::{
    HandBackRequest, NodeStatusRequest, PeerSettleRequest, RaftCalls, RaftMessage,
    ShardStatesRequest,
};
use floret_proto::v1;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Status};

use super::harness::{Cluster, one_cluster_at_a_time, reflected_services};

async fn channel(address: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// What a call answered, without its message.
fn ok<T>(result: Result<T, Status>) -> Result<(), Status> {
    result.map(drop)
}

/// Every Peer method called through `peer`, each with a harmless request:
/// the method's name and what it answered (Ok(()) or the status).
async fn call_every_peer_method(
    peer: &mut PeerClient<Channel>,
) -> Vec<(&'static str, Result<(), Status>)> {
    let raft = || RaftMessage {
        shard_id: 0,
        payload: Vec::new(),
    };
    let subscribe = v1::ConsumeRequest {
        request: Some(v1::consume_request::Request::Subscribe(v1::Subscribe {
            queue: "default".into(),
            credits: 1,
        })),
    };
    vec![
        ("Vote", ok(peer.vote(raft()).await)),
        (
            "AppendEntriesStream",
            ok(peer
                .append_entries_stream(tokio_stream::iter(vec![RaftCalls { calls: Vec::new() }]))
                .await),
        ),
        ("InstallSnapshot", ok(peer.install_snapshot(raft()).await)),
        (
            "ShardStates",
            ok(peer.shard_states(ShardStatesRequest {}).await),
        ),
        (
            "Settle",
            ok(peer.settle(PeerSettleRequest::default()).await),
        ),
        (
            "HandBack",
            ok(peer.hand_back(HandBackRequest::default()).await),
        ),
        ("Propose", ok(peer.propose(raft()).await)),
        (
            "ForwardProduce",
            ok(peer.forward_produce(v1::ProduceRequest::default()).await),
        ),
        (
            "Consume",
            ok(peer.consume(tokio_stream::iter(vec![subscribe])).await),
        ),
        (
            "NodeStatus",
            ok(peer.node_status(NodeStatusRequest {}).await),
        ),
        (
            "NodeQueueStats",
            ok(peer
                .node_queue_stats(v1::QueueStatsRequest::default())
                .await),
        ),
        (
            "LedDeadLetters",
            ok(peer
                .led_dead_letters(v1::ListDeadLettersRequest::default())
                .await),
        ),
        (
            "ReplicaPolicy",
            ok(peer.replica_policy(v1::GetPolicyRequest::default()).await),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_port_lets_anyone_drive_raft() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &["--shards", "3"]);

    let client_port = channel(&cluster.address(1)).await;
    let answers = call_every_peer_method(&mut PeerClient::new(client_port.clone())).await;
    assert_eq!(answers.len(), 13, "every Peer method is tried");
    for (method, answer) in &answers {
        let code = answer.as_ref().err().map(Status::code);
        assert_eq!(
            code,
            Some(Code::Unimplemented),
            "Peer.{method} on the client port answered {answer:?}"
        );
    }
    let services = reflected_services(client_port).await;
    assert!(
        services.iter().any(|name| name == "floret.v1.Floret"),
        "the client port reflects its own services: {services:?}"
    );
    assert!(
        !services.iter().any(|name| name.starts_with("floret.peer")),
        "the client port advertises the peer API: {services:?}"
    );

    let peer_port = channel(&cluster.peer_address(1)).await;
    let states = PeerClient::new(peer_port.clone())
        .shard_states(ShardStatesRequest {})
        .await
        .expect("the peer port serves the peer API")
        .into_inner();
    assert!(!states.initialized.is_empty(), "{states:?}");
    let produce = v1::floret_client::FloretClient::new(peer_port)
        .produce(v1::ProduceRequest::default())
        .await;
    assert_eq!(
        produce.map(|_| ()).unwrap_err().code(),
        Code::Unimplemented,
        "the peer port serves no client API"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_vote_or_snapshot_chunk_stops_a_shard_for_good() {
    use floret_client::Message;
    use floret_cluster::{ShardPlacement, encode};
    use openraft::raft::{InstallSnapshotRequest, VoteRequest};
    use openraft::{SnapshotMeta, Vote};

    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--shards", "3"]);
    let shard = 0;
    let leader = cluster.leader_of(shard, 1).await;
    let follower = leader % 3 + 1;
    let mut peer = PeerClient::new(channel(&cluster.peer_address(follower)).await);

    let vote = VoteRequest::<u64>::new(Vote::new(u64::MAX - 1, leader), None);
    let refused = peer
        .vote(RaftMessage {
            shard_id: shard,
            payload: encode(&vote),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("term"), "{refused:?}");

    let chunk = InstallSnapshotRequest::<floret_store::TypeConfig> {
        vote: Vote::new(1, leader),
        meta: SnapshotMeta::default(),
        offset: 1 << 40,
        data: vec![0; 16],
        done: false,
    };
    let refused = peer
        .install_snapshot(RaftMessage {
            shard_id: shard,
            payload: encode(&chunk),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("offset"), "{refused:?}");

    cluster.kill(leader);
    let survivor = follower;
    let new_leader = cluster.leader_of(shard, survivor).await;
    assert_ne!(new_leader, leader, "shard {shard} elected again");
    let placement = ShardPlacement::new(3);
    let producer = (0..)
        .map(|i| format!("p{i}"))
        .find(|p| placement.shard_of("default", p) == shard)
        .unwrap();
    let message = Message {
        payload: b"after the forgeries".to_vec(),
        headers: Default::default(),
    };
    // Just after the election the survivor may not know the new leader
    // yet and answer UNAVAILABLE (outcome unknown): an idempotent producer
    // retries that, as a client of a failing-over shard must.
    cluster
        .client(survivor)
        .producer("default", &producer)
        .send(vec![message])
        .await
        .expect("the shard serves after the forged vote and chunk");
}

/// A channel to a peer port over TLS, trusting `certs`' CA, expecting the
/// member name of `node`, and presenting the certificate `presented` (the
/// stem of a `floret certs` file pair, such as `node-3` or `client`) if any.
async fn tls_channel(
    address: &str,
    certs: &ClusterCerts,
    node: u64,
    presented: Option<(&ClusterCerts, &str)>,
) -> Result<Channel, tonic::transport::Error> {
    let read = |certs: &ClusterCerts, name: String| std::fs::read(certs.file(&name)).unwrap();
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(certs, "ca.pem".into())))
        .domain_name(floret_cluster::member_name(node));
    if let Some((issued_by, stem)) = presented {
        tls = tls.identity(Identity::from_pem(
            read(issued_by, format!("{stem}.pem")),
            read(issued_by, format!("{stem}.key")),
        ));
    }
    tonic::transport::Endpoint::from_shared(format!("https://{address}"))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

/// What `ShardStates` answered through a channel made by [`tls_channel`]:
/// the status code, or Unavailable when the handshake itself failed.
async fn shard_states_through(channel: Result<Channel, tonic::transport::Error>) -> Code {
    match channel {
        Ok(channel) => match PeerClient::new(channel)
            .shard_states(ShardStatesRequest {})
            .await
        {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        },
        Err(_) => Code::Unavailable,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anyone_with_network_access_drives_raft_on_the_peer_port() {
    use floret_cluster::encode;
    use floret_proto::peer::v1::RaftCall;
    use floret_proto::peer::v1::raft_answer::Outcome;
    use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
    use openraft::{SnapshotMeta, Vote};

    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start_tls(dir.path(), 3, &["--shards", "3"]);
    let certs = cluster.certs().unwrap();
    let stranger_dir = tempfile::tempdir().unwrap();
    let strangers = ClusterCerts::make(
        std::path::Path::new(super::harness::floret_binary()),
        stranger_dir.path(),
        3,
    )
    .unwrap();
    let peer_port = cluster.peer_address(2);

    let plaintext = tonic::transport::Endpoint::from_shared(format!("http://{peer_port}"))
        .unwrap()
        .connect()
        .await;
    assert_ne!(
        shard_states_through(plaintext).await,
        Code::Ok,
        "a plaintext caller was served"
    );
    let without_certificate = tls_channel(&peer_port, certs, 2, None).await;
    assert_ne!(
        shard_states_through(without_certificate).await,
        Code::Ok,
        "a caller without a certificate was served"
    );
    let other_ca = tls_channel(&peer_port, certs, 2, Some((&strangers, "node-3"))).await;
    assert_ne!(
        shard_states_through(other_ca).await,
        Code::Ok,
        "a certificate of another CA was taken"
    );
    let not_a_member = tls_channel(&peer_port, certs, 2, Some((certs, "client"))).await;
    assert_eq!(
        shard_states_through(not_a_member).await,
        Code::PermissionDenied,
        "a certificate of the cluster's CA that names no member"
    );
    let node_3 = tls_channel(&peer_port, certs, 2, Some((certs, "node-3"))).await;
    let mut as_node_3 = PeerClient::new(node_3.expect("node 3's certificate is taken"));
    as_node_3
        .shard_states(ShardStatesRequest {})
        .await
        .expect("a member is served");
    let vote_as_node_1 = VoteRequest::<u64>::new(Vote::new(1_000, 1), None);
    let refused = as_node_3
        .vote(RaftMessage {
            shard_id: 0,
            payload: encode(&vote_as_node_1),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("node 3"), "{refused:?}");
    let hand_back_as_node_1 = as_node_3
        .hand_back(HandBackRequest {
            shard_id: 0,
            node_id: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(hand_back_as_node_1.code(), Code::PermissionDenied);
    let chunk_as_node_1 = InstallSnapshotRequest::<floret_store::TypeConfig> {
        vote: Vote::new(1_000, 1),
        meta: SnapshotMeta::default(),
        offset: 0,
        data: vec![0; 16],
        done: false,
    };
    let refused = as_node_3
        .install_snapshot(RaftMessage {
            shard_id: 0,
            payload: encode(&chunk_as_node_1),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");

    let append_as_node_1 = AppendEntriesRequest::<floret_store::TypeConfig> {
        vote: Vote::new(1_000, 1),
        prev_log_id: None,
        leader_commit: None,
        entries: Vec::new(),
    };
    let calls = RaftCalls {
        calls: vec![RaftCall {
            call_id: 7,
            shard_id: 0,
            payload: encode(&append_as_node_1),
        }],
    };
    let mut answers = as_node_3
        .append_entries_stream(tokio_stream::iter(vec![calls]))
        .await
        .expect("node 3 may open an append stream")
        .into_inner();
    let answer = answers
        .message()
        .await
        .unwrap()
        .expect("an answer to the forged append")
        .answers
        .remove(0);
    assert_eq!(answer.call_id, 7);
    match answer.outcome {
        Some(Outcome::Refused(why)) => assert!(why.contains("node 3"), "{why}"),
        other => panic!("an append claiming node 1's leadership was handed to raft: {other:?}"),
    }
}
