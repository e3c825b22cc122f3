//! openraft's state machine for one shard: per-producer queues in one sled
//! tree, so each `apply` call is one crash-atomic [`ChangeSet`] (messages,
//! producer records, last applied log id and membership together).
//!
//! Applying is deterministic: the leader chose the commit time, and the only
//! replies are computed from the replicated state. A sled error is not
//! deterministic and is returned as a `StorageError`, which stops the group
//! rather than letting replicas diverge.
//!
//! The state machine reports what it applied through [`AppliedEvent`]s so the
//! node's dispatcher learns of new messages without polling.
//!
//! IMPLEMENTATION CAVEATS
//! - `apply` does not flush: after a crash openraft re-applies from the last
//!   applied id up to the committed one it saved in the log store.
//! - A producer whose idle counters were forgotten starts again at sequence
//!   0 and its last idempotency sequence is gone: retries are deduplicated
//!   only within the idle time.
//! - Replaying dead letters ignores the producer's limits (an operator's act).
//! - `drop_oldest` and `dead_letter_oldest` may take messages that are in
//!   flight; their acks then answer "already acked".

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Cursor;
use std::ops::Bound;
use std::ops::Range;
use std::path::Path;

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder, Snapshot, StoredMembership};
use std::sync::Arc;

use crate::change_set::{ChangeSet, ChangeSetError};
use crate::keys;
use crate::policy::{Overflow, Policy};
use crate::reader::ShardReader;
use crate::records::{
    AppliedState, DeadLetterRecord, ProducedBatch, ProducerRecord, StoredMessage, StoredMessageRef,
    decode, encode,
};
use crate::runs::{self, Removed, Run};
use crate::snapshot::{SnapshotFile, SnapshotMeta, TreeImage};
use crate::storage_error;
use crate::types::{
    Command, CommandReply, DeadLetterReason, DeadLetterSelection, DelayedEnqueue, Discard, Enqueue,
    IdleProducer, LogId, MessageRef, Op, OpReply, SetPolicy, ShardId, StorageError, TypeConfig,
};

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
    /// Opens the state-machine tree of `shard`; its snapshots go to `snapshot_dir`.
    pub fn open(
        db: &sled::Db,
        shard: ShardId,
        snapshot_dir: &Path,
        events: Option<AppliedListener>,
    ) -> Result<Self, sled::Error> {
        let tree = db.open_tree(format!("shard-{shard}.sm"))?;
        let completed = ChangeSet::recover(&tree).map_err(|error| match error {
            ChangeSetError::Sled(error) => error,
            redo => sled::Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                redo.to_string(),
            )),
        })?;
        if completed {
            tracing::info!(shard, "completed an apply a crash interrupted");
        }
        let reader = ShardReader::new(tree).map_err(|error| {
            sled::Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                error.to_string(),
            ))
        })?;
        Ok(Self {
            shard,
            reader,
            snapshot_file: SnapshotFile::new(snapshot_dir, shard),
            events,
        })
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

/// A run's bytes: as read from the tree, or written by this apply.
enum RunBytes {
    Stored(sled::IVec),
    New(Vec<u8>),
}

impl AsRef<[u8]> for RunBytes {
    fn as_ref(&self) -> &[u8] {
        match self {
            RunBytes::Stored(bytes) => bytes,
            RunBytes::New(bytes) => bytes,
        }
    }
}

/// A run as one apply leaves it so far.
struct TouchedRun {
    run: Run<RunBytes>,
    removed: Removed,
    /// Whether its removal marks changed in this apply.
    marks_changed: bool,
}

/// Changes of one `apply` call, gathered before they are written as one
/// change set. Reads go through [`PendingApply::get`], which sees this
/// apply's own writes first.
struct PendingApply<'a> {
    shard: ShardId,
    reader: &'a ShardReader,
    changes: ChangeSet,
    producers: HashMap<Vec<u8>, ProducerRecord>,
    /// (bytes, messages) of each producer in `producers` before this apply.
    stored_before: HashMap<Vec<u8>, (u64, u64)>,
    /// Next dead-letter id per queue, for queues that got dead letters in this apply.
    next_dead_letter: HashMap<String, u64>,
    /// Delivery times written by this apply, by message key.
    delays_added: HashMap<Vec<u8>, i64>,
    /// Message keys whose delivery time this apply removed.
    delays_removed: Vec<Vec<u8>>,
    /// Every run this apply wrote or removed messages from, by key.
    runs: BTreeMap<Vec<u8>, TouchedRun>,
    /// Message prefixes of producers this apply forgot. Their stored runs
    /// are all being deleted, so lookups must not bring them back.
    forgotten: HashSet<Vec<u8>>,
    /// Policies this apply stored, in order; the shared table gets them
    /// once they are written.
    policies_set: Vec<(String, Option<String>, Policy)>,
    events: Vec<AppliedEvent>,
}

