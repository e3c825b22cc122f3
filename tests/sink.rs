//! A queue's sink on one node: messages reach a gRPC sink in batches and
//! leave floret only once the sink took them; rejected ones end in the dead
//! letters, asked-again ones come back, a sink that is down loses nothing,
//! a lone message waits the linger, and a removed sink gets nothing more.
//! A webhook sink gets JSON batches and is waited for when it answers 429.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine;
use floret_client::dev_sink::{DevSink, DevSinkBehaviour};
use floret_client::{Client, ConsumerEvent, GrpcSink, Message, SinkSpec, WebhookSink, sink_spec};
use floret_proto::sink::v1::Outcome;

use super::harness::{FloretProcess, eventually};

/// Starts `sink` on a loopback port; its address.
async fn serve(sink: &DevSink) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(sink.clone().serve(listener));
    address
}

fn grpc_sink(address: &str, batch_max: u32, linger_ms: u32) -> SinkSpec {
    SinkSpec {
        target: Some(sink_spec::Target::Grpc(GrpcSink {
            address: address.to_owned(),
        })),
        batch_max,
        linger_ms,
        ..Default::default()
    }
}

/// Produces `count` messages as each of `producers`; every (producer, sequence).
async fn produce(
    client: &Client,
    queue: &str,
    producers: &[&str],
    count: usize,
) -> BTreeSet<(String, u64)> {
    let mut produced = BTreeSet::new();
    for producer in producers {
        let messages = (0..count)
            .map(|i| Message {
                payload: format!("{producer}-{i}").into_bytes(),
                headers: Default::default(),
            })
            .collect();
        let answer = client.produce(queue, producer, messages).await.unwrap();
        produced.extend(answer.sequences.iter().map(|&s| (producer.to_string(), s)));
    }
    produced
}

/// The messages `sink` took (answered OK), each once.
fn taken(sink: &DevSink) -> BTreeSet<(String, u64)> {
    sink.received()
        .into_iter()
        .filter(|r| r.outcome == Outcome::Ok)
        .map(|r| (r.message.producer_id, r.message.sequence))
        .collect()
}

