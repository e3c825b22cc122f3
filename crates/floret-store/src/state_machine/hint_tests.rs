//! The runs the state machine holds for acks (`runs/hints.rs`) stay
//! equal to the tree: a repeated ack, a deleted run, a snapshot install.

use openraft::Entry;

use super::test_support::{
    SHARD, acks, append_and_apply, enqueue_payloads, install_snapshot_of, payload,
};
use crate::Database;
use crate::types::TypeConfig;

/// Producer `a` produces `payloads` in one call.
fn enqueue(index: u64, payloads: &[Vec<u8>]) -> Entry<TypeConfig> {
    enqueue_payloads(index, "a", payloads)
}

/// Acks `sequences` of producer `a`.
fn remove(index: u64, sequences: &[u64]) -> Entry<TypeConfig> {
    acks(index, "a", sequences)
}

#[tokio::test]
async fn an_ack_repeated_after_the_run_was_held_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    let payloads = [payload(1), payload(2), payload(3)];
    append_and_apply(&database, enqueue(1, &payloads), true).await;
    let reader = database.state_machine(SHARD, None).unwrap().reader();
    append_and_apply(&database, remove(2, &[0]), true).await;
    assert_eq!(reader.run_hints().len_and_held_bytes().0, 1);
    append_and_apply(&database, remove(3, &[0]), true).await;
    let record = reader.producer("q", "a").unwrap().unwrap();
    assert_eq!(record.messages, 2, "the repeated ack removed nothing");
    assert_eq!(reader.message("q", "a", 0).unwrap(), None);
    assert_eq!(
        reader.message("q", "a", 1).unwrap().unwrap().payload,
        payload(2)
    );
    append_and_apply(&database, remove(4, &[1, 2]), true).await;
    assert_eq!(
        reader.run_hints().len_and_held_bytes(),
        (0, 0),
        "the deleted run is no hint"
    );
    assert_eq!(reader.producer("q", "a").unwrap().unwrap().messages, 0);
    assert_eq!(reader.message("q", "a", 1).unwrap(), None);
}

#[tokio::test]
async fn a_snapshot_install_drops_the_runs_held_before_it() {
    let source_dir = tempfile::tempdir().unwrap();
    let target_dir = tempfile::tempdir().unwrap();
    let source = Database::open(source_dir.path()).unwrap();
    let target = Database::open(target_dir.path()).unwrap();
    let payloads = [payload(1), payload(2), payload(3)];
    append_and_apply(&source, enqueue(1, &payloads), true).await;
    append_and_apply(&target, enqueue(1, &payloads), true).await;
    append_and_apply(&target, remove(2, &[0]), true).await;
    let reader = install_snapshot_of(&source, &target).await;
    assert_eq!(reader.run_hints().len_and_held_bytes(), (0, 0));
    assert_eq!(
        reader.message("q", "a", 0).unwrap().unwrap().payload,
        payload(1),
        "the snapshot holds message 0 live"
    );
    append_and_apply(&target, remove(3, &[0]), true).await;
    let record = reader.producer("q", "a").unwrap().unwrap();
    assert_eq!(
        record.messages, 2,
        "the ack removed message 0, which the marks held before the install had removed"
    );
}
