//! Producer policies on one real `floret serve` process: limits and their
//! overflow actions, TTL, attempts and dead letters, weights, tiers, the
//! in-flight limit, produce rates, bad settings, and a restart.

mod harness;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use floret_client::{
    Client, ClientError, Consumer, ConsumerEvent, Delivery, Message, Overflow, Policy, RetryPolicy,
};
use harness::{FloretProcess, eventually};
use tonic::Code;

const QUEUE: &str = "governed";
/// Upper bound for any wait in these tests.
const DEADLINE: Duration = Duration::from_secs(60);

fn message(text: &str) -> Message {
    Message {
        payload: text.as_bytes().to_vec(),
        headers: HashMap::new(),
    }
}

fn payload(delivery: &Delivery) -> String {
    String::from_utf8(delivery.payload.clone()).unwrap()
}

/// A client that never retries, to see the server's first answer.
fn impatient(node: &FloretProcess) -> Client {
    node.client().with_retry(RetryPolicy {
        give_up_after: Duration::ZERO,
        ..RetryPolicy::default()
    })
}

async fn produce(client: &Client, producer: &str, texts: &[&str]) -> Result<(), ClientError> {
    client
        .produce(QUEUE, producer, texts.iter().map(|t| message(t)).collect())
        .await
        .map(|_| ())
}

async fn set(client: &Client, producer: &str, policy: Policy) {
    client
        .set_policy(QUEUE, producer, policy, false)
        .await
        .expect("set policy");
}

/// The next delivery on `consumer`, skipping settle outcomes (which must be OK).
async fn next_delivery(consumer: &mut Consumer) -> Delivery {
    loop {
        let event = tokio::time::timeout(DEADLINE, consumer.next())
            .await
            .expect("a delivery before the deadline")
            .expect("consume stream")
            .expect("stream open");
        match event {
            ConsumerEvent::Delivery(delivery) => return delivery,
            ConsumerEvent::Settled(outcomes) => {
                assert!(outcomes.iter().all(|o| o.code == 0), "{outcomes:?}")
            }
        }
    }
}

/// Consumes `count` deliveries, acking each and granting its credit back.
async fn consume_acking(consumer: &mut Consumer, count: usize) -> Vec<Delivery> {
    let mut deliveries = Vec::new();
    while deliveries.len() < count {
        let delivery = next_delivery(consumer).await;
        consumer
            .ack(vec![delivery.delivery_id.clone()])
            .await
            .unwrap();
        consumer.credit(1).await.unwrap();
        deliveries.push(delivery);
    }
    deliveries
}