async fn backlog(client: &Client, queue: &str) -> u64 {
    let stats = client.queue_stats(queue).await.unwrap();
    stats
        .queues
        .iter()
        .find(|q| q.queue == queue)
        .map_or(0, |q| q.backlog_messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_reach_the_sink_in_batches_and_leave_floret_once_taken() {
    let dir = tempfile::tempdir().unwrap();
    let port = floret_chaos::ports::free_loopback_ports(1).unwrap()[0];
    let metrics_address = format!("127.0.0.1:{port}");
    let node = FloretProcess::start(
        &dir.path().join("node"),
        &["--metrics-listen", &metrics_address],
    );
    let client = node.client();
    let sink = DevSink::new(DevSinkBehaviour::default());
    let address = serve(&sink).await;
    let stored = client
        .set_sink("orders", grpc_sink(&address, 50, 5))
        .await
        .unwrap();
    assert_eq!(stored.batch_max, 50);
    assert_eq!(
        client.get_sink("orders").await.unwrap(),
        Some(stored.clone())
    );
    let produced = produce(&client, "orders", &["a", "b", "c", "d", "e"], 200).await;
    eventually(
        Duration::from_secs(30),
        "every message taken by the sink",
        || {
            let taken = taken(&sink);
            let all = taken == produced;
            async move { all }
        },
    )
    .await;
    eventually(Duration::from_secs(10), "the backlog gone", || async {
        backlog(&client, "orders").await == 0
    })
    .await;
    let received = sink.received();
    assert_eq!(received.len(), produced.len(), "no message was sent twice");
    let batch_sizes = received.iter().map(|r| r.batch).fold(
        std::collections::BTreeMap::<usize, usize>::new(),
        |mut sizes, batch| {
            *sizes.entry(batch).or_default() += 1;
            sizes
        },
    );
    assert!(
        batch_sizes.values().all(|&size| size <= 50),
        "a batch passed batch_max: {batch_sizes:?}"
    );
    let mut sizes: Vec<usize> = batch_sizes.values().copied().collect();
    sizes.sort_unstable();
    assert!(
        sizes[sizes.len() / 2] >= 45,
        "a flood went out in batches of median {} (batch_max 50): {sizes:?}",
        sizes[sizes.len() / 2]
    );
    let exported = super::metrics::scrape(&metrics_address);
    let taken_count = exported.lines().find(|line| {
        line.starts_with("floret_sink_messages_total{")
            && line.contains("queue=\"orders\"")
            && line.contains("outcome=\"ok\"")
    });
    assert!(
        taken_count.is_some_and(|line| line.ends_with(" 1000")),
        "sink metrics after 1000 taken: {taken_count:?}"
    );
    assert!(exported.contains("floret_sink_batch_messages_count "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_messages_end_in_the_dead_letters_and_asked_again_ones_are_taken_later() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    let sink = DevSink::new(DevSinkBehaviour {
        reject_percent: 10,
        retry_percent: 20,
        ..Default::default()
    });
    let address = serve(&sink).await;
    client
        .set_sink("orders", grpc_sink(&address, 20, 5))
        .await
        .unwrap();
    let produced = produce(&client, "orders", &["a", "b", "c"], 100).await;
    eventually(Duration::from_secs(60), "the backlog gone", || async {
        backlog(&client, "orders").await == 0
    })
    .await;
    let received = sink.received();
    let rejected: BTreeSet<(String, u64)> = received
        .iter()
        .filter(|r| r.outcome == Outcome::Reject)
        .map(|r| (r.message.producer_id.clone(), r.message.sequence))
        .collect();
    assert!(
        received
            .iter()
            .all(|r| (r.outcome == Outcome::Reject) == sink.rejects(&r.message)),
        "the sink rejects the same messages every time"
    );
    assert!(
        !rejected.is_empty(),
        "10% of 300 messages should include rejected ones"
    );
    let dead_letters = client.dead_letters("orders", 1000).await.unwrap();
    assert!(
        dead_letters.iter().all(|d| d.reason == "sink"),
        "{dead_letters:?}"
    );
    let dead: BTreeSet<(String, u64)> = dead_letters
        .into_iter()
        .map(|d| (d.producer_id, d.sequence))
        .collect();
    assert_eq!(
        dead, rejected,
        "exactly the rejected messages are dead letters"
    );
    let taken = taken(&sink);
    assert_eq!(
        taken.union(&rejected).cloned().collect::<BTreeSet<_>>(),
        produced,
        "every other message was taken"
    );
    assert!(
        received
            .iter()
            .any(|r| r.outcome == Outcome::Retry && r.message.attempt == 1),
        "some messages were asked for again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_is_down_loses_nothing_and_drains_once_back() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    let sink = DevSink::new(DevSinkBehaviour::default());
    sink.set_down(true);
    let address = serve(&sink).await;
    client
        .set_sink("orders", grpc_sink(&address, 100, 5))
        .await
        .unwrap();
    let produced = produce(&client, "orders", &["a", "b"], 150).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(sink.received().is_empty());
    assert_eq!(backlog(&client, "orders").await, 300, "nothing left floret");
    sink.set_down(false);
    eventually(
        Duration::from_secs(30),
        "every message taken once the sink is back",
        || {
            let all = taken(&sink) == produced;
            async move { all }
        },
    )
    .await;
    eventually(Duration::from_secs(10), "the backlog gone", || async {
        backlog(&client, "orders").await == 0
    })
    .await;
    assert!(client.dead_letters("orders", 10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_message_waits_the_linger_and_a_removed_sink_gets_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    let sink = DevSink::new(DevSinkBehaviour::default());
    let address = serve(&sink).await;
    let linger = Duration::from_millis(400);
    client
        .set_sink("orders", grpc_sink(&address, 100, 400))
        .await
        .unwrap();
    produce(&client, "orders", &["probe"], 1).await;
    eventually(Duration::from_secs(10), "the pump started", || {
        let pumping = !sink.received().is_empty();
        async move { pumping }
    })
    .await;
    let mut waits = Vec::new();
    for lone in 1..6 {
        let produced_at = Instant::now();
        produce(&client, "orders", &["lone"], 1).await;
        eventually(Duration::from_secs(10), "the lone message taken", || {
            let arrived = sink.received().len() > lone;
            async move { arrived }
        })
        .await;
        let waited = sink.received()[lone].at - produced_at;
        assert!(
            waited >= linger - Duration::from_millis(20),
            "it left after {waited:?}, before the linger"
        );
        waits.push(waited);
    }
    waits.sort();
    eprintln!("lone messages reached the sink after {waits:?} (linger {linger:?})");
    assert!(
        waits[2] <= linger + Duration::from_millis(20),
        "lone messages waited {waits:?}, a linger of {linger:?}"
    );
    assert!(client.remove_sink("orders").await.unwrap());
    assert!(!client.remove_sink("orders").await.unwrap());
    assert_eq!(client.get_sink("orders").await.unwrap(), None);
    eventually(Duration::from_secs(10), "the pump gone", || async {
        let stats = client.queue_stats("orders").await.unwrap();
        stats.queues.iter().all(|q| q.consumers == 0)
    })
    .await;
    produce(&client, "orders", &["after"], 5).await;
    // A consumer now takes all five: had the removed sink's pump still
    // been taking, some would have gone to it instead.
    let mut consumer = client.consume("orders", 10).await.unwrap();
    let mut consumed = 0;
    while consumed < 5 {
        let event = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .expect("the five messages after the removal reach a consumer");
        if let Some(ConsumerEvent::Delivery(_)) = event.unwrap() {
            consumed += 1;
        }
    }
    assert_eq!(sink.received().len(), 6, "the removed sink got more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_queues_what_it_is_sent_gets_less_not_ever_more_batches() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    // It takes 200 msg/s and answers a batch only once its rate allows: what
    // it is sent beyond that queues inside it, and its answers come later
    // and later, as a broker's confirms do when its queue backs up. The cap
    // says 2,000, so only its slow answers tell floret to send less.
    let sink = DevSink::new(DevSinkBehaviour {
        rate: Some(200),
        ..Default::default()
    });
    let address = serve(&sink).await;
    let spec = SinkSpec {
        rate: 2_000,
        ..grpc_sink(&address, 20, 5)
    };
    client.set_sink("orders", spec).await.unwrap();
    produce(&client, "orders", &["a", "b", "c"], 1_000).await;
    // Past the first answers (800 messages: 4 s of the sink's rate), how
    // long the work queued inside the sink is, sampled every 100 ms for
    // 6 s. Sent by the cap and the answer time alone, a pump keeps the
    // most batches it may at a sink for its rate (16 of 20 messages):
    // 1.5-1.6 s measured. Cut at answers 4 times its first (100 ms), it
    // stays about there: 240-560 ms measured.
    eventually(
        Duration::from_secs(30),
        "the sink past its first answers",
        || {
            let taken = sink.received().len();
            async move { taken >= 800 }
        },
    )
    .await;
    let mut samples = tokio::time::interval(Duration::from_millis(100));
    let mut queued = Vec::new();
    for _ in 0..60 {
        samples.tick().await;
        queued.push(sink.queued_for().await);
    }
    queued.sort_unstable();
    let median = queued[queued.len() / 2];
    eprintln!("work queued inside the sink over 6 s, sorted: {queued:?}");
    assert!(
        median <= Duration::from_millis(800),
        "a sink answering later and later kept being sent more: {queued:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_nobody_could_dial_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    for (address, why) in [("ftp://sink:1", "scheme"), ("http://sink", "host and port")] {
        let refused = client
            .set_sink("orders", grpc_sink(address, 0, 0))
            .await
            .unwrap_err();
        assert!(refused.to_string().contains(why), "{address}: {refused}");
    }
    let mut too_big = grpc_sink("http://127.0.0.1:1", 20_000, 0);
    too_big.linger_ms = 1;
    assert!(
        client
            .set_sink("orders", too_big)
            .await
            .unwrap_err()
            .to_string()
            .contains("batch_max")
    );
    assert_eq!(client.get_sink("orders").await.unwrap(), None);
    assert!(node.client().serving().await.unwrap());
}

/// What the test webhook got: when each POST came, and its JSON.
type Posts = Arc<Mutex<Vec<(Instant, serde_json::Value)>>>;

/// Answers the first POST 429 with `Retry-After: 1`, then takes every
/// message but those whose sequence ends in 3, which it rejects.
async fn webhook(State(posts): State<Posts>, body: Bytes) -> Response {
    let batch: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let first = {
        let mut posts = posts.lock().unwrap();
        posts.push((Instant::now(), batch.clone()));
        posts.len() == 1
    };
    if first {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "1")],
            "slow down",
        )
            .into_response();
    }
    let results: Vec<serde_json::Value> = batch["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m["sequence"].as_u64().unwrap() % 10 {
            3 => serde_json::json!({ "outcome": "reject", "reason": "ends in 3" }),
            _ => serde_json::json!({ "outcome": "ok" }),
        })
        .collect();
    (
        [("content-type", "application/json")],
        serde_json::json!({ "results": results }).to_string(),
    )
        .into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_sink_honours_retry_after_and_rejects_what_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    let posts = Posts::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/in", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/in", post(webhook))
        .with_state(posts.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    client
        .set_sink(
            "orders",
            SinkSpec {
                target: Some(sink_spec::Target::Webhook(WebhookSink { url })),
                batch_max: 30,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let produced = produce(&client, "orders", &["a", "b"], 50).await;
    eventually(Duration::from_secs(30), "the backlog gone", || async {
        backlog(&client, "orders").await == 0
    })
    .await;
    let posts = posts.lock().unwrap().clone();
    assert!(
        posts[1].0 - posts[0].0 >= Duration::from_millis(950),
        "sent again {:?} after a 429 with Retry-After: 1",
        posts[1].0 - posts[0].0
    );
    let mut taken = BTreeSet::new();
    for (_, batch) in &posts[1..] {
        for m in batch["messages"].as_array().unwrap() {
            let name = (
                m["producer_id"].as_str().unwrap().to_owned(),
                m["sequence"].as_u64().unwrap(),
            );
            let payload = base64::engine::general_purpose::STANDARD
                .decode(m["payload"].as_str().unwrap())
                .unwrap();
            assert_eq!(payload, format!("{}-{}", name.0, name.1).into_bytes());
            taken.insert(name);
        }
    }
    assert_eq!(taken, produced, "every message was posted");
    let rejected: BTreeSet<(String, u64)> =
        produced.into_iter().filter(|(_, s)| s % 10 == 3).collect();
    let dead_letters = client.dead_letters("orders", 1000).await.unwrap();
    assert!(
        dead_letters.iter().all(|d| d.reason == "sink"),
        "{dead_letters:?}"
    );
    let dead: BTreeSet<(String, u64)> = dead_letters
        .into_iter()
        .map(|d| (d.producer_id, d.sequence))
        .collect();
    assert_eq!(dead, rejected);
}
