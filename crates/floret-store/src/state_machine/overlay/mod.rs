//! The read-your-writes overlay of one `apply` call: every change it makes
//! (runs of messages, removal marks, producer records, delays, policies,
//! dead-letter ids) gathered in memory, reads that see them first, and the
//! commit that writes them as one crash-atomic change set and then updates
//! the reader's in-memory tables. What each operation means is `ops.rs`.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};

use crate::change_set::ChangeSet;
use crate::keys;
use crate::policy::Policy;
use crate::reader::ShardReader;
use crate::records::{AppliedState, ProducerRecord, encode};
use crate::resting;
use crate::runs::Run;
use crate::shard_tree::{ShardTree, WRITE_OUT_BYTES};
use crate::storage_error;
use crate::types::{NewMessage, ShardId, StorageError};
use crate::wal::{PayloadSection, SegmentRuns, Wal};

use super::AppliedEvent;

mod touched_runs;

pub(super) use touched_runs::{RunBytes, TouchedRun, run_first};

/// Changes of one `apply` call, gathered before they are written as one
/// change set. Reads go through [`PendingApply::get`], which sees this
/// apply's own writes first.
pub(super) struct PendingApply<'a> {
    pub(super) shard: ShardId,
    pub(super) reader: &'a ShardReader,
    pub(super) changes: ChangeSet,
    /// The records of the producers this apply read or changed, by key.
    pub(super) producers: HashMap<Vec<u8>, ProducerChange>,
    /// Next dead-letter id per queue, for queues that got dead letters in this apply.
    pub(super) next_dead_letter: HashMap<String, u64>,
    /// Delivery times written by this apply, by message key.
    pub(super) delays_added: HashMap<Vec<u8>, i64>,
    /// Message keys whose delivery time this apply removed.
    pub(super) delays_removed: Vec<Vec<u8>>,
    /// Every run this apply wrote or removed messages from, by key.
    pub(super) runs: BTreeMap<Vec<u8>, TouchedRun>,
    /// Message prefixes of producers this apply forgot. Their stored runs
    /// are all being deleted, so lookups must not bring them back.
    pub(super) forgotten: HashSet<Vec<u8>>,
    /// Policies this apply stored, in order; the shared table gets them
    /// once they are written.
    pub(super) policies_set: Vec<(String, Option<String>, Policy)>,
    pub(super) events: Vec<AppliedEvent>,
    /// Where the payloads of the entry being applied lie in the log, as far
    /// as its ops have used them; None stores them inline.
    payloads: Option<PayloadSection>,
    /// The shard's runs per log segment, as this apply leaves them so far.
    pins: SegmentRuns,
    pins_changed: bool,
}

/// A producer's record as one apply leaves it so far.
pub(super) struct ProducerChange {
    record: ProducerRecord,
    /// (bytes, messages) it had before this apply.
    before: (u64, u64),
}

/// The value of `key` as the apply whose changes are `changes` leaves it.
fn value_as_left(
    changes: &ChangeSet,
    tree: &ShardTree,
    key: &[u8],
) -> Result<Option<sled::IVec>, StorageError> {
    match changes.pending(key) {
        Some(value) => Ok(value.map(sled::IVec::from)),
        None => tree.get(key).map_err(storage_error::read_state_machine),
    }
}

impl<'a> PendingApply<'a> {
    pub(super) fn new(shard: ShardId, reader: &'a ShardReader) -> Self {
        Self {
            shard,
            reader,
            changes: ChangeSet::default(),
            producers: HashMap::new(),
            next_dead_letter: HashMap::new(),
            delays_added: HashMap::new(),
            delays_removed: Vec::new(),
            runs: BTreeMap::new(),
            forgotten: HashSet::new(),
            policies_set: Vec::new(),
            events: Vec::new(),
            payloads: None,
            pins: reader.log().pins_of(shard),
            pins_changed: false,
        }
    }

    pub(super) fn log(&self) -> &Wal {
        self.reader.log()
    }

    /// The next entry's payloads lie at `section` in the log (None: not
    /// durable there, store them inline).
    pub(super) fn payloads_from(&mut self, section: Option<PayloadSection>) {
        self.payloads = section;
    }

    /// Where each of `messages` (the next payloads of the entry, in its
    /// order) starts in the log, if the entry's payloads are logged. Every
    /// enqueue takes its payloads' places, even one that stores nothing.
    pub(super) fn logged_payloads(
        &mut self,
        messages: &[NewMessage],
    ) -> Vec<Option<PayloadSection>> {
        messages
            .iter()
            .map(|message| {
                let section = self.payloads.as_mut()?;
                let start = *section;
                section.offset += message.payload.len() as u64;
                Some(start)
            })
            .collect()
    }

    /// Takes a stored run that is being deleted out of the shard's pins.
    pub(super) fn unpin<B: AsRef<[u8]>>(&mut self, run: &Run<B>) -> Result<(), StorageError> {
        self.pin(run, false)
    }

    /// Counts a stored run's segment in or out of the shard's pins.
    fn pin<B: AsRef<[u8]>>(&mut self, run: &Run<B>, added: bool) -> Result<(), StorageError> {
        let Some(segment) = resting::run_segment(run).map_err(storage_error::read_state_machine)?
        else {
            return Ok(());
        };
        let runs = self.pins.entry(segment).or_default();
        if added {
            *runs += 1;
        } else {
            *runs = runs.saturating_sub(1);
            if *runs == 0 {
                self.pins.remove(&segment);
            }
        }
        self.pins_changed = true;
        Ok(())
    }

