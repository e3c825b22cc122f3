//! Read access to one shard's queues, shared by the state machine, the
//! node's dispatcher (payloads are read from here when dispatched, never held
//! in memory) and the stats API. It also holds the shard's policies in
//! memory ([`PolicyTable`]), its [`BacklogTotals`] (over the whole shard
//! and per producer group) and the delivery times of its delayed messages,
//! which the state machine keeps equal to the tree, and where each
//! producer's messages were last found ([`RunHints`]).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::backlog_totals::{BacklogTotals, GroupTotals, producer_group};
use crate::keys;
use crate::policy::{Policy, PolicyTable};
use crate::records::{AppliedState, DeadLetterRecord, ProducerRecord, StoredMessage, decode};
use crate::resting;
use crate::runs::{self, RunHints};
use crate::shard_tree::ShardTree;
use crate::sink_spec::SinkSpec;
use crate::storage_error;
use crate::types::StorageError;
use crate::wal::Wal;

/// A cheap handle on a shard's state-machine tree.
#[derive(Clone)]
pub struct ShardReader {
    tree: Arc<ShardTree>,
    /// The node's raft log, where logged payloads lie.
    log: Arc<Wal>,
    policies: Arc<RwLock<PolicyTable>>,
    totals: Arc<BacklogTotals>,
    /// Delivery time of every stored delayed message, by message key.
    delays: Arc<RwLock<HashMap<Vec<u8>, i64>>>,
    run_hints: Arc<RunHints>,
}

/// One producer as the state machine knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerEntry {
    /// Queue the producer writes into.
    pub queue: String,
    /// The producer id.
    pub producer: String,
    /// Its durable counters.
    pub record: ProducerRecord,
}

impl ShardReader {
    /// A reader of `tree`, with the policies it stores loaded.
    pub(crate) fn new(tree: Arc<ShardTree>, log: Arc<Wal>) -> Result<Self, StorageError> {
        let policies = Self::load_policies(&tree)?;
        let delays = Self::load_delays(&tree)?;
        let reader = Self {
            tree,
            log,
            policies: Arc::new(RwLock::new(policies)),
            totals: Arc::default(),
            delays: Arc::new(RwLock::new(delays)),
            run_hints: Arc::default(),
        };
        reader.count_totals()?;
        Ok(reader)
    }

    fn load_delays(tree: &ShardTree) -> Result<HashMap<Vec<u8>, i64>, StorageError> {
        let mut delays = HashMap::new();
        for item in tree.scan_prefix(&[keys::DELAY_TAG]) {
            let (key, value) = item.map_err(storage_error::read_state_machine)?;
            let deliver_at: i64 =
                decode("delivery time", &value).map_err(storage_error::read_state_machine)?;
            delays.insert(keys::delayed_message(&key), deliver_at);
        }
        Ok(delays)
    }

    /// When the stored message `(queue, producer, sequence)` may be
    /// delivered, if it was produced with a delay. Costs one lock read when
    /// the shard holds no delayed message.
    pub fn deliver_at(&self, queue: &str, producer: &str, sequence: u64) -> Option<i64> {
        let delays = self.delays.read().expect("delay lock");
        if delays.is_empty() {
            return None;
        }
        delays
            .get(&keys::message(queue, producer, sequence))
            .copied()
    }

    /// Whether the message stored under `message_key` has a delivery time.
    pub(crate) fn is_delayed(&self, message_key: &[u8]) -> bool {
        let delays = self.delays.read().expect("delay lock");
        !delays.is_empty() && delays.contains_key(message_key)
    }

    /// Records delivery times an apply wrote and removed.
    pub(crate) fn delays_changed(&self, added: HashMap<Vec<u8>, i64>, removed: Vec<Vec<u8>>) {
        if added.is_empty() && removed.is_empty() {
            return;
        }
        let mut delays = self.delays.write().expect("delay lock");
        for key in removed {
            delays.remove(&key);
        }
        delays.extend(added);
    }

    /// Sums every producer's counters into the totals and its group's (at
    /// open, and after a snapshot replaced the tree). O(producers).
    fn count_totals(&self) -> Result<(), StorageError> {
        let (mut bytes, mut messages, mut producers) = (0, 0, 0);
        let mut groups: HashMap<String, HashMap<String, GroupTotals>> = HashMap::new();
        for entry in self.producers() {
            let ProducerEntry {
                queue,
                producer,
                record,
            } = entry?;
            bytes += record.bytes;
            messages += record.messages;
            producers += u64::from(record.messages > 0);
            if record.messages > 0 {
                let group = groups
                    .entry(queue)
                    .or_default()
                    .entry(producer_group(&producer).to_owned())
                    .or_default();
                *group = group.changed((0, 0), (record.bytes, record.messages));
            }
        }
        self.totals.reset(bytes, messages, producers, groups);
        Ok(())
    }

    /// What the shard stores over all producers.
    pub fn totals(&self) -> &BacklogTotals {
        &self.totals
    }

