//! A shard's raft group on the sled store: snapshots are built, the log
//! behind them is purged, and a restart recovers the same state from the
//! snapshot and the remaining log.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::{Peers, RaftTuning, Shards};
use floret_store::{Command, Database, Enqueue, MessageRef, NewMessage, Op};

const SNAPSHOT_EVERY: u64 = 40;
const DEADLINE: Duration = Duration::from_secs(30);

fn tuning() -> RaftTuning {
    RaftTuning {
        snapshot_every_entries: SNAPSHOT_EVERY,
        logs_kept_after_snapshot: 5,
        ..RaftTuning::default()
    }
}

fn enqueue(producer: &str, counter: u64) -> Op {
    Op::Enqueue(Enqueue {
        queue: "default".into(),
        producer: producer.into(),
        producer_sequence: None,
        enqueued_at_ms: 0,
        messages: vec![NewMessage {
            payload: counter.to_be_bytes().to_vec(),
            headers: Default::default(),
        }],
    })
}

async fn start(dir: &std::path::Path) -> (Database, Shards) {
    let database = Database::open(dir).unwrap();
    let peers =
        Arc::new(Peers::new(1, BTreeMap::from([(1, "127.0.0.1:1".to_owned())]), None).unwrap());
    let shards = Shards::open(peers, &[1], &database, 1, 3, &tuning(), Arc::new(|_| {}))
        .await
        .unwrap();
    shards.bootstrap().await.unwrap();
    let mut metrics = shards.opened_group(0).unwrap().raft.metrics();
    tokio::time::timeout(DEADLINE, metrics.wait_for(|m| m.current_leader == Some(1)))
        .await
        .expect("elected in time")
        .unwrap();
    (database, shards)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_rebuilt_from_snapshot_and_purged_log_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (database, shards) = start(dir.path()).await;
    let raft = shards.opened_group(0).unwrap().raft.clone();
    for counter in 0..150 {
        raft.client_write(Command {
            ops: vec![enqueue("p", counter)],
        })
        .await
        .unwrap();
    }
    let removals = (0..50)
        .map(|sequence| MessageRef {
            queue: "default".into(),
            producer: "p".into(),
            sequence,
        })
        .collect();
    raft.client_write(Command {
        ops: vec![Op::Remove(removals)],
    })
    .await
    .unwrap();
    let mut metrics = raft.metrics();
    let purged = tokio::time::timeout(
        DEADLINE,
        metrics.wait_for(|m| m.snapshot.is_some() && m.purged.is_some()),
    )
    .await
    .expect("a snapshot and a purge within the deadline")
    .unwrap()
    .clone();
    assert!(purged.purged.unwrap().index > 0);
    let before = shards
        .opened_group(0)
        .unwrap()
        .reader
        .producer("default", "p")
        .unwrap()
        .unwrap();
    let applied_before = raft.metrics().borrow().last_applied;
    shards.shutdown().await;
    database.sync().await.unwrap();
    drop(raft);
    drop(shards);
    database.close();

    let (database, shards) = start(dir.path()).await;
    let reader = &shards.opened_group(0).unwrap().reader;
    let mut metrics = shards.opened_group(0).unwrap().raft.metrics();
    tokio::time::timeout(
        DEADLINE,
        metrics.wait_for(|m| m.last_applied >= applied_before),
    )
    .await
    .expect("re-applied in time")
    .unwrap();
    let after = reader.producer("default", "p").unwrap().unwrap();
    assert_eq!(after, before);
    assert_eq!((after.tail, after.messages, after.acked), (150, 100, 50));
    assert_eq!(reader.message("default", "p", 49).unwrap(), None);
    assert_eq!(
        reader
            .message("default", "p", 149)
            .unwrap()
            .unwrap()
            .payload,
        149u64.to_be_bytes()
    );
    shards.shutdown().await;
    drop(shards);
    database.close();
}
