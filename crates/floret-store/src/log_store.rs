//! openraft's log storage for one shard: a view of the node's shared
//! [`Wal`] for that shard.
//!
//! Appends become visible to readers at once and durable when the node's
//! [`Flusher`] completes their callback (one `fdatasync` for every shard);
//! votes are synced before `save_vote` returns. A purge is handed to the
//! node's [`Purger`], which makes the state machines durable first (after
//! the purge only they and the snapshot hold what those entries did),
//! without holding up the shard's raft core meanwhile.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{EntryPayload, LogState, RaftLogReader, Vote};

use crate::flusher::Flusher;
use crate::purger::Purger;
use crate::records::{decode, encode};
use crate::storage_error;
use crate::types::{LogId, NodeId, ShardId, StorageError, TypeConfig};
use crate::wal::{EncodedEntry, Wal};

/// Log storage of one shard; clones share the same log.
#[derive(Clone)]
pub struct LogStore {
    shard: ShardId,
    wal: Arc<Wal>,
    flusher: Flusher,
    purger: Purger,
}

impl LogStore {
    pub(crate) fn new(shard: ShardId, wal: Arc<Wal>, flusher: Flusher, purger: Purger) -> Self {
        Self {
            shard,
            wal,
            flusher,
            purger,
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<openraft::Entry<TypeConfig>>, StorageError> {
        let encoded = self
            .wal
            .read(self.shard, range)
            .map_err(storage_error::read_logs)?;
        encoded.into_iter().map(decode_entry).collect()
    }

    /// What replication sends: the entries from `start` on, or none when
    /// `start` is purged or hidden by a purge. openraft's contract lets
    /// [`Self::try_get_log_entries`] skip those and return the entries after
    /// them, but replication sends what this returns as the entries that
    /// follow `start - 1`, so a purge racing a follower's replication gave
    /// that follower a log with a hole (seen after rolling restarts). openraft takes an empty answer
    /// as a heartbeat, and its next try sends the follower a snapshot.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<openraft::Entry<TypeConfig>>, StorageError> {
        let entries = self.try_get_log_entries(start..end).await?;
        match entries.first() {
            Some(first) if first.log_id.index != start => {
                tracing::warn!(
                    shard = self.shard,
                    start,
                    first = first.log_id.index,
                    "not replicating entries that do not start where asked (a purge took the start)"
                );
                Ok(Vec::new())
            }
            _ => Ok(entries),
        }
    }
}

/// The entry as the log stores it: without its payloads, which go raw after it.
pub(crate) fn encode_entry(mut entry: openraft::Entry<TypeConfig>) -> EncodedEntry {
    let payloads = match &mut entry.payload {
        EntryPayload::Normal(command) => command.payloads_mut().map(std::mem::take).collect(),
        _ => Vec::new(),
    };
    EncodedEntry {
        meta: encode(&entry),
        payloads,
    }
}

/// The entry [`encode_entry`] stored, payloads put back.
fn decode_entry(encoded: EncodedEntry) -> Result<openraft::Entry<TypeConfig>, StorageError> {
    let mut entry: openraft::Entry<TypeConfig> =
        decode("log entry", &encoded.meta).map_err(storage_error::read_logs)?;
    let mut payloads = encoded.payloads.into_iter();
    if let EntryPayload::Normal(command) = &mut entry.payload {
        for slot in command.payloads_mut() {
            *slot = payloads.next().ok_or_else(|| {
                storage_error::read_logs(std::io::Error::other(
                    "a log entry lists fewer payloads than it has messages",
                ))
            })?;
        }
    }
    if payloads.next().is_some() {
        return Err(storage_error::read_logs(std::io::Error::other(
            "a log entry lists more payloads than it has messages",
        )));
    }
    Ok(entry)
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let (last_purged_log_id, last_log_id) = self.wal.log_state(self.shard);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.wal
            .save_vote(self.shard, vote)
            .map_err(storage_error::write_vote)?;
        self.flusher.sync().await.map_err(storage_error::write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.wal.vote(self.shard))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.wal
            .save_committed(self.shard, committed)
            .map_err(storage_error::write_logs)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.wal.committed(self.shard))
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
        let encoded = entries
            .into_iter()
            .map(|entry| (entry.log_id, encode_entry(entry)))
            .collect();
        self.wal
            .append(self.shard, encoded)
            .map_err(storage_error::write_logs)?;
        self.flusher
            .after_next_sync(Box::new(move |result| callback.log_io_completed(result)));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.wal
            .truncate(self.shard, log_id.index)
            .map_err(storage_error::write_logs)
    }

    /// Hides the entries and queues their purge, without waiting, while
    /// the log holds entries after them; otherwise waits: see [`Purger`].
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.wal.hide_purged(self.shard, log_id);
        if self.wal.holds_entries_after(self.shard, log_id.index) {
            self.purger.purge(self.shard, log_id);
            return Ok(());
        }
        self.purger
            .purge_and_wait(self.shard, log_id)
            .await
            .map_err(storage_error::write_logs)
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorage;
    use openraft::{CommittedLeaderId, Entry, EntryPayload, RaftLogReader};

    use crate::Database;
    use crate::log_store::encode_entry;
    use crate::types::LogId;

    #[tokio::test]
    async fn replication_never_reads_the_entries_after_a_purge_as_following_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let database = Database::open(dir.path()).unwrap();
        let entries = (0..10)
            .map(|index| {
                let entry = Entry {
                    log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
                    payload: EntryPayload::Blank,
                };
                (entry.log_id, encode_entry(entry))
            })
            .collect();
        database.wal().append(0, entries).unwrap();
        let mut store = database.log_store(0);
        store
            .purge(LogId::new(CommittedLeaderId::new(1, 1), 5))
            .await
            .unwrap();

        assert!(
            store
                .limited_get_log_entries(3, 10)
                .await
                .unwrap()
                .is_empty()
        );
        let from_six = store.limited_get_log_entries(6, 10).await.unwrap();
        let indexes: Vec<u64> = from_six.iter().map(|e| e.log_id.index).collect();
        assert_eq!(indexes, vec![6, 7, 8, 9]);
        assert_eq!(
            store.try_get_log_entries(3..10).await.unwrap().len(),
            4,
            "openraft's contract for other reads: what is left of the range"
        );
    }
}
