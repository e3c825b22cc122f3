//! openraft's state machine for one shard: per-producer queues in one sled
//! tree. Each `apply` call's changes (messages, producer records, last
//! applied log id and membership) are one set, merged into the shard's
//! unwritten changes and written to sled with them, crash-atomically (see
//! `shard_tree/`).
//!
//! Applying is deterministic: the leader chose the commit time, and the only
//! replies are computed from the replicated state. A sled error is not
//! deterministic and is returned as a `StorageError`, which stops the group
//! rather than letting replicas diverge.
//!
//! Files: `overlay/` gathers one apply's changes and reads through them
//! (`overlay/touched_runs.rs`: the runs it touches),
//! `ops.rs` says what each operation means (`dead_letters.rs` for dead
//! letters), `snapshots.rs` builds and loads snapshot images; this file is
//! the openraft glue (apply, snapshots) and the events.
//!
//! Payloads are written once: a message whose entry is durable in this
//! node's raft log is stored as a pointer to its payload there (see
//! `resting.rs`), and the shard tells the log which segments its runs
//! point into after every apply, so those segments stay.
//!
//! The state machine reports what it applied through [`AppliedEvent`]s so the
//! node's dispatcher learns of new messages without polling.
//!
//! IMPLEMENTATION CAVEATS
//! - `apply` does not flush, and writes to sled only every so many bytes
//!   of changes: after a crash openraft re-applies from the last applied
//!   id sled holds up to the committed one it saved in the log store. A
//!   shard whose own snapshot is ahead of what sled holds loads that
//!   snapshot first, when it opens.
//! - A producer whose idle counters were forgotten starts again at sequence
//!   0 and its last idempotency sequence is gone: retries are deduplicated
//!   only within the idle time.
//! - Replaying dead letters ignores the producer's limits (an operator's act).
//! - `drop_oldest` and `dead_letter_oldest` may take messages that are in
//!   flight; their acks then answer "already acked".

mod dead_letters;
#[cfg(test)]
mod head_tests;
#[cfg(test)]
mod hint_tests;
mod ops;
mod overlay;
#[cfg(test)]
mod packed_run_tests;
#[cfg(test)]
mod replica_tests;
mod snapshots;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

use std::io::Cursor;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, Snapshot, StoredMembership};

use crate::blocking::{may_block, off_the_runtime};
use crate::reader::ShardReader;
use crate::shard_tree::ShardTree;
use crate::snapshot::{self, SnapshotFile, SnapshotMeta};
use crate::storage_error;
use crate::types::{Command, CommandReply, LogId, Op, ShardId, StorageError, TypeConfig};
use crate::wal::Wal;
use overlay::PendingApply;
pub use snapshots::SnapshotBuilder;
use snapshots::{expected_image_bytes, replace_tree_with_image};

/// An apply that touches more messages than this runs in place of its
/// worker ([`may_block`]), which hands its other tasks over first; a
/// smaller one (most of them at one message per call) is not worth the
/// hand-over and runs as part of the state machine's task.
const LONG_APPLY_MESSAGES: usize = 256;

/// What a shard applied that the node's dispatcher must know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppliedEvent {
    /// `sequences` of one producer were committed.
    Enqueued {
        /// Shard that applied them.
        shard: ShardId,
        /// Queue of the producer.
        queue: String,
        /// The producer.
        producer: String,
        /// The new messages' sequences.
        sequences: Range<u64>,
    },
    /// A queue's default policy (`producer` None) or a producer's override changed.
    PolicyChanged {
        /// Shard that applied it.
        shard: ShardId,
        /// The queue.
        queue: String,
        /// The producer, for an override.
        producer: Option<String>,
    },
    /// A producer went over its limits and every message it had below
    /// `below` was dropped or dead-lettered.
    Dropped {
        /// Shard that applied it.
        shard: ShardId,
        /// Queue of the producer.
        queue: String,
        /// The producer.
        producer: String,
        /// No message of the producer below this sequence is stored now.
        below: u64,
    },
    /// An idle producer's counters were deleted: its sequences start again at 0.
    Forgotten {
        /// Shard that applied it.
        shard: ShardId,
        /// Queue of the producer.
        queue: String,
        /// The producer.
        producer: String,
    },
    /// The shard's whole state was replaced by a snapshot.
    Reset {
        /// Shard whose state changed.
        shard: ShardId,
    },
}

