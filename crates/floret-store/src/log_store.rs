//! openraft's log storage for one shard, in two trees of the node's sled
//! database: `shard-N.log` (index -> entry) and `shard-N.raft` (vote,
//! committed, last purged).
//!
//! Appends become visible to readers at once and durable when the node's
//! [`Flusher`] completes their callback; votes are synced before
//! `save_vote` returns.
//!
//! IMPLEMENTATION CAVEATS
//! - Entries are encoded whole with postcard; a 1 MiB message is one value.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, RaftLogReader, Vote};

use crate::flusher::Flusher;
use crate::records::{decode, encode};
use crate::storage_error;
use crate::types::{LogId, NodeId, ShardId, StorageError, TypeConfig};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

/// Log storage of one shard; clones share the same trees.
#[derive(Clone)]
pub struct LogStore {
    log: sled::Tree,
    meta: sled::Tree,
    flusher: Flusher,
}

impl LogStore {
    /// Opens (or creates) the log trees of `shard` in `db`.
    pub fn open(db: &sled::Db, shard: ShardId, flusher: Flusher) -> Result<Self, sled::Error> {
        Ok(Self {
            log: db.open_tree(format!("shard-{shard}.log"))?,
            meta: db.open_tree(format!("shard-{shard}.raft"))?,
            flusher,
        })
    }

    fn read_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &'static [u8],
    ) -> Result<Option<T>, StorageError> {
        let bytes = self.meta.get(key).map_err(storage_error::read_logs)?;
        bytes
            .map(|bytes| decode("raft metadata", &bytes))
            .transpose()
            .map_err(storage_error::read_logs)
    }

    fn last_purged(&self) -> Result<Option<LogId>, StorageError> {
        self.read_meta(LAST_PURGED)
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn decode_entry(bytes: &[u8]) -> Result<openraft::Entry<TypeConfig>, StorageError> {
    decode("log entry", bytes).map_err(storage_error::read_logs)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<openraft::Entry<TypeConfig>>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&i) => Bound::Included(index_key(i)),
            Bound::Excluded(&i) => Bound::Excluded(index_key(i)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => Bound::Included(index_key(i)),
            Bound::Excluded(&i) => Bound::Excluded(index_key(i)),
            Bound::Unbounded => Bound::Unbounded,
        };
        self.log
            .range::<[u8; 8], _>((start, end))
            .map(|item| {
                item.map_err(storage_error::read_logs)
                    .and_then(|(_, v)| decode_entry(&v))
            })
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id = self.last_purged()?;
        let last = match self.log.last().map_err(storage_error::read_logs)? {
            Some((_, bytes)) => Some(decode_entry(&bytes)?.log_id),
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.meta
            .insert(VOTE, encode(vote))
            .map_err(storage_error::write_vote)?;
        self.flusher.sync().await.map_err(storage_error::write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.read_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.meta
            .insert(COMMITTED, encode(&committed))
            .map(drop)
            .map_err(storage_error::write_logs)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.read_meta::<Option<LogId>>(COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = openraft::Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            batch.insert(&index_key(entry.log_id.index), encode(&entry));
        }
        self.log
            .apply_batch(batch)
            .map_err(storage_error::write_logs)?;
        self.flusher
            .after_next_sync(Box::new(move |result| callback.log_io_completed(result)));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for key in self.log.range(index_key(log_id.index)..).keys() {
            batch.remove(key.map_err(storage_error::write_logs)?);
        }
        self.log
            .apply_batch(batch)
            .map_err(storage_error::write_logs)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.meta
            .insert(LAST_PURGED, encode(&log_id))
            .map_err(storage_error::write_logs)?;
        let mut batch = sled::Batch::default();
        for key in self.log.range(..=index_key(log_id.index)).keys() {
            batch.remove(key.map_err(storage_error::write_logs)?);
        }
        self.log
            .apply_batch(batch)
            .map_err(storage_error::write_logs)
    }
}
