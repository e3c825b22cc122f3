//! Read access to one shard's queues, shared by the state machine, the
//! node's dispatcher (payloads are read from here when dispatched, never held
//! in memory) and the stats API.

use crate::keys;
use crate::records::{AppliedState, ProducerRecord, StoredMessage, decode};
use crate::storage_error;
use crate::types::StorageError;

/// A cheap handle on a shard's state-machine tree.
#[derive(Clone)]
pub struct ShardReader {
    tree: sled::Tree,
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
    pub(crate) fn new(tree: sled::Tree) -> Self {
        Self { tree }
    }

    pub(crate) fn tree(&self) -> &sled::Tree {
        &self.tree
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
        let bytes = self
            .tree
            .get(keys::message(queue, producer, sequence))
            .map_err(storage_error::read_state_machine)?;
        bytes
            .map(|b| decode("message", &b).map_err(storage_error::read_state_machine))
            .transpose()
    }

    /// The producer's oldest stored message at or after `from`.
    pub fn oldest_message(
        &self,
        queue: &str,
        producer: &str,
        from: u64,
    ) -> Result<Option<(u64, StoredMessage)>, StorageError> {
        let prefix = keys::message_prefix(queue, producer);
        let start = keys::message(queue, producer, from);
        let Some(item) = self.tree.range(start..).next() else {
            return Ok(None);
        };
        let (key, value) = item.map_err(storage_error::read_state_machine)?;
        if !key.starts_with(&prefix) {
            return Ok(None);
        }
        let sequence = keys::message_sequence(&key).expect("message keys end with a sequence");
        let message = decode("message", &value).map_err(storage_error::read_state_machine)?;
        Ok(Some((sequence, message)))
    }

    /// Every producer of the shard, in key order.
    pub fn producers(&self) -> impl Iterator<Item = Result<ProducerEntry, StorageError>> + '_ {
        self.tree.scan_prefix([keys::PRODUCER_TAG]).map(|item| {
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
    /// have the same digest. It reads the tree while applies may go on, so
    /// compare replicas only once they report the same applied index.
    pub fn digest(&self) -> Result<(u64, u64), StorageError> {
        use std::hash::{DefaultHasher, Hasher};
        let mut hasher = DefaultHasher::new();
        let mut keys = 0;
        for item in self.tree.iter() {
            let (key, value) = item.map_err(storage_error::read_state_machine)?;
            hasher.write_usize(key.len());
            hasher.write(&key);
            hasher.write_usize(value.len());
            hasher.write(&value);
            keys += 1;
        }
        Ok((hasher.finish(), keys))
    }
}
