//! What the state machine tests share: entries to append and apply
//! through a node's own log as openraft does, and a snapshot carried from
//! one database to another.

use std::collections::BTreeMap;

use openraft::storage::{RaftLogReader, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, Snapshot};

use crate::Database;
use crate::log_store::encode_entry;
use crate::reader::ShardReader;
use crate::state_machine::StateMachine;
use crate::types::{Command, Enqueue, LogId, MessageRef, NewMessage, Op, TypeConfig};

pub(super) const SHARD: u32 = 0;

pub(super) fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

/// A payload no other stored byte could contain by chance.
pub(super) fn payload(n: u8) -> Vec<u8> {
    let mut payload = b"payload-that-must-be-written-once-".to_vec();
    payload.extend(std::iter::repeat_n(n, 64));
    payload
}

/// An entry of one produce call of `messages` by `producer` to queue `q`.
pub(super) fn enqueue_messages(
    index: u64,
    producer: &str,
    messages: Vec<NewMessage>,
) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Command {
            ops: vec![Op::Enqueue(Enqueue {
                queue: "q".into(),
                producer: producer.into(),
                producer_sequence: None,
                enqueued_at_ms: 1_700_000_000_000,
                messages,
            })],
        }),
    }
}

/// An entry of one produce call by `producer` of `payloads`, without headers.
pub(super) fn enqueue_payloads(
    index: u64,
    producer: &str,
    payloads: &[Vec<u8>],
) -> Entry<TypeConfig> {
    let messages = payloads
        .iter()
        .map(|payload| NewMessage {
            payload: payload.clone(),
            headers: BTreeMap::new(),
        })
        .collect();
    enqueue_messages(index, producer, messages)
}

/// An entry acking `sequences` of `producer` in queue `q`.
pub(super) fn acks(index: u64, producer: &str, sequences: &[u64]) -> Entry<TypeConfig> {
    let acked = sequences.iter().map(|&s| message(producer, s)).collect();
    ops(index, vec![Op::Remove(acked)])
}

pub(super) fn message(producer: &str, sequence: u64) -> MessageRef {
    MessageRef {
        queue: "q".into(),
        producer: producer.into(),
        sequence,
    }
}

pub(super) fn ops(index: u64, ops: Vec<Op>) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Command { ops }),
    }
}

/// Appends `entry` to the node's log (synced if `sync`), reads it back
/// through the shard's log store as openraft does, and applies it.
pub(super) async fn append_and_apply(database: &Database, entry: Entry<TypeConfig>, sync: bool) {
    append_and_apply_together(database, vec![entry], sync).await;
}

/// Appends `entries` (consecutive) to the node's log, synced if `sync`,
/// and applies them in one call, as openraft does with the entries
/// committed since its last apply.
pub(super) async fn append_and_apply_together(
    database: &Database,
    entries: Vec<Entry<TypeConfig>>,
    sync: bool,
) {
    let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
        return;
    };
    let indexes = first.log_id.index..=last.log_id.index;
    let encoded = entries
        .into_iter()
        .map(|entry| (entry.log_id, encode_entry(entry)))
        .collect();
    database.wal().append(SHARD, encoded).unwrap();
    if sync {
        database.wal().sync().unwrap();
    }
    let entries = database
        .log_store(SHARD)
        .try_get_log_entries(indexes)
        .await
        .unwrap();
    let mut state_machine = database.state_machine(SHARD, None).unwrap();
    state_machine.apply(entries).await.unwrap();
}

/// Builds a snapshot of `state_machine` as it is now (and saves it to the
/// shard's snapshot file).
pub(super) async fn build_snapshot(state_machine: &mut StateMachine) -> Snapshot<TypeConfig> {
    state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap()
}

/// Builds a snapshot of the shard on `source` and installs it on `target`:
/// a reader of the installed state.
pub(super) async fn install_snapshot_of(source: &Database, target: &Database) -> ShardReader {
    let snapshot = build_snapshot(&mut source.state_machine(SHARD, None).unwrap()).await;
    let mut installer = target.state_machine(SHARD, None).unwrap();
    installer
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    installer.reader()
}