fn status_of(error: ClientError) -> tonic::Status {
    match error {
        ClientError::Status(status) => status,
        other => panic!("expected a status, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_at_max_messages_with_reject_is_refused_while_others_keep_producing() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = impatient(&node);
    let limit = Policy {
        max_messages: Some(5),
        overflow: Overflow::Reject as i32,
        ..Policy::default()
    };
    set(&client, "", limit).await;
    produce(&client, "flood", &["0", "1", "2", "3", "4"])
        .await
        .unwrap();
    let refused = status_of(produce(&client, "flood", &["5"]).await.unwrap_err());
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .metadata()
            .get(floret_client::RETRY_AFTER_MS)
            .is_some()
    );
    assert!(
        refused.message().contains("max_messages 5"),
        "{}",
        refused.message()
    );
    for quiet in 0..10 {
        produce(&client, &format!("quiet-{quiet}"), &["hello"])
            .await
            .expect("a producer under its limit is accepted");
    }
    let mut consumer = client.consume(QUEUE, 1).await.unwrap();
    consume_acking(&mut consumer, 1).await;
    eventually(DEADLINE, "room for the flooder after an ack", || async {
        produce(&client, "flood", &["5"]).await.is_ok()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_oldest_and_dead_letter_oldest_keep_exactly_the_newest_max_messages() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    let keep_three = |overflow: Overflow| Policy {
        max_messages: Some(3),
        overflow: overflow as i32,
        ..Policy::default()
    };
    set(&client, "dropper", keep_three(Overflow::DropOldest)).await;
    set(&client, "letterer", keep_three(Overflow::DeadLetterOldest)).await;
    for index in 0..10 {
        let text = index.to_string();
        produce(&client, "dropper", &[&text]).await.unwrap();
        produce(&client, "letterer", &[&text]).await.unwrap();
    }
    let mut consumer = client.consume(QUEUE, 100).await.unwrap();
    let delivered = consume_acking(&mut consumer, 6).await;
    let of = |producer: &str| -> Vec<String> {
        delivered
            .iter()
            .filter(|d| d.producer_id == producer)
            .map(payload)
            .collect()
    };
    assert_eq!(of("dropper"), ["7", "8", "9"]);
    assert_eq!(of("letterer"), ["7", "8", "9"]);
    let dead = client.dead_letters(QUEUE, 100).await.unwrap();
    let lettered: Vec<(String, String, String)> = dead
        .iter()
        .map(|d| {
            (
                d.producer_id.clone(),
                String::from_utf8(d.payload.clone()).unwrap(),
                d.reason.clone(),
            )
        })
        .collect();
    let expected: Vec<_> = (0..7)
        .map(|i| ("letterer".to_owned(), i.to_string(), "overflow".to_owned()))
        .collect();
    assert_eq!(lettered, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expired_message_is_never_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    let ttl = Duration::from_millis(300);
    set(
        &client,
        "stale",
        Policy {
            ttl_ms: Some(ttl.as_millis() as u64),
            ..Policy::default()
        },
    )
    .await;
    produce(&client, "stale", &["s0", "s1", "s2"])
        .await
        .unwrap();
    // Committed before the produce answered, so expired once this passes.
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    produce(&client, "fresh", &["f0", "f1"]).await.unwrap();
    let mut consumer = client.consume(QUEUE, 10).await.unwrap();
    let delivered = consume_acking(&mut consumer, 2).await;
    assert!(
        delivered.iter().all(|d| d.producer_id == "fresh"),
        "{delivered:?}"
    );
    eventually(DEADLINE, "three TTL dead letters", || async {
        let dead = client.dead_letters(QUEUE, 10).await.unwrap();
        dead.len() == 3 && dead.iter().all(|d| d.reason == "ttl" && d.attempts == 0)
    })
    .await;
    // The last ack's removal may still be committing: wait for it.
    eventually(DEADLINE, "an empty backlog", || async {
        client.queue_stats(QUEUE).await.unwrap().queues[0].backlog_messages == 0
    })
    .await;
    let stats = client.queue_stats(QUEUE).await.unwrap();
    assert_eq!(stats.queues[0].backlog_messages, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_nacked_max_attempts_times_is_dead_lettered_and_can_be_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    set(
        &client,
        "",
        Policy {
            max_attempts: Some(3),
            ..Policy::default()
        },
    )
    .await;
    produce(&client, "poison", &["bad"]).await.unwrap();
    let mut consumer = client.consume(QUEUE, 10).await.unwrap();
    for attempt in 1..=3 {
        let delivery = next_delivery(&mut consumer).await;
        assert_eq!(
            (payload(&delivery).as_str(), delivery.attempt),
            ("bad", attempt)
        );
        consumer.nack(vec![delivery.delivery_id]).await.unwrap();
    }
    produce(&client, "refused", &["no"]).await.unwrap();
    let refused = next_delivery(&mut consumer).await;
    assert_eq!(refused.producer_id, "refused");
    consumer
        .dead_letter(vec![refused.delivery_id])
        .await
        .unwrap();
    eventually(DEADLINE, "both messages dead-lettered", || async {
        client.dead_letters(QUEUE, 10).await.unwrap().len() == 2
    })
    .await;
    let dead = client.dead_letters(QUEUE, 10).await.unwrap();
    let poison = dead.iter().find(|d| d.producer_id == "poison").unwrap();
    assert_eq!(
        (poison.reason.as_str(), poison.attempts),
        ("max_attempts", 3)
    );
    let nacked = dead.iter().find(|d| d.producer_id == "refused").unwrap();
    assert_eq!((nacked.reason.as_str(), nacked.attempts), ("nacked", 1));

    let replayed = client
        .replay_dead_letters(QUEUE, vec![poison.id.clone()])
        .await
        .unwrap();
    assert_eq!(replayed, 1);
    let again = next_delivery(&mut consumer).await;
    assert_eq!(
        (
            again.producer_id.as_str(),
            payload(&again).as_str(),
            again.attempt
        ),
        ("poison", "bad", 1)
    );
    consumer.ack(vec![again.delivery_id]).await.unwrap();
    let deleted = client
        .delete_dead_letters(QUEUE, vec![nacked.id.clone()])
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(client.dead_letters(QUEUE, 10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_three_to_one_give_three_to_one_deliveries_and_a_higher_tier_drains_first() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    set(
        &client,
        "heavy",
        Policy {
            weight: Some(3),
            ..Policy::default()
        },
    )
    .await;
    set(
        &client,
        "urgent",
        Policy {
            priority: Some(1),
            ..Policy::default()
        },
    )
    .await;
    let batch: Vec<String> = (0..100).map(|i| i.to_string()).collect();
    let batch: Vec<&str> = batch.iter().map(String::as_str).collect();
    for _ in 0..4 {
        produce(&client, "heavy", &batch).await.unwrap();
        produce(&client, "light", &batch).await.unwrap();
    }
    produce(&client, "urgent", &batch[..50]).await.unwrap();
    let mut consumer = client.consume(QUEUE, 32).await.unwrap();
    let delivered = consume_acking(&mut consumer, 450).await;
    assert!(
        delivered[..50].iter().all(|d| d.producer_id == "urgent"),
        "the higher tier did not drain first"
    );
    let heavy = delivered[50..]
        .iter()
        .filter(|d| d.producer_id == "heavy")
        .count() as f64;
    let light = delivered[50..]
        .iter()
        .filter(|d| d.producer_id == "light")
        .count() as f64;
    let ratio = heavy / light;
    assert!((2.85..=3.15).contains(&ratio), "{heavy}:{light} = {ratio}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_one_keeps_a_producers_order_across_a_redelivery() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    set(
        &client,
        "ordered",
        Policy {
            max_in_flight: Some(1),
            ..Policy::default()
        },
    )
    .await;
    produce(&client, "ordered", &["o0", "o1", "o2"])
        .await
        .unwrap();
    produce(&client, "other", &["x0", "x1", "x2"])
        .await
        .unwrap();
    let mut consumer = client.consume(QUEUE, 10).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(next_delivery(&mut consumer).await);
    }
    let ordered: Vec<&Delivery> = held.iter().filter(|d| d.producer_id == "ordered").collect();
    assert_eq!(ordered.len(), 1, "{held:?}");
    assert_eq!(payload(ordered[0]), "o0");
    consumer
        .nack(vec![ordered[0].delivery_id.clone()])
        .await
        .unwrap();
    let redelivered = next_delivery(&mut consumer).await;
    assert_eq!(
        (payload(&redelivered).as_str(), redelivered.attempt),
        ("o0", 2)
    );
    consumer.ack(vec![redelivered.delivery_id]).await.unwrap();
    let next = next_delivery(&mut consumer).await;
    assert_eq!(payload(&next), "o1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_over_its_rate_is_throttled_and_a_retrying_client_is_slowed_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = impatient(&node);
    set(
        &client,
        "metered",
        Policy {
            produce_rate: Some(20),
            ..Policy::default()
        },
    )
    .await;
    let burst: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    let burst: Vec<&str> = burst.iter().map(String::as_str).collect();
    produce(&client, "metered", &burst).await.unwrap();
    let throttled = status_of(produce(&client, "metered", &["over"]).await.unwrap_err());
    assert_eq!(throttled.code(), Code::ResourceExhausted);
    assert!(
        throttled
            .metadata()
            .get(floret_client::RETRY_AFTER_MS)
            .is_some()
    );
    produce(&client, "unmetered", &burst)
        .await
        .expect("others are not throttled");

    let patient = node.client();
    let started = Instant::now();
    for index in 0..20 {
        produce(&patient, "metered", &[&index.to_string()])
            .await
            .expect("a retrying client is slowed, not failed");
    }
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "20 messages at 20/s after the bucket was emptied took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_policy_settings_and_dead_letter_ids_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    let zero_weight = Policy {
        weight: Some(0),
        ..Policy::default()
    };
    let status = status_of(
        client
            .set_policy(QUEUE, "p", zero_weight, false)
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("weight"), "{}", status.message());
    let status = status_of(
        client
            .replay_dead_letters(QUEUE, vec!["nonsense".into()])
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("nonsense"),
        "{}",
        status.message()
    );
    let weight_three = Policy {
        weight: Some(3),
        ..Policy::default()
    };
    let status = status_of(
        client
            .set_tenant_policy(QUEUE, "acme", weight_three, false)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (status.code(), status.message().contains("token keys")),
        (Code::FailedPrecondition, true),
        "a tenant weight on a node without tenants: {}",
        status.message()
    );
    produce(&client, "p", &["still serving"]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("node");
    let limit = Policy {
        max_messages: Some(1),
        overflow: Overflow::Reject as i32,
        ..Policy::default()
    };
    {
        let mut node = FloretProcess::start(&data_dir, &[]);
        set(&node.client(), "capped", limit).await;
        produce(&node.client(), "capped", &["only"]).await.unwrap();
        node.kill();
    }
    let node = FloretProcess::start(&data_dir, &[]);
    let answer = node.client().get_policy(QUEUE, "capped").await.unwrap();
    assert_eq!(answer.producer_override.unwrap().max_messages, Some(1));
    let refused = status_of(
        produce(&impatient(&node), "capped", &["more"])
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code(), Code::ResourceExhausted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_past_its_high_watermark_slows_the_flooder_and_still_accepts_quiet_producers() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("floret.toml");
    std::fs::write(
        &config,
        "[backpressure]\nhigh_watermark_bytes = 200000\nlow_watermark_bytes = 100000\nretry_after_ms = 50\n",
    )
    .unwrap();
    let node = FloretProcess::start(
        &dir.path().join("node"),
        &["--config", config.to_str().unwrap()],
    );
    let patient = node.client().with_retry(RetryPolicy {
        give_up_after: Duration::from_secs(120),
        ..RetryPolicy::default()
    });
    const FLOOD_BATCHES: usize = 40;
    const FLOOD_BATCH: usize = 100;
    const FLOOD_MESSAGES: usize = FLOOD_BATCHES * FLOOD_BATCH;
    const FLOOD_PAYLOAD: [u8; 128] = [7; 128];
    let batch: Vec<Message> = (0..FLOOD_BATCH)
        .map(|_| Message {
            payload: FLOOD_PAYLOAD.to_vec(),
            headers: HashMap::new(),
        })
        .collect();
    let flood = tokio::spawn(async move {
        for _ in 0..FLOOD_BATCHES {
            patient
                .produce(QUEUE, "flood", batch.clone())
                .await
                .expect("the flooder is slowed, not failed");
        }
    });

    let client = impatient(&node);
    eventually(DEADLINE, "the flooder throttled by the node", || async {
        match produce(&client, "flood", &["probe"]).await {
            Err(ClientError::Status(status)) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(status.message().contains("fair share"), "{status:?}");
                true
            }
            _ => false,
        }
    })
    .await;
    for quiet in 0..10 {
        produce(&client, &format!("quiet-{quiet}"), &["hello"])
            .await
            .expect("a producer under its fair share is accepted past the watermark");
    }
    assert!(!flood.is_finished(), "the flood went through unthrottled");

    // Count flood messages by payload rather than waiting for the flood task
    // to finish: the last batch can be delivered before its produce call
    // returns to the flooder.
    let mut consumer = client.consume(QUEUE, 256).await.unwrap();
    let mut quiet_delivered = std::collections::HashSet::new();
    let mut flood_delivered = 0;
    while quiet_delivered.len() < 10 || flood_delivered < FLOOD_MESSAGES {
        let Ok(delivery) = tokio::time::timeout(DEADLINE / 2, next_delivery(&mut consumer)).await
        else {
            let stats = client.queue_stats(QUEUE).await;
            panic!(
                "no delivery for {:?}: {} quiet and {flood_delivered} flood delivered, \
                 flood finished: {}, stats: {stats:?}",
                DEADLINE / 2,
                quiet_delivered.len(),
                flood.is_finished()
            );
        };
        if delivery.producer_id.starts_with("quiet-") {
            quiet_delivered.insert(delivery.producer_id.clone());
        } else if delivery.payload == FLOOD_PAYLOAD {
            flood_delivered += 1;
        }
        consumer.ack(vec![delivery.delivery_id]).await.unwrap();
        consumer.credit(1).await.unwrap();
    }
    flood
        .await
        .expect("every flood batch was accepted in the end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_message_does_not_hold_back_its_neighbours_and_comes_in_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let deliver_at = now_ms + 1_500;
    client
        .produce_at(QUEUE, "later", vec![message("late")], deliver_at)
        .await
        .unwrap();
    produce(&client, "later", &["on time"]).await.unwrap();
    for neighbour in ["a", "b"] {
        produce(&client, neighbour, &["0", "1", "2"]).await.unwrap();
    }
    let mut consumer = client.consume(QUEUE, 32).await.unwrap();
    let first = consume_acking(&mut consumer, 8).await;
    let arrived_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let (late, others): (Vec<_>, Vec<_>) = first.iter().partition(|d| payload(d) == "late");
    assert_eq!(late.len(), 1, "{first:?}");
    assert_eq!(others.len(), 7);
    assert_eq!(
        payload(first.last().unwrap()),
        "late",
        "the delayed message held back a neighbour or its own producer's next message"
    );
    assert!(
        arrived_at_ms >= deliver_at,
        "delivered {} ms early",
        deliver_at - arrived_at_ms
    );
    assert_eq!(late[0].attempt, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_producer_without_an_override_is_forgotten_and_may_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("floret.toml");
    std::fs::write(&config, "[producers]\nforget_idle_after_ms = 300\n").unwrap();
    let node = FloretProcess::start(
        &dir.path().join("node"),
        &["--config", config.to_str().unwrap()],
    );
    let client = node.client();
    set(
        &client,
        "governed-one",
        Policy {
            weight: Some(2),
            ..Policy::default()
        },
    )
    .await;
    for producer in ["passer-by", "governed-one"] {
        produce(&client, producer, &["hello"]).await.unwrap();
    }
    let mut consumer = client.consume(QUEUE, 10).await.unwrap();
    consume_acking(&mut consumer, 2).await;
    let producers = |stats: floret_client::QueueStatsResponse| -> Vec<String> {
        let mut ids: Vec<String> = stats
            .queues
            .iter()
            .flat_map(|q| q.producers.iter().map(|p| p.producer_id.clone()))
            .collect();
        ids.sort();
        ids
    };
    eventually(DEADLINE, "the idle producer forgotten", || async {
        producers(client.queue_stats(QUEUE).await.unwrap()) == ["governed-one"]
    })
    .await;
    let again = client
        .produce(QUEUE, "passer-by", vec![message("back")])
        .await
        .unwrap();
    assert_eq!(again.sequences, [0]);
    let delivery = next_delivery(&mut consumer).await;
    assert_eq!(payload(&delivery), "back");
}

/// Runs the `floret` CLI against `node` and returns its stdout; panics with
/// its stderr if it fails.
fn floret_cli(node: &FloretProcess, args: &[&str]) -> String {
    let output = std::process::Command::new(harness::floret_binary())
        .args(args)
        .args(["--addr", &node.address, "--queue", QUEUE])
        .output()
        .expect("run floret");
    assert!(
        output.status.success(),
        "floret {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_and_dead_letters_are_managed_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let set = floret_cli(
        &node,
        &[
            "policy",
            "set",
            "--producer",
            "p",
            "--max-messages",
            "1",
            "--overflow",
            "dead-letter-oldest",
        ],
    );
    assert!(set.contains(r#""overflow":"dead_letter_oldest""#), "{set}");
    let got = floret_cli(&node, &["policy", "get", "--producer", "p"]);
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(got["effective"]["max_messages"], 1);
    assert_eq!(got["effective"]["weight"], 1);
    produce(&node.client(), "p", &["first", "second", "third"])
        .await
        .unwrap();
    let listed = floret_cli(&node, &["dead-letters", "list"]);
    let lines: Vec<serde_json::Value> = listed
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{listed}");
    assert_eq!(lines[0]["payload"], "first");
    assert_eq!(lines[0]["reason"], "overflow");
    let id = lines[0]["id"].as_str().unwrap();
    floret_cli(&node, &["policy", "set", "--producer", "p", "--replace"]);
    let replayed = floret_cli(&node, &["dead-letters", "replay", "--ids", id]);
    assert!(replayed.contains(r#""replayed":1"#), "{replayed}");
    let deleted = floret_cli(&node, &["dead-letters", "delete", "--all"]);
    assert!(deleted.contains(r#""deleted":1"#), "{deleted}");
    let mut consumer = node.client().consume(QUEUE, 10).await.unwrap();
    let delivered: Vec<String> = consume_acking(&mut consumer, 2)
        .await
        .iter()
        .map(payload)
        .collect();
    assert_eq!(delivered, ["third", "first"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_larger_than_the_limit_by_itself_is_refused_as_invalid_not_as_retry_later() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = impatient(&node);
    let limit = Policy {
        max_messages: Some(2),
        overflow: Overflow::Reject as i32,
        ..Policy::default()
    };
    set(&client, "small", limit).await;
    let status = status_of(
        produce(&client, "small", &["a", "b", "c"])
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("never be stored"),
        "{}",
        status.message()
    );
    produce(&client, "small", &["a", "b"]).await.unwrap();
}
