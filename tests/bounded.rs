//! What a client cannot pin on a node by calling the public API in ways
//! no well-behaved client would: made-up queue names, consume streams that
//! never subscribe, a consumer that grants credits and never reads.

use std::time::Duration;

use tokio_stream::StreamExt;

use super::harness::{Cluster, eventually, one_cluster_at_a_time};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribes_to_made_up_queue_names_stay_in_every_dispatcher() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &["--shards", "3"]);
    let client = cluster.client(1);
    let queues_known = || {
        let client = client.clone();
        async move { client.queue_stats("").await.unwrap().queues.len() }
    };
    let before = queues_known().await;

    for round in 0..20 {
        let opened = (0..500).map(|i| {
            let client = client.clone();
            async move {
                client
                    .consume(&format!("probe-{round}-{i}"), 1)
                    .await
                    .unwrap()
            }
        });
        let consumers = futures::future::join_all(opened).await;
        if round == 0 {
            assert!(
                queues_known().await >= before + 500,
                "the open subscribes are known to the dispatchers"
            );
        }
        drop(consumers);
    }

    eventually(
        Duration::from_secs(30),
        "10,000 closed subscribes to made-up queues are forgotten on every node",
        || async { queues_known().await == before },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_stream_that_never_subscribes_stays_open() {
    use floret_proto::v1::ConsumeRequest;
    use floret_proto::v1::floret_client::FloretClient;

    let dir = tempfile::tempdir().unwrap();
    let node = super::harness::FloretProcess::start(&dir.path().join("node"), &[]);
    let mut client = FloretClient::connect(format!("http://{}", node.address))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let silent = tokio_stream::pending::<ConsumeRequest>();
    let answer = tokio::time::timeout(Duration::from_secs(30), client.consume(silent))
        .await
        .expect("the node closes a silent stream");
    let status = answer.map(drop).unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("no subscribe"), "{status:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(9),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_that_stops_reading_pins_its_credits_worth_of_messages() {
    use floret_client::Message;
    use floret_proto::v1::floret_client::FloretClient;
    use floret_proto::v1::{ConsumeRequest, Subscribe, consume_request};

    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &["--shards", "3"]);
    let client = cluster.client(1);
    let produced = 25_000u64;
    let batches = (0..50u64).map(|batch| {
        let client = client.clone();
        async move {
            let messages = (0..produced / 50)
                .map(|_| Message {
                    payload: vec![b'x'; 1024],
                    headers: Default::default(),
                })
                .collect();
            client
                .produce("unread", &format!("p{}", batch % 10), messages)
                .await
                .unwrap();
        }
    });
    futures::future::join_all(batches).await;

    let mut raw = FloretClient::connect(format!("http://{}", cluster.address(2)))
        .await
        .unwrap();
    let subscribe = ConsumeRequest {
        request: Some(consume_request::Request::Subscribe(Subscribe {
            queue: "unread".into(),
            credits: 100_000,
        })),
    };
    let requests = tokio_stream::iter(vec![subscribe]).chain(tokio_stream::pending());
    let _never_read = raw.consume(requests).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = client.queue_stats("unread").await.unwrap();
    let in_flight = stats.queues[0].in_flight;
    // 16 MiB of unread deliveries, plus what HTTP/2 and the sockets buffer.
    assert!(
        in_flight <= 24 * 1024,
        "a consumer that never reads holds {in_flight} of {produced} 1 KiB messages"
    );

    let mut reader = cluster.client(3).consume("unread", 100).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), reader.next())
        .await
        .expect("another consumer still receives")
        .unwrap();
    assert!(first.is_some());
}