    fn load_policies(tree: &ShardTree) -> Result<PolicyTable, StorageError> {
        let mut table = PolicyTable::default();
        for tag in [keys::QUEUE_POLICY_TAG, keys::PRODUCER_POLICY_TAG] {
            for item in tree.scan_prefix(&[tag]) {
                let (key, value) = item.map_err(storage_error::read_state_machine)?;
                let (queue, producer) = keys::parse_policy(&key).ok_or_else(|| {
                    storage_error::read_state_machine(std::io::Error::other("malformed policy key"))
                })?;
                let policy: Policy =
                    decode("policy", &value).map_err(storage_error::read_state_machine)?;
                table.set(queue, producer, policy);
            }
        }
        Ok(table)
    }

    /// Loads the policies and totals again after the tree was replaced (a snapshot).
    pub(crate) fn reload(&self) -> Result<(), StorageError> {
        let table = Self::load_policies(&self.tree)?;
        *self.policies.write().expect("policy lock") = table;
        *self.delays.write().expect("delay lock") = Self::load_delays(&self.tree)?;
        self.run_hints.clear();
        self.count_totals()
    }

    /// Records a policy the state machine is writing.
    pub(crate) fn set_policy(&self, queue: &str, producer: Option<&str>, policy: Policy) {
        self.policies
            .write()
            .expect("policy lock")
            .set(queue, producer, policy);
    }

    /// The policy in force for `producer` of `queue`.
    pub fn policy(&self, queue: &str, producer: &str) -> Policy {
        self.policies
            .read()
            .expect("policy lock")
            .effective(queue, producer)
    }

    /// The policy stored for `queue` (`producer` None) or one producer, without inheritance.
    pub fn stored_policy(&self, queue: &str, producer: Option<&str>) -> Policy {
        self.policies
            .read()
            .expect("policy lock")
            .stored(queue, producer)
    }

    /// What `read` makes of the shard's policies, without copying them.
    pub fn with_policies<R>(&self, read: impl FnOnce(&PolicyTable) -> R) -> R {
        read(&self.policies.read().expect("policy lock"))
    }

    /// A copy of every policy of the shard.
    pub fn policies(&self) -> PolicyTable {
        self.policies.read().expect("policy lock").clone()
    }

    /// Every queue's sink the shard stores, in queue order.
    pub fn sinks(&self) -> Result<Vec<(String, SinkSpec)>, StorageError> {
        let mut sinks = Vec::new();
        for item in self.tree.scan_prefix(&[keys::SINK_TAG]) {
            let (key, value) = item.map_err(storage_error::read_state_machine)?;
            let queue = keys::parse_sink(&key).ok_or_else(|| {
                storage_error::read_state_machine(std::io::Error::other("malformed sink key"))
            })?;
            let sink: SinkSpec =
                decode("sink", &value).map_err(storage_error::read_state_machine)?;
            sinks.push((queue.to_owned(), sink));
        }
        Ok(sinks)
    }

    /// Up to `limit` dead letters of `queue` with ids from `from` on, in id order.
    pub fn dead_letters(
        &self,
        queue: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, DeadLetterRecord)>, StorageError> {
        let prefix = keys::dead_letter_prefix(queue);
        let mut found = Vec::new();
        for item in self
            .tree
            .range_from(&keys::dead_letter(queue, from))
            .take(limit)
        {
            let (key, value) = item.map_err(storage_error::read_state_machine)?;
            if !key.starts_with(&prefix) {
                break;
            }
            let id = keys::message_sequence(&key).expect("dead-letter keys end with an id");
            let record =
                decode("dead letter", &value).map_err(storage_error::read_state_machine)?;
            found.push((id, record));
        }
        Ok(found)
    }

    pub(crate) fn tree(&self) -> &ShardTree {
        &self.tree
    }

    pub(crate) fn run_hints(&self) -> &RunHints {
        &self.run_hints
    }

    pub(crate) fn log(&self) -> &Arc<Wal> {
        &self.log
    }

    /// The message at rest in `value`, its payload read from the log if logged.
    fn resolve(&self, value: &[u8]) -> Result<StoredMessage, StorageError> {
        resting::resolve(value, &self.log).map_err(storage_error::read_state_machine)
    }

    pub(crate) fn decode_producer(
        bytes: Option<sled::IVec>,
    ) -> Result<ProducerRecord, StorageError> {
        match bytes {
            Some(bytes) => {
                decode("producer record", &bytes).map_err(storage_error::read_state_machine)
            }
            None => Ok(ProducerRecord::default()),
        }
    }

    /// Last applied log id and membership.
    pub fn applied_state(&self) -> Result<AppliedState, StorageError> {
        match self
            .tree
            .get(keys::APPLIED)
            .map_err(storage_error::read_state_machine)?
        {
            Some(bytes) => {
                decode("applied state", &bytes).map_err(storage_error::read_state_machine)
            }
            None => Ok(AppliedState::default()),
        }
    }

