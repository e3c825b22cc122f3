//! One real `floret serve` process, end to end: fairness under a flood,
//! order, durability across SIGKILL, bad input (and its named classes in
//! `bad_input.rs`), and data-dir errors.

mod bad_input;
mod console;
mod deploy_files;
mod grafana_files;
mod harness;
mod metrics;
mod request_ids;
mod sink;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floret_client::{Client, ConsumerEvent, Delivery, Message};
use harness::{FloretProcess, eventually, start_expecting_failure};
use tonic::Code;

/// Upper bound for draining a test's messages.
const DRAIN_DEADLINE: Duration = Duration::from_secs(120);

fn message(producer: &str, counter: u64) -> Message {
    Message {
        payload: format!("{producer}:{counter}").into_bytes(),
        headers: HashMap::from([("counter".to_owned(), counter.to_string())]),
    }
}

fn counter_of(delivery: &Delivery) -> u64 {
    delivery.headers["counter"].parse().expect("counter header")
}

/// Consumes until `done` says so, acking everything; returns deliveries in arrival order.
async fn consume_until(
    client: &Client,
    credits: u32,
    mut done: impl FnMut(&[Delivery]) -> bool,
) -> Vec<Delivery> {
    let mut consumer = client.consume("default", credits).await.expect("subscribe");
    let mut deliveries = Vec::new();
    let deadline = Instant::now() + DRAIN_DEADLINE;
    let mut unsettled = 0usize;
    while !done(&deliveries) {
        let event = tokio::time::timeout_at(deadline.into(), consumer.next())
            .await
            .unwrap_or_else(|_| panic!("only {} deliveries before the deadline", deliveries.len()))
            .expect("consume stream")
            .expect("stream open");
        match event {
            ConsumerEvent::Delivery(delivery) => {
                consumer
                    .ack(vec![delivery.delivery_id.clone()])
                    .await
                    .expect("ack");
                consumer.credit(1).await.expect("credit");
                unsettled += 1;
                deliveries.push(delivery);
            }
            ConsumerEvent::Settled(outcomes) => {
                unsettled -= outcomes.len();
                assert!(
                    outcomes.iter().all(|o| o.code == 0),
                    "ack refused: {outcomes:?}"
                );
            }
        }
    }
    while unsettled > 0 {
        match tokio::time::timeout_at(deadline.into(), consumer.next()).await {
            Ok(Ok(Some(ConsumerEvent::Settled(outcomes)))) => unsettled -= outcomes.len(),
            Ok(Ok(Some(ConsumerEvent::Delivery(_)))) => {}
            other => panic!("stream ended with {unsettled} acks unconfirmed: {other:?}"),
        }
    }
    deliveries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starvation_by_flooding_producer() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    let quiet: Vec<String> = (0..10).map(|i| format!("quiet-{i}")).collect();
    for batch in 0..100u64 {
        let messages = (batch * 100..(batch + 1) * 100)
            .map(|c| message("flooder", c))
            .collect();
        client
            .produce("default", "flooder", messages)
            .await
            .expect("flood produce");
    }
    for producer in &quiet {
        let mut idempotent = client.producer("default", producer);
        for batch in 0..10u64 {
            let messages = (batch * 10..(batch + 1) * 10)
                .map(|c| message(producer, c))
                .collect();
            let response = idempotent.send(messages).await.expect("quiet produce");
            assert_eq!(
                response.sequences,
                (batch * 10..(batch + 1) * 10).collect::<Vec<_>>()
            );
        }
    }

    let deliveries = consume_until(&client, 64, |d| d.len() == 11_000).await;

    let mut by_producer: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for delivery in &deliveries {
        by_producer
            .entry(&delivery.producer_id)
            .or_default()
            .push(counter_of(delivery));
    }
    assert_eq!(
        by_producer["flooder"],
        (0..10_000).collect::<Vec<_>>(),
        "flooder lost or reordered"
    );
    for producer in &quiet {
        assert_eq!(
            by_producer[producer.as_str()],
            (0..100).collect::<Vec<_>>(),
            "{producer} lost or reordered"
        );
        let last = deliveries
            .iter()
            .rposition(|d| &d.producer_id == producer)
            .unwrap();
        assert!(
            last < 1_200,
            "{producer}'s last message came out at delivery {last}: starved by the flood"
        );
    }
    assert!(deliveries.iter().all(|d| d.attempt == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_produce_lost_on_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("node");
    let mut node = FloretProcess::start(&data_dir, &[]);
    let client = node.client();
    let acknowledged: Arc<Mutex<HashSet<(String, u64)>>> = Arc::default();
    let mut producers = Vec::new();
    for p in 0..8 {
        let client = client.clone();
        let acknowledged = acknowledged.clone();
        producers.push(tokio::spawn(async move {
            let producer = format!("tenant-{p}");
            for counter in 0.. {
                match client
                    .produce("default", &producer, vec![message(&producer, counter)])
                    .await
                {
                    Ok(_) => acknowledged
                        .lock()
                        .unwrap()
                        .insert((producer.clone(), counter)),
                    Err(_) => break,
                };
            }
        }));
    }
    eventually(Duration::from_secs(60), "500 acknowledged produces", || {
        let count = acknowledged.lock().unwrap().len();
        async move { count >= 500 }
    })
    .await;
    node.kill();
    for producer in producers {
        producer.await.unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();

    let node = FloretProcess::start(&data_dir, &[]);
    let client = node.client();
    let deliveries = consume_until(&client, 256, |seen| {
        let got: HashSet<_> = seen
            .iter()
            .map(|d| (d.producer_id.clone(), counter_of(d)))
            .collect();
        acknowledged.is_subset(&got)
    })
    .await;
    let mut last: HashMap<&str, u64> = HashMap::new();
    for delivery in &deliveries {
        let counter = counter_of(delivery);
        if let Some(previous) = last.insert(&delivery.producer_id, counter) {
            assert!(
                counter > previous,
                "{} out of order: {counter} after {previous}",
                delivery.producer_id
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_delivery_returns_after_consumer_disconnects_or_lease_expires() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &["--lease-timeout-ms", "300"]);
    let client = node.client();
    client
        .produce("default", "p", vec![message("p", 0)])
        .await
        .unwrap();

    let mut first = client.consume("default", 1).await.unwrap();
    let Some(ConsumerEvent::Delivery(delivery)) = first.next().await.unwrap() else {
        panic!("no delivery")
    };
    assert_eq!(delivery.attempt, 1);
    drop(first);

    let mut second = client.consume("default", 1).await.unwrap();
    let Some(ConsumerEvent::Delivery(redelivery)) = second.next().await.unwrap() else {
        panic!("no redelivery")
    };
    assert_eq!((redelivery.sequence, redelivery.attempt), (0, 2));
    second.credit(1).await.unwrap();
    let Some(ConsumerEvent::Delivery(expired)) = second.next().await.unwrap() else {
        panic!("no redelivery")
    };
    assert_eq!(
        (expired.sequence, expired.attempt),
        (0, 3),
        "lease did not expire"
    );
    let stats = client.queue_stats("default").await.unwrap();
    let producer = &stats.queues[0].producers[0];
    assert_eq!(
        producer.in_flight, 1,
        "the lapsed lease still counts as in flight"
    );

    let stale = client
        .ack(vec![redelivery.delivery_id.clone()])
        .await
        .unwrap_err();
    assert!(
        matches!(stale, floret_client::ClientError::Status(ref s) if s.code() == Code::FailedPrecondition),
        "{stale}"
    );
    client
        .ack(vec![expired.delivery_id.clone()])
        .await
        .expect("current lease acks");
    client
        .ack(vec![expired.delivery_id.clone()])
        .await
        .expect("a repeated ack is OK");
}

fn status_code(error: floret_client::ClientError) -> Code {
    match error {
        floret_client::ClientError::Status(status) => status.code(),
        other => panic!("expected a status, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_status_and_the_node_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    let one = || vec![message("p", 0)];
    let cases: Vec<(&str, Result<_, _>, Code)> = vec![
        (
            "empty producer id",
            client.produce("default", "", one()).await,
            Code::InvalidArgument,
        ),
        (
            "producer id over 256 bytes",
            client.produce("default", &"p".repeat(257), one()).await,
            Code::InvalidArgument,
        ),
        (
            "queue name with a slash",
            client.produce("a/b", "p", one()).await,
            Code::InvalidArgument,
        ),
        (
            "queue name over 128 bytes",
            client.produce(&"q".repeat(129), "p", one()).await,
            Code::InvalidArgument,
        ),
        (
            "empty batch",
            client.produce("default", "p", vec![]).await,
            Code::InvalidArgument,
        ),
        (
            "payload over the 1 MiB limit",
            client
                .produce(
                    "default",
                    "p",
                    vec![Message {
                        payload: vec![0; 1024 * 1024 + 1],
                        headers: HashMap::new(),
                    }],
                )
                .await,
            Code::InvalidArgument,
        ),
        (
            "request over the transport limit (tonic answers OUT_OF_RANGE)",
            client
                .produce(
                    "default",
                    "p",
                    (0..17)
                        .map(|_| Message {
                            payload: vec![0; 1024 * 1024],
                            headers: HashMap::new(),
                        })
                        .collect(),
                )
                .await,
            Code::OutOfRange,
        ),
    ];
    for (what, result, code) in cases {
        let error = result.expect_err(what);
        let message = error.to_string();
        assert_eq!(status_code(error), code, "{what}: {message}");
    }
    assert_eq!(
        status_code(client.ack(vec!["nonsense".into()]).await.unwrap_err()),
        Code::InvalidArgument
    );
    assert_eq!(
        status_code(
            client
                .ack(vec!["3-99-1-0000000000000000-7-defaultnobody".into()])
                .await
                .unwrap_err()
        ),
        Code::NotFound
    );
    assert_eq!(
        status_code(
            client
                .ack(vec!["999-0-1-0000000000000000-7-defaultnobody".into()])
                .await
                .unwrap_err()
        ),
        Code::NotFound,
        "a delivery id naming a shard that does not exist"
    );
    assert_eq!(
        status_code(client.ack(vec![]).await.unwrap_err()),
        Code::InvalidArgument
    );
    let mut waiting = client
        .consume("default", 0)
        .await
        .expect("a subscribe with no credits waits for the first grant");
    let zero_grant = async {
        waiting.credit(0).await?;
        waiting.next().await
    };
    assert_eq!(
        status_code(zero_grant.await.unwrap_err()),
        Code::InvalidArgument,
        "a grant of no credits"
    );

    let response = client
        .produce("default", "p", one())
        .await
        .expect("node still serves");
    assert_eq!(response.sequences, vec![0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hangs_on_an_open_consume_stream() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("node");
    let mut node = FloretProcess::start(&data_dir, &[]);
    let client = node.client();
    client
        .produce("default", "p", vec![message("p", 0), message("p", 1)])
        .await
        .unwrap();
    let mut consumer = client.consume("default", 1).await.unwrap();
    let Some(ConsumerEvent::Delivery(held)) = consumer.next().await.unwrap() else {
        panic!("no delivery")
    };

    node.terminate();
    let status = node
        .wait_exit(Duration::from_secs(30))
        .expect("node exits after SIGTERM despite the open stream");
    assert!(status.success(), "graceful shutdown failed: {status}");

    let node = FloretProcess::start(&data_dir, &[]);
    let deliveries = consume_until(&node.client(), 8, |d| d.len() == 2).await;
    let sequences: Vec<_> = deliveries.iter().map(|d| d.sequence).collect();
    assert_eq!(
        sequences,
        vec![held.sequence, 1],
        "the unacked message comes back first, nothing is lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_grpc_tools_cannot_see_health_or_services() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.address))
        .unwrap()
        .connect()
        .await
        .unwrap();
    for service in ["", "floret.v1.Floret", "floret.v1.Admin"] {
        let health = HealthClient::new(channel.clone())
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            health.status(),
            ServingStatus::Serving,
            "health of {service:?}"
        );
    }
    let names = harness::reflected_services(channel).await;
    for expected in [
        "floret.v1.Floret",
        "floret.v1.Admin",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
}

#[test]
fn one_node_data_dir_silently_joined_to_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("node");
    let mut node = FloretProcess::start(&data_dir, &[]);
    node.terminate();
    assert!(node.wait_exit(Duration::from_secs(30)).is_some());
    let stderr = start_expecting_failure(
        &data_dir,
        &[
            "--node-id",
            "1",
            "--peers",
            "1=127.0.0.1:1,2=127.0.0.1:2,3=127.0.0.1:3",
        ],
    );
    assert!(
        stderr.contains("belongs to a cluster of members [1]")
            && stderr.contains("not supported yet"),
        "{stderr}"
    );
}

#[test]
fn foreign_or_busy_data_dir_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("important.txt"), "not floret's").unwrap();
    let stderr = start_expecting_failure(&foreign, &[]);
    assert!(stderr.contains("not a floret data dir"), "{stderr}");

    let busy = dir.path().join("busy");
    let _running = FloretProcess::start(&busy, &[]);
    let stderr = start_expecting_failure(&busy, &[]);
    assert!(
        stderr.contains("in use by another running floret node"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs floret built with --features failpoints"
)]
async fn node_whose_log_failed_to_sync_stays_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let dir = tempfile::tempdir().unwrap();
    let args = ["--listen".to_owned(), "127.0.0.1:0".to_owned()];
    let node = FloretProcess::spawn_with_failpoints(
        &dir.path().join("node"),
        &args,
        "wal-sync-fails=100*off->return",
    )
    .wait_ready();
    let client = node.client();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.address))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut refused = None;
    for counter in 0..1_000u64 {
        let message = Message {
            payload: counter.to_le_bytes().to_vec(),
            headers: Default::default(),
        };
        if let Err(error) = client.produce("default", "p", vec![message]).await {
            refused = Some(error);
            break;
        }
    }
    assert!(
        refused.is_some(),
        "every produce was acknowledged after the log's sync failed"
    );

    // Within a second of the refusal: faults are checked every 500 ms.
    eventually(Duration::from_secs(1), "health turns NOT_SERVING", || {
        let mut health = HealthClient::new(channel.clone());
        async move {
            let answer = health
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await;
            answer.is_ok_and(|a| a.into_inner().status() == ServingStatus::NotServing)
        }
    })
    .await;
    let status = client.cluster_status().await.unwrap();
    let fault = &status.nodes[0].fault;
    assert!(fault.contains("raft log stopped"), "{status:?}");
}

#[test]
fn node_serves_plaintext_to_the_whole_network() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = start_expecting_failure(&dir.path().join("node"), &["--listen", "0.0.0.0:0"]);
    assert!(
        stderr.contains("refusing to serve plaintext on 0.0.0.0")
            && stderr.contains("--insecure")
            && stderr.contains("floret certs"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("node").exists(),
        "the refused node created its data dir"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs floret built with --features failpoints"
)]
async fn produce_fills_the_disk_until_acks_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let free_bytes_file = dir.path().join("free-bytes");
    let args = ["--listen".to_owned(), "127.0.0.1:0".to_owned()];
    let node = FloretProcess::spawn_with_failpoints(
        &dir.path().join("node"),
        &args,
        &format!("disk-free-bytes=return({})", free_bytes_file.display()),
    )
    .wait_ready();
    let client = node.client().with_retry(floret_client::RetryPolicy {
        give_up_after: Duration::ZERO,
        ..Default::default()
    });
    let produce = |counter: u64| {
        let client = client.clone();
        async move {
            client
                .produce("default", "p", vec![message("p", counter)])
                .await
        }
    };
    let mut acknowledged: Vec<u64> = Vec::new();
    for counter in 0..50 {
        produce(counter).await.expect("produce with room on disk");
        acknowledged.push(counter);
    }

    std::fs::write(&free_bytes_file, "1024").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let counter = 50 + acknowledged.len() as u64;
        match produce(counter).await {
            Ok(_) => acknowledged.push(counter),
            Err(error) => break error,
        }
        assert!(
            Instant::now() < deadline,
            "produces still taken on a full disk"
        );
    };
    let message = refused.to_string();
    assert!(
        message.contains("disk") && message.contains("min_free_bytes"),
        "{message}"
    );
    assert_eq!(status_code(refused), Code::ResourceExhausted);

    let delivered = consume_until(&client, 16, |d| d.len() >= acknowledged.len()).await;
    let counters: std::collections::BTreeSet<u64> = delivered.iter().map(counter_of).collect();
    assert!(
        acknowledged.iter().all(|c| counters.contains(c)),
        "acknowledged messages missing on a full disk: {counters:?}"
    );

    std::fs::remove_file(&free_bytes_file).unwrap();
    eventually(
        Duration::from_secs(10),
        "produces taken once space returns",
        || async { produce(1_000).await.is_ok() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_pile_up_until_the_node_runs_out_of_files() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("floret.toml");
    std::fs::write(&config, "[limits]\nmax_connections = 2\n").unwrap();
    let node = FloretProcess::start(
        &dir.path().join("node"),
        &["--config", config.to_str().unwrap()],
    );
    let connect = || async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.address))
            .unwrap()
            .connect()
            .await?;
        let mut admin = floret_proto::v1::admin_client::AdminClient::new(channel.clone());
        admin
            .cluster_status(floret_proto::v1::ClusterStatusRequest {})
            .await
            .map_err(|status| Box::new(status) as Box<dyn std::error::Error>)?;
        Ok::<_, Box<dyn std::error::Error>>(channel)
    };
    let first = connect().await.expect("first connection");
    let _second = connect().await.expect("second connection");
    assert!(
        connect().await.is_err(),
        "a third connection was served past max_connections = 2"
    );
    drop(first);
    eventually(
        Duration::from_secs(10),
        "a connection taken once one closed",
        || async { connect().await.is_ok() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_without_shards_refuses_its_own_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("node");
    let mut node = FloretProcess::start(&data_dir, &["--shards", "4"]);
    node.kill();
    let node = FloretProcess::start(&data_dir, &[]);
    let status = node.client().cluster_status().await.unwrap();
    assert_eq!(
        status.shards.len(),
        4,
        "the count the data dir was made with"
    );
    let new = FloretProcess::start(&dir.path().join("new"), &[]);
    let status = new.client().cluster_status().await.unwrap();
    assert_eq!(
        status.shards.len(),
        floret_server::config::DEFAULT_SHARDS as usize
    );
}
