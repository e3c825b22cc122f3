//! The workload floret exists for, against a real RabbitMQ: one producer
//! floods 100,000 messages and 20 quiet producers send one every 50 ms, all
//! into one RabbitMQ queue whose consumer drains 2,000 msg/s (the paid
//! queue's capacity). Through floret (its sink capped a little under that
//! capacity) the quiet producers' messages arrive within milliseconds;
//! published straight into RabbitMQ, they wait behind the flood (FIFO). 0
//! acknowledged messages lost; duplicates counted.
//!
//! The flood is 20,000 messages unless `FLORET_RABBITMQ_FLOOD` says how many:
//! that keeps the test's two drains to about 20 s in CI and still puts
//! seconds of FIFO wait behind the flood. The full workload is
//! `FLORET_RABBITMQ_FLOOD=100000 cargo test --all-features --test shared_sink
//! -- rabbitmq --nocapture` (about two minutes in a debug build).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floret_client::{AmqpSink, Message, SinkSpec, sink_spec};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use super::amqp_sink::{RabbitMq, one_rabbit_at_a_time};
use super::harness::{FloretProcess, eventually};

/// Flood messages when `FLORET_RABBITMQ_FLOOD` is not set.
const CI_FLOOD: usize = 20_000;
const QUIET_PRODUCERS: usize = 20;
const QUIET_PACE: Duration = Duration::from_millis(50);
/// What the RabbitMQ consumer drains, messages/s.
const DRAIN_RATE: f64 = 2_000.0;
/// The sink's cap: a little under the drain, so RabbitMQ's queue stays short.
const SINK_RATE: u32 = 1_900;
/// The quiet producers' p99, produce to arrival at the consumer, through
/// floret, in this debug build beside RabbitMQ on the test's machine: a
/// bound on stalls, not the figure floret claims (a release cluster gives
/// 130 ms or so, BENCHMARKS.md "The shared sink"). At 150 ms the test
/// failed on a two-core machine at 169-505 ms, at the commit it had passed
/// at before. The ratio to RabbitMQ alone below is what it shows.
const QUIET_P99_AT_MOST: Duration = Duration::from_secs(1);
/// How long the straight-into-RabbitMQ run sends quiet messages.
const FIFO_QUIET_SECONDS: Duration = Duration::from_secs(2);
/// How long the first of them may take to reach the consumer.
const FIFO_DEADLINE: Duration = Duration::from_secs(150);

/// What the consumer got: each message's name ("producer/counter") and
/// how long after it was sent it arrived.
#[derive(Default)]
struct Arrivals {
    names: Vec<String>,
    quiet_latencies: Vec<Duration>,
}

/// Drains `queue` at [`DRAIN_RATE`], recording arrivals; the payload is
/// "<producer>/<counter>/<micros since `epoch` when sent>".
async fn drain(channel: Channel, queue: &str, epoch: Instant, arrivals: Arc<Mutex<Arrivals>>) {
    channel
        .basic_qos(10, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "drain".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let pace = Duration::from_secs_f64(1.0 / DRAIN_RATE);
    let mut next = tokio::time::Instant::now();
    while let Some(Ok(delivery)) = consumer.next().await {
        let arrived = epoch.elapsed();
        let payload = String::from_utf8(delivery.data.clone()).unwrap();
        let mut parts = payload.split('/');
        let (producer, counter, sent) = (
            parts.next().unwrap().to_owned(),
            parts.next().unwrap().to_owned(),
            Duration::from_micros(parts.next().unwrap().parse().unwrap()),
        );
        {
            let mut arrivals = arrivals.lock().unwrap();
            if producer.starts_with("quiet") {
                arrivals.quiet_latencies.push(arrived.saturating_sub(sent));
            }
            arrivals.names.push(format!("{producer}/{counter}"));
        }
        delivery.ack(BasicAckOptions::default()).await.unwrap();
        next += pace;
        tokio::time::sleep_until(next).await;
    }
}

fn payload(producer: &str, counter: usize, epoch: Instant) -> Vec<u8> {
    format!("{producer}/{counter}/{}", epoch.elapsed().as_micros()).into_bytes()
}

fn p99(latencies: &[Duration]) -> Duration {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)]
}

