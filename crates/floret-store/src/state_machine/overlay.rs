//! The read-your-writes overlay of one `apply` call: every change it makes
//! (runs of messages, removal marks, producer records, delays, policies,
//! dead-letter ids) gathered in memory, reads that see them first, and the
//! commit that writes them as one crash-atomic change set and then updates
//! the reader's in-memory tables. What each operation means is `ops.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;

use crate::change_set::ChangeSet;
use crate::keys;
use crate::policy::Policy;
use crate::reader::ShardReader;
use crate::records::{AppliedState, ProducerRecord, encode};
use crate::resting;
use crate::runs::{self, Removed, Run};
use crate::shard_tree::{ShardTree, WRITE_OUT_BYTES};
use crate::storage_error;
use crate::types::{NewMessage, ShardId, StorageError};
use crate::wal::{PayloadSection, SegmentRuns, Wal};

use super::AppliedEvent;

/// A run's bytes: as read from the tree, or written by this apply.
pub(super) enum RunBytes {
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
pub(super) struct TouchedRun {
    pub(super) run: Run<RunBytes>,
    pub(super) removed: Removed,
    /// Whether its removal marks changed in this apply.
    pub(super) marks_changed: bool,
    /// Whether the tree held removal marks for it when this apply began, so
    /// removing the whole run must delete them too (a run removed in one go
    /// never had any, and a deletion of nothing would still be written).
    pub(super) marks_stored: bool,
}

/// Changes of one `apply` call, gathered before they are written as one
/// change set. Reads go through [`PendingApply::get`], which sees this
/// apply's own writes first.
pub(super) struct PendingApply<'a> {
    pub(super) shard: ShardId,
    pub(super) reader: &'a ShardReader,
    pub(super) changes: ChangeSet,
    pub(super) producers: HashMap<Vec<u8>, ProducerRecord>,
    /// (bytes, messages) of each producer in `producers` before this apply.
    pub(super) stored_before: HashMap<Vec<u8>, (u64, u64)>,
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

impl<'a> PendingApply<'a> {
    pub(super) fn new(shard: ShardId, reader: &'a ShardReader) -> Self {
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
        match self.changes.pending(key) {
            Some(value) => Ok(value.map(sled::IVec::from)),
            None => self
                .tree()
                .get(key)
                .map_err(storage_error::read_state_machine),
        }
    }

    pub(super) fn producer(
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
    pub(super) fn add_run(
        &mut self,
        queue: &str,
        producer: &str,
        first: u64,
        messages: &[Vec<u8>],
    ) {
        let run = Run::parse(RunBytes::New(runs::encode(messages)))
            .expect("a run just encoded is well formed");
        let removed = Removed::none(run.len());
        self.runs.insert(
            keys::message(queue, producer, first),
            TouchedRun {
                run,
                removed,
                marks_changed: false,
                marks_stored: false,
            },
        );
    }

    /// Brings a stored run into `runs`, unless this apply touched it
    /// already; returns its key.
    pub(super) fn touch(
        &mut self,
        key: sled::IVec,
        run: Run<sled::IVec>,
    ) -> Result<Vec<u8>, StorageError> {
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
                    marks_stored: marks.is_some(),
                },
            );
        }
        Ok(key)
    }

    /// The run that holds `sequence` of the producer as this apply leaves
    /// it so far, with the message's index in it; None if no run does.
    pub(super) fn run_holding(
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
            runs::last_in(self.tree(), &prefix, &key).map_err(storage_error::read_state_machine)?
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
    pub(super) fn run_from(
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
    pub(super) fn remove_from_run(
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
    pub(super) fn is_stored(
        &mut self,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Result<bool, StorageError> {
        Ok(self
            .run_holding(queue, producer, sequence)?
            .is_some_and(|(run_key, index)| !self.runs[&run_key].removed.contains(index)))
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
                    self.changes.remove(key);
                    if touched.marks_stored {
                        self.changes.remove(marks_key);
                    }
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