/// Told of every [`AppliedEvent`], in apply order, right after the batch is written.
/// It runs inside apply: keep it to a channel send.
pub type AppliedListener = Arc<dyn Fn(AppliedEvent) + Send + Sync>;

/// The state machine of one shard.
pub struct StateMachine {
    shard: ShardId,
    reader: ShardReader,
    snapshot_file: SnapshotFile,
    events: Option<AppliedListener>,
}

impl StateMachine {
    /// The state machine of `shard` over its `tree`, whose logged payloads
    /// lie in `log`; its snapshots go to `snapshot_dir`.
    pub(crate) fn open(
        tree: Arc<ShardTree>,
        log: Arc<Wal>,
        shard: ShardId,
        snapshot_dir: &Path,
        events: Option<AppliedListener>,
    ) -> Result<Self, sled::Error> {
        let invalid_data = |error: StorageError| {
            sled::Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                error.to_string(),
            ))
        };
        let reader = ShardReader::new(tree, log).map_err(invalid_data)?;
        let state_machine = Self::with_reader(reader, shard, snapshot_dir, events);
        state_machine
            .catch_up_with_own_snapshot()
            .map_err(invalid_data)?;
        Ok(state_machine)
    }

    /// Loads the shard's own snapshot into its tree when the snapshot is
    /// ahead of what the tree kept. A snapshot is synced as it is built, but
    /// applied changes reach sled's disk only at write-outs, and the log's
    /// committed mark only with the log's next sync: a crash can leave both
    /// behind the snapshot. openraft would then start with a snapshot past
    /// its committed index (which its debug builds refuse) and re-apply
    /// only up to that index, from a log that may have lost the entries
    /// between. A snapshot holds only committed entries, so the shard
    /// resumes from it.
    fn catch_up_with_own_snapshot(&self) -> Result<(), StorageError> {
        let unreadable = |error: std::io::Error| storage_error::read_snapshot(None, &error);
        let Some(snapshot) = self.snapshot_file.meta().map_err(unreadable)? else {
            return Ok(());
        };
        let applied = self.reader.applied_state()?.last_applied;
        if snapshot.last_log_id <= applied {
            return Ok(());
        }
        let Some((meta, data)) = self.snapshot_file.load().map_err(unreadable)? else {
            return Ok(());
        };
        tracing::warn!(
            shard = self.shard,
            snapshot = ?meta.last_log_id,
            applied = ?applied,
            "the state machine lost applies its own snapshot holds; loading the snapshot"
        );
        replace_tree_with_image(self.shard, &self.reader, &meta, &data)
    }

    /// The state machine of `shard` over an existing `reader` of its tree
    /// (the one an earlier state machine of the shard opened).
    pub(crate) fn with_reader(
        reader: ShardReader,
        shard: ShardId,
        snapshot_dir: &Path,
        events: Option<AppliedListener>,
    ) -> Self {
        Self {
            shard,
            reader,
            snapshot_file: SnapshotFile::new(snapshot_dir, shard),
            events,
        }
    }

    /// Read access to this shard's queues, for the dispatcher and stats.
    pub fn reader(&self) -> ShardReader {
        self.reader.clone()
    }

    fn emit(&self, event: AppliedEvent) {
        if let Some(listener) = &self.events {
            listener(event);
        }
    }
}

/// Applies `entries` to `shard`'s tree through `reader`: their replies,
/// and the events to tell once they are in.
///
/// A long one runs in place of a runtime worker ([`may_block`]): an apply
/// reads the messages it removes from sled and may write every unwritten
/// change out, 25-250 ms under a drain of a large backlog, and a worker
/// blocked that long held up the raft cores queued on it. Their heartbeats and
/// appends then outlived openraft's timeout (the heartbeat interval) and
/// followers called elections.
fn apply_entries(
    shard: ShardId,
    reader: &ShardReader,
    entries: impl IntoIterator<Item = openraft::Entry<TypeConfig>>,
) -> Result<(Vec<CommandReply>, Vec<AppliedEvent>), StorageError> {
    let mut applied = reader.applied_state()?;
    let mut pending = PendingApply::new(shard, reader);
    let mut replies = Vec::new();
    for (position, entry) in entries.into_iter().enumerate() {
        if position > 0 {
            crate::failpoints::crash_if_fires("apply-mid-batch");
        }
        applied.last_applied = Some(entry.log_id);
        pending.payloads_from(reader.log().payload_section(shard, entry.log_id));
        let reply = match entry.payload {
            EntryPayload::Blank => CommandReply::default(),
            EntryPayload::Membership(membership) => {
                applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                CommandReply::default()
            }
            EntryPayload::Normal(Command { ops }) => {
                let mut replies = Vec::with_capacity(ops.len());
                for op in &ops {
                    replies.push(match op {
                        Op::Enqueue(enqueue) => pending.enqueue(enqueue)?,
                        Op::EnqueueDelayed(delayed) => pending.enqueue_delayed(delayed)?,
                        Op::ForgetIdle(idle) => pending.forget_idle(idle)?,
                        Op::Remove(messages) => pending.remove(messages)?,
                        Op::SetPolicy(change) => pending.set_policy(change),
                        Op::SetSink(change) => pending.set_sink(change)?,
                        Op::Discard(discard) => pending.discard(discard)?,
                        Op::ReplayDeadLetters(selection) => {
                            pending.replay_dead_letters(selection)?
                        }
                        Op::DeleteDeadLetters(selection) => {
                            pending.delete_dead_letters(selection)?
                        }
                    });
                }
                CommandReply { replies }
            }
        };
        replies.push(reply);
    }
    let events = pending.commit(&applied)?;
    Ok((replies, events))
}