/// How many messages the flood sends: `FLORET_RABBITMQ_FLOOD`, in thousands
/// rounded up, or [`CI_FLOOD`].
fn flood_size() -> usize {
    let asked = std::env::var("FLORET_RABBITMQ_FLOOD").ok().map(|value| {
        value
            .parse::<usize>()
            .expect("FLORET_RABBITMQ_FLOOD is a count")
    });
    asked.unwrap_or(CI_FLOOD).div_ceil(1_000).max(1) * 1_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_producers_wait_milliseconds_through_floret_and_seconds_straight_into_rabbitmq() {
    let flood_size = flood_size();
    let _one_rabbit = one_rabbit_at_a_time().await;
    let rabbit = RabbitMq::start().await;
    let amqp = Connection::connect(&rabbit.uri(), ConnectionProperties::default())
        .await
        .unwrap();
    let setup = amqp.create_channel().await.unwrap();
    setup
        .queue_declare(
            "paid".into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();

    // Through floret.
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    client
        .set_sink(
            "orders",
            SinkSpec {
                target: Some(sink_spec::Target::Amqp(AmqpSink {
                    uri: rabbit.uri(),
                    exchange: String::new(),
                    routing_key: "paid".into(),
                })),
                rate: SINK_RATE,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let epoch = Instant::now();
    let arrivals = Arc::new(Mutex::new(Arrivals::default()));
    let consumer = tokio::spawn(drain(
        amqp.create_channel().await.unwrap(),
        "paid",
        epoch,
        arrivals.clone(),
    ));
    client
        .produce(
            "orders",
            "probe",
            vec![Message {
                payload: payload("probe", 0, epoch),
                headers: Default::default(),
            }],
        )
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "the sink pumping", || {
        let pumping = !arrivals.lock().unwrap().names.is_empty();
        async move { pumping }
    })
    .await;
    let flood = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut sender = client.producer("orders", "flood");
            for first in (0..flood_size).step_by(1_000) {
                let batch = (first..first + 1_000)
                    .map(|i| Message {
                        payload: payload("flood", i, epoch),
                        headers: Default::default(),
                    })
                    .collect();
                sender.send(batch).await.unwrap();
            }
        })
    };
    let flood_drained = {
        let arrivals = arrivals.clone();
        move || {
            let names = arrivals.lock().unwrap().names.len();
            async move { names >= flood_size }
        }
    };
    let mut quiet = Vec::new();
    let quiet_until = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for producer in 0..QUIET_PRODUCERS {
        let (client, stop) = (client.clone(), quiet_until.clone());
        quiet.push(tokio::spawn(async move {
            let name = format!("quiet{producer:02}");
            let mut sender = client.producer("orders", &name);
            let mut acknowledged = Vec::new();
            let mut counter = 0;
            tokio::time::sleep(QUIET_PACE * producer as u32 / QUIET_PRODUCERS as u32).await;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let message = Message {
                    payload: payload(&name, counter, epoch),
                    headers: Default::default(),
                };
                sender.send(vec![message]).await.unwrap();
                acknowledged.push(format!("{name}/{counter}"));
                counter += 1;
                tokio::time::sleep(QUIET_PACE).await;
            }
            acknowledged
        }));
    }
    flood.await.unwrap();
    eventually(
        Duration::from_secs(150),
        "the flood drained into RabbitMQ",
        flood_drained,
    )
    .await;
    quiet_until.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut acknowledged: BTreeSet<String> =
        (0..flood_size).map(|i| format!("flood/{i}")).collect();
    acknowledged.insert("probe/0".to_owned());
    for producer in quiet {
        acknowledged.extend(producer.await.unwrap());
    }
    eventually(
        Duration::from_secs(30),
        "every acknowledged message in RabbitMQ",
        || {
            let arrived: BTreeSet<String> =
                arrivals.lock().unwrap().names.iter().cloned().collect();
            let all = acknowledged.is_subset(&arrived);
            async move { all }
        },
    )
    .await;
    consumer.abort();
    let (through_floret, duplicates, quiet_count) = {
        let arrivals = arrivals.lock().unwrap();
        let distinct: BTreeSet<&String> = arrivals.names.iter().collect();
        (
            p99(&arrivals.quiet_latencies),
            arrivals.names.len() - distinct.len(),
            arrivals.quiet_latencies.len(),
        )
    };
    client.remove_sink("orders").await.unwrap();

    // Straight into RabbitMQ, for the FIFO figure.
    setup
        .queue_purge("paid".into(), QueuePurgeOptions::default())
        .await
        .unwrap();
    let publisher = amqp.create_channel().await.unwrap();
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let publish = |publisher: Channel, payload: Vec<u8>| async move {
        publisher
            .basic_publish(
                "".into(),
                "paid".into(),
                BasicPublishOptions::default(),
                &payload,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    };
    let epoch = Instant::now();
    let fifo = Arc::new(Mutex::new(Arrivals::default()));
    let consumer = tokio::spawn(drain(
        amqp.create_channel().await.unwrap(),
        "paid",
        epoch,
        fifo.clone(),
    ));
    for i in 0..flood_size {
        let confirm = publisher
            .basic_publish(
                "".into(),
                "paid".into(),
                BasicPublishOptions::default(),
                &payload("flood", i, epoch),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap();
        if i % 1_000 == 999 {
            confirm.await.unwrap();
        }
    }
    let mut counter = 0;
    let quiet_from = Instant::now();
    while quiet_from.elapsed() < FIFO_QUIET_SECONDS {
        for producer in 0..QUIET_PRODUCERS {
            publish(
                publisher.clone(),
                payload(&format!("quiet{producer:02}"), counter, epoch),
            )
            .await;
        }
        counter += 1;
        tokio::time::sleep(QUIET_PACE).await;
    }
    eventually(
        FIFO_DEADLINE,
        "a quiet message through RabbitMQ's FIFO",
        || {
            let arrived = !fifo.lock().unwrap().quiet_latencies.is_empty();
            async move { arrived }
        },
    )
    .await;
    consumer.abort();
    let fifo_best = *fifo.lock().unwrap().quiet_latencies.iter().min().unwrap();
    eprintln!(
        "rabbitmq noisy neighbor ({flood_size} flooded): through floret quiet p99 {through_floret:?} over {quiet_count} quiet messages, {duplicates} duplicates of {} arrived; straight into RabbitMQ the first quiet message waited {fifo_best:?}, and every later one longer",
        acknowledged.len(),
    );
    assert!(
        through_floret <= QUIET_P99_AT_MOST,
        "quiet p99 through floret {through_floret:?}"
    );
    assert!(
        fifo_best > through_floret * 10,
        "straight into RabbitMQ a quiet message waited only {fifo_best:?}"
    );
}
