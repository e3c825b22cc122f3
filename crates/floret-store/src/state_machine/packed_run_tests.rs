//! Runs stored packed (`runs/packed.rs`): a produce call's messages
//! without headers, applied from an entry durable in this node's log, read
//! back, acked, dead lettered and carried by snapshots as plain runs are;
//! and runs split alike whichever form a replica stores.

use openraft::Entry;

use super::test_support::{
    SHARD, append_and_apply, enqueue_messages, install_snapshot_of, message, ops, payload,
};
use crate::records::{StoredMessage, decode};
use crate::types::{DeadLetterReason, Discard, Discarded, NewMessage, Op, TypeConfig};
use crate::{Database, keys};

/// One produce call of `count` messages without headers, the usual shape.
fn enqueue_without_headers(index: u64, producer: &str, count: u8) -> Entry<TypeConfig> {
    let messages = (0..count)
        .map(|n| NewMessage {
            payload: payload(n),
            headers: Default::default(),
        })
        .collect();
    enqueue_messages(index, producer, messages)
}

/// Bytes of every stored message run of the shard.
fn run_bytes(database: &Database) -> usize {
    let state_machine = database.state_machine(SHARD, None).unwrap();
    state_machine
        .reader()
        .tree()
        .iter()
        .map(|item| item.unwrap())
        .filter(|(key, _)| key.first() == Some(&keys::MESSAGE_TAG))
        .map(|(_, value)| value.len())
        .sum()
}

fn digest(database: &Database) -> (u64, u64) {
    let reader = database.state_machine(SHARD, None).unwrap().reader();
    reader.digest().unwrap()
}

#[tokio::test]
async fn a_backlog_without_headers_costs_sled_a_few_bytes_per_message() {
    let logged_dir = tempfile::tempdir().unwrap();
    let inline_dir = tempfile::tempdir().unwrap();
    let logged = Database::open(logged_dir.path()).unwrap();
    let inline = Database::open(inline_dir.path()).unwrap();
    append_and_apply(&logged, enqueue_without_headers(1, "a", 100), true).await;
    append_and_apply(&inline, enqueue_without_headers(1, "a", 100), false).await;
    let stored = run_bytes(&logged);
    assert!(stored < 100 * 10, "{stored} bytes of runs for 100 messages");
    let reader = logged.state_machine(SHARD, None).unwrap().reader();
    for sequence in 0..100 {
        let read = reader.message("q", "a", sequence).unwrap().unwrap();
        assert_eq!(read.payload, payload(sequence as u8));
        assert!(read.headers.is_empty());
        assert_eq!(read.enqueued_at_ms, 1_700_000_000_000);
    }
    let record = |database: &Database| {
        let reader = database.state_machine(SHARD, None).unwrap().reader();
        reader.producer("q", "a").unwrap().unwrap()
    };
    assert_eq!(record(&logged), record(&inline));
    assert_eq!(
        digest(&logged),
        digest(&inline),
        "a packed replica and an inline one hold the same state"
    );
}

#[tokio::test]
async fn replicas_storing_different_forms_split_a_large_call_into_different_runs() {
    let logged_dir = tempfile::tempdir().unwrap();
    let inline_dir = tempfile::tempdir().unwrap();
    let logged = Database::open(logged_dir.path()).unwrap();
    let inline = Database::open(inline_dir.path()).unwrap();
    append_and_apply(&logged, enqueue_without_headers(1, "a", 250), true).await;
    append_and_apply(&inline, enqueue_without_headers(1, "a", 250), false).await;
    assert_eq!(
        digest(&logged),
        digest(&inline),
        "the same call stored as the same runs, pointers or payloads"
    );
}

#[tokio::test]
async fn packed_messages_are_acked_and_dead_lettered_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    append_and_apply(&database, enqueue_without_headers(1, "a", 5), true).await;
    append_and_apply(
        &database,
        ops(2, vec![Op::Remove(vec![message("a", 0), message("a", 2)])]),
        true,
    )
    .await;
    let discard = Op::Discard(Discard {
        at_ms: 1_700_000_000_001,
        messages: vec![Discarded {
            message: message("a", 3),
            reason: DeadLetterReason::Rejected,
            attempts: 1,
            dead_letter: true,
        }],
    });
    append_and_apply(&database, ops(3, vec![discard]), true).await;
    database.sync().await.unwrap();
    let reader = database.state_machine(SHARD, None).unwrap().reader();
    let live: Vec<u64> = (0..5)
        .filter(|&sequence| reader.message("q", "a", sequence).unwrap().is_some())
        .collect();
    assert_eq!(live, vec![1, 4]);
    let (oldest, read) = reader.oldest_message("q", "a", 0).unwrap().unwrap();
    assert_eq!((oldest, read.payload), (1, payload(1)));
    let (_, dead) = reader.dead_letters("q", 0, 10).unwrap().remove(0);
    let kept: StoredMessage = decode("message", &dead.message).unwrap();
    assert_eq!(kept.payload, payload(3));
}

#[tokio::test]
async fn snapshot_of_packed_runs_carries_their_payloads_to_a_replica() {
    let source_dir = tempfile::tempdir().unwrap();
    let target_dir = tempfile::tempdir().unwrap();
    let source = Database::open(source_dir.path()).unwrap();
    append_and_apply(&source, enqueue_without_headers(1, "a", 20), true).await;
    let target = Database::open(target_dir.path()).unwrap();
    let reader = install_snapshot_of(&source, &target).await;
    for sequence in 0..20 {
        let read = reader.message("q", "a", sequence).unwrap().unwrap();
        assert_eq!(read.payload, payload(sequence as u8));
    }
    assert_eq!(digest(&target), digest(&source));
}