/// How many messages `entries` store, remove or look up: what makes an
/// apply long.
fn messages_touched(entries: &[openraft::Entry<TypeConfig>]) -> usize {
    let ops = entries.iter().flat_map(|entry| match &entry.payload {
        EntryPayload::Normal(Command { ops }) => ops.as_slice(),
        EntryPayload::Blank | EntryPayload::Membership(_) => &[],
    });
    ops.map(|op| match op {
        Op::Enqueue(enqueue) => enqueue.messages.len(),
        Op::EnqueueDelayed(delayed) => delayed.enqueue.messages.len(),
        Op::Remove(messages) => messages.len(),
        Op::Discard(discard) => discard.messages.len(),
        Op::ForgetIdle(idle) => idle.len(),
        Op::ReplayDeadLetters(selection) | Op::DeleteDeadLetters(selection) => selection.ids.len(),
        Op::SetPolicy(_) | Op::SetSink(_) => 1,
    })
    .sum()
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<u64, openraft::BasicNode>), StorageError> {
        let applied = self.reader.applied_state()?;
        Ok((applied.last_applied, applied.membership))
    }

    /// Applies `entries`, a long apply in place of its worker (see
    /// [`apply_entries`]), and then tells the listener what they did.
    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandReply>, StorageError>
    where
        I: IntoIterator<Item = openraft::Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let started = std::time::Instant::now();
        let entries: Vec<_> = entries.into_iter().collect();
        let long = messages_touched(&entries) > LONG_APPLY_MESSAGES;
        let apply = || apply_entries(self.shard, &self.reader, entries);
        let (replies, events) = if long { may_block(apply) } else { apply() }?;
        for event in events {
            self.emit(event);
        }
        metrics::histogram!("floret_apply_seconds").record(started.elapsed().as_secs_f64());
        Ok(replies)
    }

    /// Captures the image now: openraft applies nothing to this state
    /// machine until this returns, so it matches the applied log id.
    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        let reader = self.reader.clone();
        let captured = off_the_runtime(move || {
            let image =
                snapshot::capture(reader.tree(), reader.log(), expected_image_bytes(&reader))
                    .map_err(storage_error::read_state_machine);
            (image, reader.applied_state())
        })
        .await;
        let (image, applied) = match captured {
            Ok(captured) => captured,
            Err(stopped) => {
                let error = storage_error::read_state_machine(stopped);
                (Err(error.clone()), Err(error))
            }
        };
        SnapshotBuilder {
            image,
            applied,
            file: self.snapshot_file.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let signature = Some(meta.signature());
        let (shard, reader, file, meta) = (
            self.shard,
            self.reader.clone(),
            self.snapshot_file.clone(),
            meta.clone(),
        );
        off_the_runtime(move || {
            replace_tree_with_image(shard, &reader, &meta, &data)?;
            file.save(&meta, &data)
                .map_err(|e| storage_error::write_snapshot(signature, &e))
        })
        .await
        .map_err(storage_error::write_state_machine)??;
        self.emit(AppliedEvent::Reset { shard: self.shard });
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let file = self.snapshot_file.clone();
        let loaded = off_the_runtime(move || file.load())
            .await
            .and_then(|loaded| loaded)
            .map_err(|e| storage_error::read_snapshot(None, &e))?;
        Ok(loaded.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}
