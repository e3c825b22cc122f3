//! A queue's sink on three nodes: every node pumps the shards it leads into
//! the sink, and when a leader is SIGKILLed mid-stream its shards' messages
//! reach the sink through the new leaders. Every acknowledged message is
//! taken; the duplicates around the kill are counted, not lost. A sink down
//! for 20 s grows the backlog and loses nothing; what it rejects, and only
//! that, ends in the dead letters.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::time::Duration;

use floret_client::dev_sink::{DevSink, DevSinkBehaviour};
use floret_client::{Client, GrpcSink, SinkSpec, sink_spec};
use floret_proto::sink::v1::Outcome;

use super::harness::{Cluster, eventually, one_cluster_at_a_time};
use super::{DRAIN_DEADLINE, SHARDS, message};

const PRODUCERS: usize = 12;

/// Three nodes under `root` whose queue "orders" pushes into a dev sink
/// behaving as `behaviour` (served on a loopback port), with `settings`'
/// other fields; with that sink and a client of all three nodes.
pub(super) async fn three_nodes_pushing_into_a_dev_sink(
    root: &Path,
    behaviour: DevSinkBehaviour,
    settings: SinkSpec,
) -> (Cluster, DevSink, Client) {
    let cluster = Cluster::start(root, 3, &["--shards", SHARDS]);
    let sink = DevSink::new(behaviour);
    let client = cluster.client_of(&cluster.addresses());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(sink.clone().serve(listener));
    let spec = SinkSpec {
        target: Some(sink_spec::Target::Grpc(GrpcSink { address })),
        ..settings
    };
    client.set_sink("orders", spec).await.unwrap();
    (cluster, sink, client)
}
const MESSAGES_PER_PRODUCER: u64 = 300;
/// What the sink takes a second: slow enough that the kill comes mid-stream.
const SINK_RATE: u32 = 1_500;
/// Pause between one producer's produce calls while the sink is down.
const PRODUCE_PACE: Duration = Duration::from_millis(200);
/// How long the sink is down.
const SINK_DOWN: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leaders_messages_reach_the_sink_through_the_new_leaders() {
    let _one_cluster = one_cluster_at_a_time().await;
    let root = tempfile::tempdir().unwrap();
    let (mut cluster, sink, client) = three_nodes_pushing_into_a_dev_sink(
        root.path(),
        DevSinkBehaviour {
            rate: Some(SINK_RATE),
            ..Default::default()
        },
        SinkSpec {
            batch_max: 50,
            linger_ms: 5,
            ..Default::default()
        },
    )
    .await;
    let mut acknowledged = BTreeSet::new();
    for producer in 0..PRODUCERS {
        let name = format!("p{producer}");
        let mut sender = client.producer("orders", &name);
        for first in (0..MESSAGES_PER_PRODUCER).step_by(50) {
            let batch = (first..first + 50).map(|i| message(&name, i)).collect();
            sender.send(batch).await.unwrap();
            acknowledged.extend((first..first + 50).map(|i| (name.clone(), i)));
        }
    }
    eventually(Duration::from_secs(30), "the sink taking messages", || {
        let started = sink.received().len() >= 500;
        async move { started }
    })
    .await;
    let victim = cluster.leader_of(0, 1).await;
    cluster.kill(victim);
    let survivor = if victim == 1 { 2 } else { 1 };
    let taken = || -> HashSet<(String, u64)> {
        sink.received()
            .into_iter()
            .filter(|r| r.outcome == Outcome::Ok)
            .map(|r| {
                let payload = String::from_utf8(r.message.payload).unwrap();
                let (producer, counter) = payload.split_once(':').unwrap();
                (producer.to_owned(), counter.parse().unwrap())
            })
            .collect()
    };
    eventually(DRAIN_DEADLINE, "every acknowledged message taken", || {
        let taken = taken();
        let missing = acknowledged.iter().filter(|m| !taken.contains(m)).count();
        async move { missing == 0 }
    })
    .await;
    let survivor_client = cluster.client(survivor);
    eventually(Duration::from_secs(30), "the backlog gone", || async {
        let stats = survivor_client.queue_stats("orders").await.unwrap();
        stats.queues.iter().all(|q| q.backlog_messages == 0)
    })
    .await;
    let received = sink.received().len();
    let duplicates = received - taken().len();
    eprintln!(
        "sink failover: {} acknowledged, {received} received, {duplicates} duplicates after killing node {victim}",
        acknowledged.len()
    );
    assert!(
        duplicates <= 2 * 50 * 8,
        "more duplicates than the batches a dead leader could hold: {duplicates}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_down_for_20_s_grows_the_backlog_loses_nothing_and_dead_letters_exactly_its_rejects()
{
    let _one_cluster = one_cluster_at_a_time().await;
    let root = tempfile::tempdir().unwrap();
    let (cluster, sink, client) = three_nodes_pushing_into_a_dev_sink(
        root.path(),
        DevSinkBehaviour {
            reject_percent: 1,
            ..Default::default()
        },
        SinkSpec {
            ..Default::default()
        },
    )
    .await;
    let mut producers = Vec::new();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    for producer in 0..PRODUCERS {
        let (client, stopped) = (client.clone(), stopped.clone());
        producers.push(tokio::spawn(async move {
            let name = format!("p{producer}");
            let mut sender = client.producer("orders", &name);
            let mut acknowledged = Vec::new();
            let mut next = 0;
            while !*stopped.borrow() {
                let batch = (next..next + 10).map(|i| message(&name, i)).collect();
                sender.send(batch).await.unwrap();
                acknowledged.extend((next..next + 10).map(|i| (name.clone(), i)));
                next += 10;
                tokio::time::sleep(PRODUCE_PACE).await;
            }
            acknowledged
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    sink.set_down(true);
    tokio::time::sleep(SINK_DOWN).await;
    let via = cluster.client(1);
    let stats = via.queue_stats("orders").await.unwrap();
    let backlog: u64 = stats.queues.iter().map(|q| q.backlog_messages).sum();
    sink.set_down(false);
    stop.send_replace(true);
    let mut acknowledged = HashSet::new();
    for producer in producers {
        acknowledged.extend(producer.await.unwrap());
    }
    let calls_while_down = SINK_DOWN.as_millis() / PRODUCE_PACE.as_millis();
    let produced_while_down = calls_while_down as u64 * 10 * PRODUCERS as u64;
    assert!(
        backlog >= produced_while_down * 8 / 10,
        "the backlog was {backlog} after {SINK_DOWN:?} down"
    );
    eventually(DRAIN_DEADLINE, "the backlog gone", || async {
        let stats = via.queue_stats("orders").await.unwrap();
        stats.queues.iter().all(|q| q.backlog_messages == 0)
    })
    .await;
    let name_of = |payload: &[u8]| {
        let payload = String::from_utf8(payload.to_vec()).unwrap();
        let (producer, counter) = payload.split_once(':').unwrap();
        (producer.to_owned(), counter.parse::<u64>().unwrap())
    };
    let received = sink.received();
    let taken: HashSet<(String, u64)> = received
        .iter()
        .filter(|r| r.outcome == Outcome::Ok)
        .map(|r| name_of(&r.message.payload))
        .collect();
    let rejected: HashSet<(String, u64)> = received
        .iter()
        .filter(|r| r.outcome == Outcome::Reject)
        .map(|r| name_of(&r.message.payload))
        .collect();
    let dead: HashSet<(String, u64)> = via
        .dead_letters("orders", 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|d| name_of(&d.payload))
        .collect();
    eprintln!(
        "sink down: backlog {backlog} after {SINK_DOWN:?} down; {} acknowledged, {} taken, {} rejected, {} dead letters",
        acknowledged.len(),
        taken.len(),
        rejected.len(),
        dead.len()
    );
    assert!(!rejected.is_empty(), "1% of the messages are rejected");
    assert_eq!(
        dead, rejected,
        "exactly the rejected messages are dead letters"
    );
    let missing: Vec<_> = acknowledged
        .iter()
        .filter(|m| !taken.contains(*m) && !rejected.contains(*m))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
}