impl<'a> PendingApply<'a> {
    fn new(shard: ShardId, reader: &'a ShardReader) -> Self {
        Self {
            shard,
            reader,
            changes: ChangeSet::default(),
            producers: HashMap::new(),
            stored_before: HashMap::new(),
            next_dead_letter: HashMap::new(),
            delays_added: HashMap::new(),
            delays_removed: Vec::new(),
            runs: BTreeMap::new(),
            forgotten: HashSet::new(),
            policies_set: Vec::new(),
            events: Vec::new(),
        }
    }

    fn tree(&self) -> &sled::Tree {
        self.reader.tree()
    }

    /// The policy stored for `queue` or one producer as this apply leaves it so far.
    fn stored_policy(&self, queue: &str, producer: Option<&str>) -> Policy {
        self.policies_set
            .iter()
            .rev()
            .find(|(q, p, _)| q == queue && p.as_deref() == producer)
            .map(|(_, _, policy)| *policy)
            .unwrap_or_else(|| self.reader.stored_policy(queue, producer))
    }

    /// The policy in force for `producer` as this apply leaves it so far.
    fn policy(&self, queue: &str, producer: &str) -> Policy {
        if self.policies_set.is_empty() {
            return self.reader.policy(queue, producer);
        }
        self.stored_policy(queue, Some(producer))
            .over(self.stored_policy(queue, None))
    }

    /// The value of `key` as this apply leaves it so far.
    fn get(&self, key: &[u8]) -> Result<Option<sled::IVec>, StorageError> {
        match self.changes.pending(key) {
            Some(value) => Ok(value.map(sled::IVec::from)),
            None => self
                .tree()
                .get(key)
                .map_err(storage_error::read_state_machine),
        }
    }

    fn producer(
        &mut self,
        queue: &str,
        producer: &str,
    ) -> Result<&mut ProducerRecord, StorageError> {
        let key = keys::producer(queue, producer);
        if !self.producers.contains_key(&key) {
            let record = ShardReader::decode_producer(self.get(&key)?)?;
            self.stored_before
                .insert(key.clone(), (record.bytes, record.messages));
            self.producers.insert(key.clone(), record);
        }
        Ok(self.producers.get_mut(&key).expect("inserted above"))
    }

    /// Adds a run of `messages` (stored encodings) starting at `first`.
    fn add_run(&mut self, queue: &str, producer: &str, first: u64, messages: &[Vec<u8>]) {
        let run = Run::parse(RunBytes::New(runs::encode(messages)))
            .expect("a run just encoded is well formed");
        let removed = Removed::none(run.len());
        self.runs.insert(
            keys::message(queue, producer, first),
            TouchedRun {
                run,
                removed,
                marks_changed: false,
            },
        );
    }

    /// Brings a stored run into `runs`, unless this apply touched it
    /// already; returns its key.
    fn touch(&mut self, key: sled::IVec, run: Run<sled::IVec>) -> Result<Vec<u8>, StorageError> {
        let key = key.to_vec();
        if !self.runs.contains_key(&key) {
            let marks = self
                .tree()
                .get(keys::removed(&key))
                .map_err(storage_error::read_state_machine)?;
            let removed = Removed::stored(marks.as_deref(), run.len())
                .map_err(storage_error::read_state_machine)?;
            let run = Run::parse(RunBytes::Stored(run.into_bytes()))
                .map_err(storage_error::read_state_machine)?;
            self.runs.insert(
                key.clone(),
                TouchedRun {
                    run,
                    removed,
                    marks_changed: false,
                },
            );
        }
        Ok(key)
    }

