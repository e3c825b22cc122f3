//! A queue's sink into a real RabbitMQ (Debian's `rabbitmq-server`, which
//! `.ci/run` installs when missing), started here on loopback ports: every
//! message arrives persistent, with its headers and floret's, and leaves
//! floret only once RabbitMQ confirmed it; a routing key no queue is bound
//! to loses nothing.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use floret_client::{AmqpSink, Client, Message, SinkSpec, sink_spec};
use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

use super::harness::{FloretProcess, eventually};

const RABBITMQ_SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
/// How long RabbitMQ may take to start (about 8 s here).
const START_DEADLINE: Duration = Duration::from_secs(90);
/// How long RabbitMQ may take to stop after SIGTERM.
const STOP_DEADLINE: Duration = Duration::from_secs(20);

/// One RabbitMQ test at a time: two would share two cores with two nodes.
pub async fn one_rabbit_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static RABBITS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    RABBITS.lock().await
}

/// A RabbitMQ node of its own: its files under a temporary dir, its AMQP,
/// distribution and epmd ports picked free on loopback.
pub struct RabbitMq {
    server: Child,
    epmd_port: u16,
    amqp_port: u16,
    _dir: tempfile::TempDir,
}

impl RabbitMq {
    /// Starts it and waits until it takes AMQP connections.
    pub async fn start() -> Self {
        assert!(
            Path::new(RABBITMQ_SERVER).exists(),
            "{RABBITMQ_SERVER} is missing: apt-get install rabbitmq-server (.ci/run does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let ports = floret_chaos::ports::free_loopback_ports(3).unwrap();
        let (amqp_port, dist_port, epmd_port) = (ports[0], ports[1], ports[2]);
        let base: PathBuf = dir.path().to_owned();
        std::fs::write(
            base.join("rabbitmq.conf"),
            format!("listeners.tcp.1 = 127.0.0.1:{amqp_port}\nloopback_users = none\n"),
        )
        .unwrap();
        std::fs::write(base.join("enabled_plugins"), "[].\n").unwrap();
        let server = Command::new(RABBITMQ_SERVER)
            .process_group(0)
            .env("HOME", &base)
            .env("RABBITMQ_CONFIG_FILE", base.join("rabbitmq"))
            .env("RABBITMQ_MNESIA_BASE", base.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", base.join("log"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                base.join("enabled_plugins"),
            )
            .env("RABBITMQ_PID_FILE", base.join("pid"))
            .env(
                "RABBITMQ_NODENAME",
                format!("floret-test-{amqp_port}@localhost"),
            )
            .env("RABBITMQ_DIST_PORT", dist_port.to_string())
            .env("ERL_EPMD_PORT", epmd_port.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let rabbit = Self {
            server,
            epmd_port,
            amqp_port,
            _dir: dir,
        };
        let started = Instant::now();
        while Connection::connect(&rabbit.uri(), ConnectionProperties::default())
            .await
            .is_err()
        {
            assert!(
                started.elapsed() < START_DEADLINE,
                "RabbitMQ did not take connections within {START_DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        rabbit
    }

    pub fn uri(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }
}

impl Drop for RabbitMq {
    /// Stops the node (its start script and the Erlang VM, in their own
    /// process group: SIGTERM, then SIGKILL after a deadline) and the epmd
    /// it started (a daemon of its own).
    fn drop(&mut self) {
        let group = format!("-{}", self.server.id());
        let signal = |name: &str| {
            let _ = Command::new("kill")
                .args([name, "--", &group])
                .stderr(Stdio::null())
                .status();
        };
        signal("-TERM");
        let until = Instant::now() + STOP_DEADLINE;
        while Instant::now() < until && matches!(self.server.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        signal("-KILL");
        let _ = self.server.wait();
        let _ = Command::new("epmd")
            .args(["-port", &self.epmd_port.to_string(), "-kill"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
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
async fn messages_reach_rabbitmq_persistent_with_their_headers_and_an_unbound_key_loses_none() {
    let _one_rabbit = one_rabbit_at_a_time().await;
    let rabbit = RabbitMq::start().await;
    let amqp = Connection::connect(&rabbit.uri(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = amqp.create_channel().await.unwrap();
    channel
        .queue_declare(
            "shared".into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    let sink = |routing_key: &str| SinkSpec {
        target: Some(sink_spec::Target::Amqp(AmqpSink {
            uri: rabbit.uri(),
            exchange: String::new(),
            routing_key: routing_key.to_owned(),
        })),
        batch_max: 50,
        ..Default::default()
    };
    client
        .set_sink("orders", sink("no-such-queue"))
        .await
        .unwrap();
    let mut produced = BTreeSet::new();
    for producer in ["a", "b", "c"] {
        let messages = (0..100)
            .map(|i| Message {
                payload: format!("{producer}-{i}").into_bytes(),
                headers: [("kind".to_owned(), "order".to_owned())].into(),
            })
            .collect();
        let answer = client.produce("orders", producer, messages).await.unwrap();
        produced.extend(answer.sequences.iter().map(|&s| (producer.to_owned(), s)));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        backlog(&client, "orders").await,
        300,
        "messages RabbitMQ returned as unroutable left floret"
    );
    client.set_sink("orders", sink("shared")).await.unwrap();
    eventually(Duration::from_secs(60), "the backlog gone", || async {
        backlog(&client, "orders").await == 0
    })
    .await;
    let mut arrived = Vec::new();
    while let Some(message) = channel
        .basic_get("shared".into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        arrived.push(message);
    }
    let header = |message: &lapin::message::BasicGetMessage, name: &str| -> String {
        match message
            .delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(name).cloned())
        {
            Some(AMQPValue::LongString(value)) => value.to_string(),
            other => panic!("header {name}: {other:?}"),
        }
    };
    let names: BTreeSet<(String, u64)> = arrived
        .iter()
        .map(|m| {
            (
                header(m, "x-floret-producer"),
                header(m, "x-floret-sequence").parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(names, produced, "every message arrived");
    for message in &arrived {
        assert_eq!(*message.delivery.properties.delivery_mode(), Some(2));
        assert_eq!(header(message, "kind"), "order");
        let producer = header(message, "x-floret-producer");
        let sequence = header(message, "x-floret-sequence");
        assert_eq!(
            String::from_utf8(message.delivery.data.clone()).unwrap(),
            format!("{producer}-{sequence}")
        );
    }
    eprintln!(
        "amqp sink: {} produced, {} arrived ({} duplicates)",
        produced.len(),
        arrived.len(),
        arrived.len() - names.len()
    );
}