    /// The durable counters of one producer, if it ever produced here.
    pub fn producer(
        &self,
        queue: &str,
        producer: &str,
    ) -> Result<Option<ProducerRecord>, StorageError> {
        let bytes = self
            .tree
            .get(keys::producer(queue, producer))
            .map_err(storage_error::read_state_machine)?;
        bytes.map(|b| Self::decode_producer(Some(b))).transpose()
    }

    /// One stored message; None once it was acked and removed.
    pub fn message(
        &self,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Result<Option<StoredMessage>, StorageError> {
        let Some(head) = self.producer(queue, producer)?.map(|record| record.head) else {
            return Ok(None);
        };
        let prefix = keys::message_prefix(queue, producer);
        let Some(found) = runs::last_at_or_before(&self.tree, &self.run_hints, &prefix, sequence)
            .map_err(storage_error::read_state_machine)?
        else {
            return Ok(None);
        };
        runs::live_message(&self.tree, &found, sequence, head)
            .map_err(storage_error::read_state_machine)?
            .map(|bytes| self.resolve(&bytes))
            .transpose()
    }

    /// The producer's oldest stored message at or after `from`.
    pub fn oldest_message(
        &self,
        queue: &str,
        producer: &str,
        from: u64,
    ) -> Result<Option<(u64, StoredMessage)>, StorageError> {
        let Some(head) = self.producer(queue, producer)?.map(|record| record.head) else {
            return Ok(None);
        };
        let from = from.max(head);
        let prefix = keys::message_prefix(queue, producer);
        let from_key = keys::message(queue, producer, from);
        let holding = runs::last_at_or_before(&self.tree, &self.run_hints, &prefix, from)
            .map_err(storage_error::read_state_machine)?
            .map(|found| (found.key.into(), found.run));
        let mut next = match holding {
            Some(found) => Some(found),
            None => runs::first_from(&self.tree, &from_key, &prefix)
                .map_err(storage_error::read_state_machine)?,
        };
        while let Some((run_key, run)) = next {
            let first = keys::message_sequence(&run_key).expect("run keys end with a sequence");
            let marks = self
                .tree
                .get(keys::removed(&run_key))
                .map_err(storage_error::read_state_machine)?;
            let removed = runs::Removed::stored(marks.as_deref(), run.len())
                .map_err(storage_error::read_state_machine)?;
            let skip = from.saturating_sub(first) as usize;
            if let Some(index) = (skip..run.len()).find(|&index| !removed.contains(index)) {
                let bytes = run
                    .message_within(index)
                    .map_err(storage_error::read_state_machine)?;
                return Ok(Some((first + index as u64, self.resolve(&bytes)?)));
            }
            let after = keys::message(queue, producer, first + run.len() as u64);
            next = runs::first_from(&self.tree, &after, &prefix)
                .map_err(storage_error::read_state_machine)?;
        }
        Ok(None)
    }

    /// Every producer of the shard, in key order.
    pub fn producers(&self) -> impl Iterator<Item = Result<ProducerEntry, StorageError>> + '_ {
        self.tree.scan_prefix(&[keys::PRODUCER_TAG]).map(|item| {
            let (key, value) = item.map_err(storage_error::read_state_machine)?;
            let (queue, producer) = keys::parse_producer(&key).ok_or_else(|| {
                storage_error::read_state_machine(std::io::Error::other("malformed producer key"))
            })?;
            Ok(ProducerEntry {
                queue: queue.to_owned(),
                producer: producer.to_owned(),
                record: Self::decode_producer(Some(value))?,
            })
        })
    }

    /// A digest of the whole replica state (every key and value, in key
    /// order) and the number of keys: replicas that applied the same entries
    /// have the same digest. Messages count by their payload's length and
    /// checksum, not by where the payload lies, and this node's own keys
    /// (segment counts, a redo record) are left out. It reads the tree while applies may go on, so
    /// compare replicas only once they report the same applied index.
    pub fn digest(&self) -> Result<(u64, u64), StorageError> {
        use std::hash::{DefaultHasher, Hasher};
        let mut hasher = DefaultHasher::new();
        let mut keys = 0;
        for item in self.tree.iter() {
            let (key, value) = item.map_err(storage_error::read_state_machine)?;
            if keys::is_node_local(&key) {
                continue;
            }
            hasher.write_usize(key.len());
            hasher.write(&key);
            if key.first() == Some(&keys::MESSAGE_TAG) {
                let run =
                    runs::Run::parse(&value[..]).map_err(storage_error::read_state_machine)?;
                hasher.write_usize(run.len());
                for index in 0..run.len() {
                    let message = run
                        .message_within(index)
                        .map_err(storage_error::read_state_machine)?;
                    resting::hash_message(&message, &mut hasher)
                        .map_err(storage_error::read_state_machine)?;
                }
            } else {
                hasher.write_usize(value.len());
                hasher.write(&value);
            }
            keys += 1;
        }
        Ok((hasher.finish(), keys))
    }
}