    /// The run that holds `sequence` of the producer as this apply leaves
    /// it so far, with the message's index in it; None if no run does.
    fn run_holding(
        &mut self,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Result<Option<(Vec<u8>, usize)>, StorageError> {
        let prefix = keys::message_prefix(queue, producer);
        let key = keys::message(queue, producer, sequence);
        let holds = |run_key: &[u8], run: &TouchedRun| {
            let first = keys::message_sequence(run_key).expect("run keys end with a sequence");
            let index = (sequence - first) as usize;
            (index < run.run.len()).then_some(index)
        };
        let touched = self
            .runs
            .range::<[u8], _>((
                Bound::Included(prefix.as_slice()),
                Bound::Included(key.as_slice()),
            ))
            .next_back();
        if let Some((run_key, run)) = touched
            && let Some(index) = holds(run_key, run)
        {
            return Ok(Some((run_key.clone(), index)));
        }
        let touched = touched.map(|(run_key, _)| run_key.clone());
        let stored = if self.forgotten.contains(&prefix) {
            None
        } else {
            runs::last_in(self.tree(), prefix.as_slice()..=key.as_slice())
                .map_err(storage_error::read_state_machine)?
        };
        let run_key = match (touched, stored) {
            (Some(touched), Some((stored, run))) if stored.as_ref() > touched.as_slice() => {
                self.touch(stored, run)?
            }
            (Some(touched), _) => touched,
            (None, Some((stored, run))) => self.touch(stored, run)?,
            (None, None) => return Ok(None),
        };
        Ok(holds(&run_key, &self.runs[&run_key]).map(|index| (run_key, index)))
    }

    /// The run that holds `sequence` of the producer, or else its first run
    /// after it, with the index to start from; None if there is neither.
    fn run_from(
        &mut self,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Result<Option<(Vec<u8>, usize)>, StorageError> {
        if let Some(holding) = self.run_holding(queue, producer, sequence)? {
            return Ok(Some(holding));
        }
        let prefix = keys::message_prefix(queue, producer);
        let key = keys::message(queue, producer, sequence);
        let touched = self
            .runs
            .range::<[u8], _>((Bound::Included(key.as_slice()), Bound::Unbounded))
            .next()
            .map(|(run_key, _)| run_key)
            .filter(|run_key| run_key.starts_with(&prefix))
            .cloned();
        let stored = if self.forgotten.contains(&prefix) {
            None
        } else {
            runs::first_from(self.tree(), &key, &prefix)
                .map_err(storage_error::read_state_machine)?
        };
        let run_key = match (touched, stored) {
            (Some(touched), Some((stored, run))) if stored.as_ref() < touched.as_slice() => {
                self.touch(stored, run)?
            }
            (Some(touched), _) => touched,
            (None, Some((stored, run))) => self.touch(stored, run)?,
            (None, None) => return Ok(None),
        };
        Ok(Some((run_key, 0)))
    }

    /// Marks message `index` of a touched run removed; its stored encoding,
    /// or None if it was removed already.
    fn remove_from_run(
        &mut self,
        run_key: &[u8],
        index: usize,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        let touched = self.runs.get_mut(run_key).expect("the run was touched");
        if touched.removed.contains(index) {
            return Ok(None);
        }
        let message = touched
            .run
            .message_within(index)
            .map_err(storage_error::read_state_machine)?;
        let message = message.to_vec();
        touched.removed.insert(index);
        touched.marks_changed = true;
        Ok(Some(message))
    }

    /// Whether `sequence` of the producer is stored as this apply leaves it so far.
    fn is_stored(
        &mut self,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Result<bool, StorageError> {
        Ok(self
            .run_holding(queue, producer, sequence)?
            .is_some_and(|(run_key, index)| !self.runs[&run_key].removed.contains(index)))
    }

    fn enqueue(&mut self, enqueue: &Enqueue) -> Result<OpReply, StorageError> {
        let policy = self.policy(&enqueue.queue, &enqueue.producer);
        let record = self.producer(&enqueue.queue, &enqueue.producer)?;
        if let (Some(sequence), Some(last)) = (enqueue.producer_sequence, record.last_batch) {
            if sequence == last.producer_sequence {
                return Ok(OpReply::Enqueued {
                    first_sequence: last.first_sequence,
                    count: last.count,
                    duplicate: true,
                });
            }
            if sequence < last.producer_sequence {
                return Ok(OpReply::StaleProducerSequence {
                    last: last.producer_sequence,
                });
            }
        }
        let first_sequence = record.tail;
        let count = enqueue.messages.len() as u64;
        if crate::failpoints::fires("apply-drop-enqueue") {
            return Ok(OpReply::Enqueued {
                first_sequence,
                count,
                duplicate: false,
            });
        }
        let mut values = Vec::with_capacity(enqueue.messages.len());
        let mut added_bytes = 0;
        for message in &enqueue.messages {
            let value = encode(&StoredMessageRef {
                payload: &message.payload,
                headers: &message.headers,
                enqueued_at_ms: enqueue.enqueued_at_ms,
            });
            added_bytes += value.len() as u64;
            values.push(value);
        }
        let overflow = policy.overflow.unwrap_or_default();
        if overflow == Overflow::Reject
            && policy.exceeded_by(record.messages + count, record.bytes + added_bytes)
        {
            return Ok(OpReply::OverLimit {
                messages: record.messages,
                bytes: record.bytes,
                batch_bytes: added_bytes,
                policy,
            });
        }
        record.bytes += added_bytes;
        record.tail += count;
        record.messages += count;
        if let Some(producer_sequence) = enqueue.producer_sequence {
            record.last_batch = Some(ProducedBatch {
                producer_sequence,
                first_sequence,
                count,
            });
        }
        let over_limit = policy.exceeded_by(record.messages, record.bytes);
        for run in runs::split(&values) {
            let first = first_sequence + run.start as u64;
            self.add_run(&enqueue.queue, &enqueue.producer, first, &values[run]);
        }
        self.events.push(AppliedEvent::Enqueued {
            shard: self.shard,
            queue: enqueue.queue.clone(),
            producer: enqueue.producer.clone(),
            sequences: first_sequence..first_sequence + count,
        });
        if over_limit {
            self.trim_oldest(enqueue, policy, overflow == Overflow::DeadLetterOldest)?;
        }
        Ok(OpReply::Enqueued {
            first_sequence,
            count,
            duplicate: false,
        })
    }

    /// Appends messages that wait until `deliver_at_ms`: each gets a delay
    /// key next to it.
    fn enqueue_delayed(&mut self, delayed: &DelayedEnqueue) -> Result<OpReply, StorageError> {
        let reply = self.enqueue(&delayed.enqueue)?;
        if let OpReply::Enqueued {
            first_sequence,
            count,
            duplicate: false,
        } = reply
        {
            let (queue, producer) = (&delayed.enqueue.queue, &delayed.enqueue.producer);
            for sequence in first_sequence..first_sequence + count {
                if self.is_stored(queue, producer, sequence)? {
                    let key = keys::message(queue, producer, sequence);
                    self.changes
                        .insert(keys::delay(&key), encode(&delayed.deliver_at_ms));
                    self.delays_added.insert(key, delayed.deliver_at_ms);
                }
            }
        }
        Ok(reply)
    }

    /// Removes the delivery time of a message being deleted, if it has one.
    fn forget_delay(&mut self, message_key: &[u8]) {
        if self.delays_added.remove(message_key).is_some() || self.reader.is_delayed(message_key) {
            self.changes.remove(keys::delay(message_key));
            self.delays_removed.push(message_key.to_vec());
        }
    }

    /// Takes the producer's oldest messages out until it is within its
    /// limits again, keeping them as dead letters if `dead_letter`.
    fn trim_oldest(
        &mut self,
        enqueue: &Enqueue,
        policy: Policy,
        dead_letter: bool,
    ) -> Result<(), StorageError> {
        let (queue, producer) = (enqueue.queue.as_str(), enqueue.producer.as_str());
        let record = self.producer(queue, producer)?.clone();
        let (mut messages, mut bytes) = (record.messages, record.bytes);
        let mut sequence = record.head;
        let mut last = None;
        while policy.exceeded_by(messages, bytes) {
            let Some((run_key, start)) = self.run_from(queue, producer, sequence)? else {
                break;
            };
            let first = keys::message_sequence(&run_key).expect("run keys end with a sequence");
            let len = self.runs[&run_key].run.len();
            for index in start..len {
                if !policy.exceeded_by(messages, bytes) {
                    break;
                }
                let Some(value) = self.remove_from_run(&run_key, index)? else {
                    continue;
                };
                let sequence = first + index as u64;
                messages -= 1;
                bytes -= value.len() as u64;
                last = Some(sequence);
                self.forget_delay(&keys::message(queue, producer, sequence));
                if dead_letter {
                    self.keep_dead_letter(
                        queue,
                        DeadLetterRecord {
                            producer: producer.to_owned(),
                            sequence,
                            reason: DeadLetterReason::Overflow,
                            attempts: 0,
                            dead_lettered_at_ms: enqueue.enqueued_at_ms,
                            message: value,
                        },
                    )?;
                }
            }
            sequence = first + len as u64;
        }
        let Some(last) = last else {
            return Ok(());
        };
        let record = self.producer(queue, producer)?;
        record.messages = messages;
        record.bytes = bytes;
        record.head = record.head.max(last + 1);
        self.events.push(AppliedEvent::Dropped {
            shard: self.shard,
            queue: queue.to_owned(),
            producer: producer.to_owned(),
            below: last + 1,
        });
        Ok(())
    }

    /// Deletes a stored message, adjusting its producer's counters; returns
    /// its value, or None if it was not stored.
    fn take(&mut self, message: &MessageRef) -> Result<Option<Vec<u8>>, StorageError> {
        let (queue, producer) = (message.queue.as_str(), message.producer.as_str());
        let Some((run_key, index)) = self.run_holding(queue, producer, message.sequence)? else {
            return Ok(None);
        };
        let Some(value) = self.remove_from_run(&run_key, index)? else {
            return Ok(None);
        };
        let record = self.producer(queue, producer)?;
        record.messages -= 1;
        record.bytes -= value.len() as u64;
        if record.head == message.sequence {
            record.head += 1;
        }
        self.forget_delay(&keys::message(queue, producer, message.sequence));
        Ok(Some(value))
    }

    fn remove(&mut self, messages: &[MessageRef]) -> Result<OpReply, StorageError> {
        let mut count = 0;
        for message in messages {
            if self.take(message)?.is_some() {
                self.producer(&message.queue, &message.producer)?.acked += 1;
                count += 1;
            }
        }
        Ok(OpReply::Removed { count })
    }

    fn discard(&mut self, discard: &Discard) -> Result<OpReply, StorageError> {
        let mut count = 0;
        for discarded in &discard.messages {
            let Some(value) = self.take(&discarded.message)? else {
                continue;
            };
            count += 1;
            if discarded.dead_letter {
                self.keep_dead_letter(
                    &discarded.message.queue,
                    DeadLetterRecord {
                        producer: discarded.message.producer.clone(),
                        sequence: discarded.message.sequence,
                        reason: discarded.reason,
                        attempts: discarded.attempts,
                        dead_lettered_at_ms: discard.at_ms,
                        message: value,
                    },
                )?;
            }
        }
        Ok(OpReply::Removed { count })
    }

    fn keep_dead_letter(
        &mut self,
        queue: &str,
        record: DeadLetterRecord,
    ) -> Result<(), StorageError> {
        let id = match self.next_dead_letter.get(queue) {
            Some(&id) => id,
            None => match self
                .tree()
                .get(keys::next_dead_letter(queue))
                .map_err(storage_error::read_state_machine)?
            {
                Some(bytes) => decode("next dead-letter id", &bytes)
                    .map_err(storage_error::read_state_machine)?,
                None => 0,
            },
        };
        self.next_dead_letter.insert(queue.to_owned(), id + 1);
        self.changes
            .insert(keys::dead_letter(queue, id), encode(&record));
        Ok(())
    }

    fn set_policy(&mut self, change: &SetPolicy) -> OpReply {
        let producer = change.producer.as_deref();
        let stored = if change.replace {
            change.policy
        } else {
            change
                .policy
                .over(self.stored_policy(&change.queue, producer))
        };
        let key = match producer {
            Some(producer) => keys::producer_policy(&change.queue, producer),
            None => keys::queue_policy(&change.queue),
        };
        if stored.is_empty() {
            self.changes.remove(key);
        } else {
            self.changes.insert(key, encode(&stored));
        }
        self.policies_set
            .push((change.queue.clone(), change.producer.clone(), stored));
        self.events.push(AppliedEvent::PolicyChanged {
            shard: self.shard,
            queue: change.queue.clone(),
            producer: change.producer.clone(),
        });
        OpReply::PolicySet { policy: stored }
    }

    /// The dead letters `selection` names that exist, each once, in id
    /// order, with its key and decoded record.
    fn selected_dead_letters(
        &self,
        selection: &DeadLetterSelection,
    ) -> Result<Vec<(Vec<u8>, DeadLetterRecord)>, StorageError> {
        let ids: BTreeSet<u64> = selection.ids.iter().copied().collect();
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            let key = keys::dead_letter(&selection.queue, id);
            if let Some(value) = self.get(&key)? {
                let record =
                    decode("dead letter", &value).map_err(storage_error::read_state_machine)?;
                found.push((key, record));
            }
        }
        Ok(found)
    }

    fn replay_dead_letters(
        &mut self,
        selection: &DeadLetterSelection,
    ) -> Result<OpReply, StorageError> {
        let dead_letters = self.selected_dead_letters(selection)?;
        let count = dead_letters.len() as u64;
        for (key, dead) in dead_letters {
            let mut message: StoredMessage =
                decode("message", &dead.message).map_err(storage_error::read_state_machine)?;
            message.enqueued_at_ms = selection.at_ms;
            let value = encode(&message);
            let record = self.producer(&selection.queue, &dead.producer)?;
            let sequence = record.tail;
            record.tail += 1;
            record.messages += 1;
            record.bytes += value.len() as u64;
            self.changes.remove(key);
            self.add_run(&selection.queue, &dead.producer, sequence, &[value]);
            self.events.push(AppliedEvent::Enqueued {
                shard: self.shard,
                queue: selection.queue.clone(),
                producer: dead.producer,
                sequences: sequence..sequence + 1,
            });
        }
        Ok(OpReply::Replayed { count })
    }

    fn delete_dead_letters(
        &mut self,
        selection: &DeadLetterSelection,
    ) -> Result<OpReply, StorageError> {
        let dead_letters = self.selected_dead_letters(selection)?;
        let count = dead_letters.len() as u64;
        for (key, _) in dead_letters {
            self.changes.remove(key);
        }
        Ok(OpReply::Removed { count })
    }

    /// Deletes the counters of producers still idle as the leader saw them:
    /// nothing stored, no override, the same tail.
    fn forget_idle(&mut self, idle: &[IdleProducer]) -> Result<OpReply, StorageError> {
        let mut count = 0;
        for candidate in idle {
            let overridden = !self
                .stored_policy(&candidate.queue, Some(&candidate.producer))
                .is_empty();
            let record = self.producer(&candidate.queue, &candidate.producer)?;
            if overridden || record.messages != 0 || record.tail != candidate.tail {
                continue;
            }
            let key = keys::producer(&candidate.queue, &candidate.producer);
            self.producers.remove(&key);
            self.changes.remove(key);
            self.forget_runs(keys::message_prefix(&candidate.queue, &candidate.producer));
            self.events.push(AppliedEvent::Forgotten {
                shard: self.shard,
                queue: candidate.queue.clone(),
                producer: candidate.producer.clone(),
            });
            count += 1;
        }
        Ok(OpReply::Removed { count })
    }

    /// Drops every run of a forgotten producer from this apply. Its
    /// messages are all removed, so its stored runs and marks are deleted
    /// now; a run the producer starts again at the same sequence in this
    /// apply is a new one and overwrites that deletion at commit.
    fn forget_runs(&mut self, prefix: Vec<u8>) {
        let run_keys: Vec<Vec<u8>> = self
            .runs
            .range::<[u8], _>((Bound::Included(prefix.as_slice()), Bound::Unbounded))
            .map(|(run_key, _)| run_key)
            .take_while(|run_key| run_key.starts_with(&prefix))
            .cloned()
            .collect();
        for run_key in run_keys {
            let touched = self.runs.remove(&run_key).expect("listed above");
            if let RunBytes::Stored(_) = touched.run.into_bytes() {
                self.changes.remove(keys::removed(&run_key));
                self.changes.remove(run_key);
            }
        }
        self.forgotten.insert(prefix);
    }

    fn commit(mut self, applied: &AppliedState) -> Result<Vec<AppliedEvent>, StorageError> {
        for (key, touched) in std::mem::take(&mut self.runs) {
            let marks_key = keys::removed(&key);
            let new_run = match touched.run.into_bytes() {
                RunBytes::New(bytes) => Some(bytes),
                RunBytes::Stored(_) => None,
            };
            if touched.removed.all() {
                if new_run.is_none() {
                    self.changes.remove(key);
                    self.changes.remove(marks_key);
                }
                continue;
            }
            if touched.marks_changed {
                self.changes
                    .insert(marks_key, touched.removed.as_bytes().to_vec());
            }
            if let Some(bytes) = new_run {
                self.changes.insert(key, bytes);
            }
        }
        let mut changed_totals = Vec::with_capacity(self.producers.len());
        for (key, record) in self.producers {
            let before = self.stored_before.get(&key).copied().unwrap_or_default();
            changed_totals.push((before, (record.bytes, record.messages)));
            self.changes.insert(key, encode(&record));
        }
        for (queue, id) in self.next_dead_letter {
            self.changes
                .insert(keys::next_dead_letter(&queue), encode(&id));
        }
        self.changes.insert(keys::APPLIED.to_vec(), encode(applied));
        self.changes
            .write(self.reader.tree())
            .map_err(storage_error::write_state_machine)?;
        for (before, after) in changed_totals {
            self.reader.totals().changed(before, after);
        }
        self.reader
            .delays_changed(self.delays_added, self.delays_removed);
        for (queue, producer, policy) in self.policies_set {
            self.reader.set_policy(&queue, producer.as_deref(), policy);
        }
        Ok(self.events)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<u64, openraft::BasicNode>), StorageError> {
        let applied = self.reader.applied_state()?;
        Ok((applied.last_applied, applied.membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandReply>, StorageError>
    where
        I: IntoIterator<Item = openraft::Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut applied = self.reader.applied_state()?;
        let mut pending = PendingApply::new(self.shard, &self.reader);
        let mut replies = Vec::new();
        for (position, entry) in entries.into_iter().enumerate() {
            if position > 0 {
                crate::failpoints::crash_if_fires("apply-mid-batch");
            }
            applied.last_applied = Some(entry.log_id);
            let reply = match &entry.payload {
                EntryPayload::Blank => CommandReply::default(),
                EntryPayload::Membership(membership) => {
                    applied.membership =
                        StoredMembership::new(Some(entry.log_id), membership.clone());
                    CommandReply::default()
                }
                EntryPayload::Normal(Command { ops }) => {
                    let mut replies = Vec::with_capacity(ops.len());
                    for op in ops {
                        replies.push(match op {
                            Op::Enqueue(enqueue) => pending.enqueue(enqueue)?,
                            Op::EnqueueDelayed(delayed) => pending.enqueue_delayed(delayed)?,
                            Op::ForgetIdle(idle) => pending.forget_idle(idle)?,
                            Op::Remove(messages) => pending.remove(messages)?,
                            Op::SetPolicy(change) => pending.set_policy(change),
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
        for event in events {
            self.emit(event);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            image: TreeImage::capture(self.reader.tree())
                .map_err(storage_error::read_state_machine),
            applied: self.reader.applied_state(),
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
        let image = TreeImage::from_bytes(&data)
            .map_err(|e| storage_error::read_snapshot(signature.clone(), &e))?;
        let tree = self.reader.tree();
        let mut batch = sled::Batch::default();
        for key in tree.iter().keys() {
            batch.remove(key.map_err(storage_error::read_state_machine)?);
        }
        for (key, value) in image.pairs {
            batch.insert(key, value);
        }
        batch.insert(
            keys::APPLIED,
            encode(&AppliedState {
                last_applied: meta.last_log_id,
                membership: meta.last_membership.clone(),
            }),
        );
        tree.apply_batch(batch)
            .map_err(storage_error::write_state_machine)?;
        self.reader.reload()?;
        self.snapshot_file
            .save(meta, &data)
            .map_err(|e| storage_error::write_snapshot(signature, &e))?;
        self.emit(AppliedEvent::Reset { shard: self.shard });
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let loaded = self
            .snapshot_file
            .load()
            .map_err(|e| storage_error::read_snapshot(None, &e))?;
        Ok(loaded.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// Builds a snapshot from the tree image taken when openraft asked for the
/// builder (between two applies, so the image matches its applied log id).
pub struct SnapshotBuilder {
    image: Result<TreeImage, StorageError>,
    applied: Result<AppliedState, StorageError>,
    file: SnapshotFile,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let image = std::mem::take(self.image.as_mut().map_err(|e| e.clone())?);
        let applied = self.applied.clone()?;
        let snapshot_id = match applied.last_applied {
            Some(log_id) => format!(
                "{}-{}-{}",
                log_id.leader_id,
                log_id.index,
                image.pairs.len()
            ),
            None => format!("empty-{}", image.pairs.len()),
        };
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership,
            snapshot_id,
        };
        let data = image.to_bytes();
        self.file
            .save(&meta, &data)
            .map_err(|e| storage_error::write_snapshot(Some(meta.signature()), &e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}
