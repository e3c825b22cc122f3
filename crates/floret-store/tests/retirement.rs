//! Retiring a replica: everything the node stored of the shard is gone,
//! now and after reopening, while every other shard keeps its state, and
//! the shard's reader reads the empty shard a later replica starts from.

use std::collections::BTreeMap;

use floret_store::{Command, Database, Enqueue, NewMessage, Op, StateMachine, TypeConfig};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftSnapshotBuilder, Vote};

fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn produce(index: u64, producer: &str) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Command {
            ops: vec![Op::Enqueue(Enqueue {
                queue: "default".into(),
                producer: producer.into(),
                producer_sequence: None,
                enqueued_at_ms: 1_700_000_000_000,
                messages: vec![NewMessage {
                    payload: vec![7; 64],
                    headers: BTreeMap::new(),
                }],
            })],
        }),
    }
}

async fn fill(database: &Database, shard: u32) -> StateMachine {
    let mut state_machine = database.state_machine(shard, None).unwrap();
    state_machine
        .apply((1..=3).map(|index| produce(index, "p")).collect::<Vec<_>>())
        .await
        .unwrap();
    let mut log = database.log_store(shard);
    log.save_vote(&Vote::new_committed(4, 1)).await.unwrap();
    state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    state_machine
}

#[tokio::test]
async fn a_retired_replica_leaves_no_state_behind_and_its_neighbours_keep_theirs() {
    let dir = tempfile::tempdir().unwrap();
    {
        let database = Database::open(dir.path()).unwrap();
        let retired = fill(&database, 2).await;
        let kept = fill(&database, 5).await;
        let reader = retired.reader();
        assert_eq!(reader.totals().messages(), 3);
        drop(retired);

        database.shard_storage().retire(2).await.unwrap();

        assert_eq!(
            reader.totals().messages(),
            0,
            "the reader still counts them"
        );
        assert_eq!(reader.producers().count(), 0);
        let mut fresh = database.state_machine(2, None).unwrap();
        assert_eq!(fresh.applied_state().await.unwrap().0, None);
        assert!(fresh.get_current_snapshot().await.unwrap().is_none());
        let mut log = database.log_store(2);
        assert_eq!(log.read_vote().await.unwrap(), None);
        assert_eq!(log.get_log_state().await.unwrap().last_log_id, None);
        assert_eq!(kept.reader().totals().messages(), 3);
        database.close();
    }
    let database = Database::open(dir.path()).unwrap();
    let mut retired = database.state_machine(2, None).unwrap();
    assert_eq!(retired.applied_state().await.unwrap().0, None);
    assert_eq!(retired.reader().totals().messages(), 0);
    assert!(retired.get_current_snapshot().await.unwrap().is_none());
    assert_eq!(database.log_store(2).read_vote().await.unwrap(), None);
    let mut kept = database.state_machine(5, None).unwrap();
    assert_eq!(kept.applied_state().await.unwrap().0, Some(log_id(3)));
    assert_eq!(kept.reader().totals().messages(), 3);
    assert_eq!(
        database.log_store(5).read_vote().await.unwrap(),
        Some(Vote::new_committed(4, 1))
    );
}

#[tokio::test]
async fn a_replica_retired_and_moved_back_starts_from_what_its_leader_sends() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    drop(fill(&database, 1).await);
    database.shard_storage().retire(1).await.unwrap();
    let mut again = database.state_machine(1, None).unwrap();
    again.apply(vec![produce(9, "q")]).await.unwrap();
    database.sync().await.unwrap();
    drop(again);
    database.close();
    let database = Database::open(dir.path()).unwrap();
    let mut reopened = database.state_machine(1, None).unwrap();
    assert_eq!(reopened.applied_state().await.unwrap().0, Some(log_id(9)));
    let producers: Vec<String> = reopened
        .reader()
        .producers()
        .map(|entry| entry.unwrap().producer)
        .collect();
    assert_eq!(producers, ["q"]);
}
