//! Acks at a producer's head move the head and store no removal marks
//! (`runs/removed.rs`); acks that overtake it are marked, and every reader
//! takes a message below the head for removed: after a restart, on a
//! replica that got the state by snapshot, and when the ack repeats.

use openraft::Entry;

use super::test_support::{
    SHARD, acks, append_and_apply, enqueue_payloads, install_snapshot_of, payload,
};
use crate::reader::ShardReader;
use crate::types::TypeConfig;
use crate::{Database, keys};

/// Producer `a` produces `count` messages in one call (one run).
fn enqueue(index: u64, count: u8) -> Entry<TypeConfig> {
    let payloads: Vec<Vec<u8>> = (0..count).map(payload).collect();
    enqueue_payloads(index, "a", &payloads)
}

/// Acks `sequences` of producer `a`.
fn remove(index: u64, sequences: &[u64]) -> Entry<TypeConfig> {
    acks(index, "a", sequences)
}

/// How many runs have removal marks stored, written out or not.
fn stored_marks(reader: &ShardReader) -> usize {
    reader
        .tree()
        .iter()
        .filter(|pair| pair.as_ref().unwrap().0[0] == keys::REMOVED_TAG)
        .count()
}

/// Which of producer `a`'s sequences below `tail` the reader calls stored.
fn live(reader: &ShardReader, tail: u64) -> Vec<u64> {
    (0..tail)
        .filter(|&sequence| reader.message("q", "a", sequence).unwrap().is_some())
        .collect()
}

#[tokio::test]
async fn an_ack_at_the_head_writes_no_removal_marks() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    append_and_apply(&database, enqueue(1, 3), true).await;
    append_and_apply(&database, remove(2, &[0]), true).await;
    append_and_apply(&database, remove(3, &[1]), true).await;
    let reader = database.state_machine(SHARD, None).unwrap().reader();
    assert_eq!(stored_marks(&reader), 0);
    let record = reader.producer("q", "a").unwrap().unwrap();
    assert_eq!((record.head, record.messages, record.acked), (2, 1, 2));
    assert_eq!(live(&reader, 3), vec![2]);
    assert_eq!(
        reader.oldest_message("q", "a", 0).unwrap().unwrap().0,
        2,
        "a reader asking from before the head starts at the head"
    );
}

#[tokio::test]
async fn an_ack_that_overtook_the_head_is_marked_and_the_head_skips_it() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    append_and_apply(&database, enqueue(1, 4), true).await;
    append_and_apply(&database, remove(2, &[2]), true).await;
    let reader = database.state_machine(SHARD, None).unwrap().reader();
    assert_eq!(stored_marks(&reader), 1);
    assert_eq!(reader.producer("q", "a").unwrap().unwrap().head, 0);
    append_and_apply(&database, remove(3, &[0, 1]), true).await;
    let record = reader.producer("q", "a").unwrap().unwrap();
    assert_eq!((record.head, record.messages), (3, 1));
    assert_eq!(live(&reader, 4), vec![3]);
    append_and_apply(&database, remove(4, &[3]), true).await;
    assert_eq!(
        stored_marks(&reader),
        0,
        "the run went, and its marks with it"
    );
    assert_eq!(reader.producer("q", "a").unwrap().unwrap().messages, 0);
}

#[tokio::test]
async fn an_ack_repeated_after_a_restart_below_the_head_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    {
        let database = Database::open(dir.path()).unwrap();
        append_and_apply(&database, enqueue(1, 3), true).await;
        append_and_apply(&database, remove(2, &[0, 1]), true).await;
        database.sync().await.unwrap();
        database.close();
    }
    let database = Database::open(dir.path()).unwrap();
    let reader = database.state_machine(SHARD, None).unwrap().reader();
    assert_eq!(
        live(&reader, 3),
        vec![2],
        "no held run after a restart: the head alone says 0 and 1 are gone"
    );
    append_and_apply(&database, remove(3, &[1, 0]), true).await;
    let record = reader.producer("q", "a").unwrap().unwrap();
    assert_eq!((record.head, record.messages, record.acked), (2, 1, 2));
}

#[tokio::test]
async fn a_replica_installing_a_snapshot_reads_messages_below_the_head_as_removed() {
    let source_dir = tempfile::tempdir().unwrap();
    let target_dir = tempfile::tempdir().unwrap();
    let source = Database::open(source_dir.path()).unwrap();
    let target = Database::open(target_dir.path()).unwrap();
    append_and_apply(&source, enqueue(1, 3), true).await;
    append_and_apply(&source, remove(2, &[0]), true).await;
    let reader = install_snapshot_of(&source, &target).await;
    assert_eq!(live(&reader, 3), vec![1, 2]);
    append_and_apply(&target, remove(3, &[0, 1]), true).await;
    let record = reader.producer("q", "a").unwrap().unwrap();
    assert_eq!((record.head, record.messages), (2, 1));
}

#[tokio::test]
async fn a_head_left_behind_a_run_deleted_by_overtaking_acks_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    append_and_apply(&database, enqueue(1, 2), true).await;
    append_and_apply(&database, enqueue(2, 2), true).await;
    append_and_apply(&database, enqueue(3, 2), true).await;
    append_and_apply(&database, remove(4, &[2, 3]), true).await;
    let reader = database.state_machine(SHARD, None).unwrap().reader();
    assert_eq!(
        reader.producer("q", "a").unwrap().unwrap().head,
        0,
        "the second run went by its marks; the head is still in the first"
    );
    append_and_apply(&database, remove(5, &[4]), true).await;
    assert_eq!(
        stored_marks(&reader),
        1,
        "the head is still in the first run, so 4 is marked"
    );
    append_and_apply(&database, remove(6, &[0, 1]), true).await;
    append_and_apply(&database, remove(7, &[5]), true).await;
    let record = reader.producer("q", "a").unwrap().unwrap();
    assert_eq!(
        (record.head, record.messages),
        (6, 0),
        "from the first run's end the head crossed the deleted run, and skipped the marked 4"
    );
    assert_eq!(stored_marks(&reader), 0);
}