    pub(super) fn tree(&self) -> &ShardTree {
        self.reader.tree()
    }

    /// The policy stored for `queue` or one producer as this apply leaves it so far.
    pub(super) fn stored_policy(&self, queue: &str, producer: Option<&str>) -> Policy {
        self.policies_set
            .iter()
            .rev()
            .find(|(q, p, _)| q == queue && p.as_deref() == producer)
            .map(|(_, _, policy)| *policy)
            .unwrap_or_else(|| self.reader.stored_policy(queue, producer))
    }

    /// The policy in force for `producer` as this apply leaves it so far.
    pub(super) fn policy(&self, queue: &str, producer: &str) -> Policy {
        if self.policies_set.is_empty() {
            return self.reader.policy(queue, producer);
        }
        self.stored_policy(queue, Some(producer))
            .over(self.stored_policy(queue, None))
    }

    /// The value of `key` as this apply leaves it so far.
    pub(super) fn get(&self, key: &[u8]) -> Result<Option<sled::IVec>, StorageError> {
        value_as_left(&self.changes, self.tree(), key)
    }

    /// The producer's record as this apply leaves it so far, to read or change.
    pub(super) fn producer(
        &mut self,
        queue: &str,
        producer: &str,
    ) -> Result<&mut ProducerRecord, StorageError> {
        let change = match self.producers.entry(keys::producer(queue, producer)) {
            Entry::Occupied(held) => held.into_mut(),
            Entry::Vacant(unread) => {
                let stored = value_as_left(&self.changes, self.reader.tree(), unread.key())?;
                let record = ShardReader::decode_producer(stored)?;
                unread.insert(ProducerChange {
                    before: (record.bytes, record.messages),
                    record,
                })
            }
        };
        Ok(&mut change.record)
    }

    /// The producer's head as this apply leaves it so far, read without
    /// holding its record for the commit to write.
    pub(super) fn producer_head(&self, queue: &str, producer: &str) -> Result<u64, StorageError> {
        let key = keys::producer(queue, producer);
        if let Some(change) = self.producers.get(&key) {
            return Ok(change.record.head);
        }
        let stored = value_as_left(&self.changes, self.reader.tree(), &key)?;
        Ok(ShardReader::decode_producer(stored)?.head)
    }

    /// Removes the delivery time of a message being deleted, if it has one.
    pub(super) fn forget_delay(&mut self, message_key: &[u8]) {
        if self.delays_added.remove(message_key).is_some() || self.reader.is_delayed(message_key) {
            self.changes.remove(keys::delay(message_key));
            self.delays_removed.push(message_key.to_vec());
        }
    }

    pub(super) fn commit(
        mut self,
        applied: &AppliedState,
    ) -> Result<Vec<AppliedEvent>, StorageError> {
        for (key, touched) in std::mem::take(&mut self.runs) {
            let marks_key = keys::removed(&key);
            let is_new = matches!(touched.run.as_bytes(), RunBytes::New(_));
            let written = is_new && !touched.removed.all();
            let deleted = !is_new && touched.removed.all();
            if written || deleted {
                self.pin(&touched.run, written)?;
            }
            let new_run = match touched.run.into_bytes() {
                RunBytes::New(bytes) => Some(bytes),
                RunBytes::Stored(_) => None,
            };
            if touched.removed.all() {
                if new_run.is_none() {
                    self.reader.run_hints().forget_run(&key);
                    self.changes.remove(key);
                    if touched.marks_stored {
                        self.changes.remove(marks_key);
                    }
                }
                continue;
            }
            if touched.marks_changed {
                if new_run.is_none() {
                    self.reader
                        .run_hints()
                        .marks_changed(&key, touched.removed.as_bytes());
                }
                self.changes
                    .insert(marks_key, touched.removed.as_bytes().to_vec());
            }
            if let Some(bytes) = new_run {
                self.changes.insert(key, bytes);
            }
        }
        let mut changed_totals = Vec::with_capacity(self.producers.len());
        for (key, ProducerChange { record, before }) in self.producers {
            changed_totals.push((key.clone(), before, (record.bytes, record.messages)));
            self.changes.insert(key, encode(&record));
        }
        for (queue, id) in self.next_dead_letter {
            self.changes
                .insert(keys::next_dead_letter(&queue), encode(&id));
        }
        self.changes.insert(keys::APPLIED.to_vec(), encode(applied));
        if self.pins_changed {
            self.changes
                .insert(keys::PAYLOAD_PINS.to_vec(), encode(&self.pins));
        }
        let unwritten = self
            .reader
            .tree()
            .apply(self.changes)
            .map_err(storage_error::write_state_machine)?;
        if unwritten > WRITE_OUT_BYTES {
            self.reader
                .tree()
                .write_out()
                .map_err(storage_error::write_state_machine)?;
        }
        self.reader.log().set_pins(self.shard, self.pins);
        for (_, before, after) in &changed_totals {
            self.reader.totals().changed(*before, *after);
        }
        self.reader
            .totals()
            .groups_changed(changed_totals.iter().filter_map(|(key, before, after)| {
                let (queue, producer) = keys::parse_producer(key)?;
                Some((queue, producer, *before, *after))
            }));
        self.reader
            .delays_changed(self.delays_added, self.delays_removed);
        for (queue, producer, policy) in self.policies_set {
            self.reader.set_policy(&queue, producer.as_deref(), policy);
        }
        Ok(self.events)
    }
}
