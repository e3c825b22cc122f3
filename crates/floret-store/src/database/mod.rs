//! Opening a node's data dir: the raft log of every shard (`raft-log/`,
//! see [`crate::wal`]), one sled database for every shard's state machine
//! (`sled/`), a format marker that tells a floret data dir from anything
//! else, and clear errors when the dir is foreign, damaged or already in use
//! by another node.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use std::sync::{Arc, Mutex};

use crate::durability::StateMachineDurability;
use crate::flusher::{Flusher, SyncTarget};
use crate::log_store::LogStore;
use crate::purger::{NodeStorage, Purger};
use crate::reader::ShardReader;
use crate::state_machine::{AppliedListener, StateMachine};
use crate::types::ShardId;
use crate::wal::{SegmentRuns, Wal};
use crate::{keys, records};

mod claims;
mod marker;
mod shard_storage;

use marker::check_marker;
pub use marker::{FORMAT_VERSION, MARKER_FILE};
pub use shard_storage::ShardStorage;

/// sled's page cache. sled holds the per-producer index, counters and
/// removal marks, not payloads (they stay in the raft log), so a small
/// cache holds the hot part of a large backlog. 8 MiB holds a
/// 10,000,000-message backlog under 64 MiB per node where 16 MiB did not,
/// and drains a 1,000,000-message one about as fast (BENCHMARKS, "A smaller
/// sled cache, tried and reverted", and "An ack keeps its lease while its
/// removal commits").
pub const DEFAULT_CACHE_BYTES: u64 = 8 * 1024 * 1024;

/// Why a data dir cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The dir holds files but no floret marker.
    #[error(
        "{path} is not empty and is not a floret data dir (no {MARKER_FILE} marker); pick an empty or floret dir"
    )]
    NotFloret {
        /// The data dir.
        path: PathBuf,
    },
    /// The marker names a layout this build does not know.
    #[error("{path} holds floret data format {found}, this build reads format {FORMAT_VERSION}")]
    UnknownFormat {
        /// The data dir.
        path: PathBuf,
        /// What the marker says.
        found: String,
    },
    /// Another process holds the database lock.
    #[error("{path} is in use by another running floret node (its database lock is held)")]
    Locked {
        /// The data dir.
        path: PathBuf,
    },
    /// The data dir was created with another shard count.
    #[error(
        "{path} was created with {found} shards, the configuration asks for {requested}; shard count cannot change"
    )]
    ShardCountMismatch {
        /// The data dir.
        path: PathBuf,
        /// Shard count stored in the data dir.
        found: u32,
        /// Shard count of the configuration.
        requested: u32,
    },
    /// The data dir belongs to a cluster placed differently (other member
    /// ids or replication factor): its replica sets would not match.
    #[error(
        "data dir {path} belongs to a cluster of {found}, but this node was started as a member of {requested}; changing the members or the replication factor of a cluster is not supported yet"
    )]
    PlacementMismatch {
        /// The data dir.
        path: PathBuf,
        /// Placement recorded in the data dir.
        found: String,
        /// Placement of the configuration.
        requested: String,
    },
    /// Anything else from the file system or sled.
    #[error("cannot open data dir {path}: {source}")]
    Io {
        /// The data dir.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },
}

impl SyncTarget for Arc<Wal> {
    fn sync(&self) -> io::Result<()> {
        Wal::sync(self)
    }

    fn bytes_written(&self) -> u64 {
        Wal::bytes_written(self)
    }
}

/// Tells whether a node's raft log stopped after an I/O failure.
#[derive(Clone)]
pub struct LogHealth(Arc<Wal>);

impl LogHealth {
    /// Why the log stopped, if it did: every later append and sync fails
    /// until the node restarts and recovers.
    pub fn failure(&self) -> Option<String> {
        self.0.failure()
    }
}

/// Measures what a node's store takes on disk, from any task.
#[derive(Clone)]
pub struct StoreUsage {
    db: sled::Db,
    wal: Arc<Wal>,
}

/// What a node's store takes on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUsage {
    /// Bytes of the state machines (sled) and the raft log.
    pub bytes: u64,
    /// Segment files of the raft log.
    pub log_segments: u64,
}

impl StoreUsage {
    /// Reads the sizes now (a few `stat` calls).
    pub fn measure(&self) -> DiskUsage {
        let (log_segments, log_bytes) = self.wal.segments_on_disk();
        DiskUsage {
            bytes: self.db.size_on_disk().unwrap_or(0) + log_bytes,
            log_segments,
        }
    }
}

/// A node's open data dir: the raft log, the sled database and the flusher.
pub struct Database {
    db: sled::Db,
    dir: PathBuf,
    wal: Arc<Wal>,
    state_machines: StateMachineDurability,
    flusher: Flusher,
    flusher_thread: Option<std::thread::JoinHandle<()>>,
    purger: Purger,
    purger_thread: Option<std::thread::JoinHandle<()>>,
    /// The one reader of each shard whose state machine was opened.
    readers: Arc<Mutex<HashMap<ShardId, ShardReader>>>,
    /// Whether this open created the data dir.
    created: bool,
}

/// How a data dir is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// sled keeps at most this many bytes of pages in memory.
    pub cache_bytes: u64,
    /// The raft log starts a new segment past this size. Smaller segments
    /// are freed sooner once their entries are purged and their messages
    /// gone, at the cost of more files.
    pub log_segment_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            cache_bytes: DEFAULT_CACHE_BYTES,
            log_segment_bytes: crate::wal::SEGMENT_BYTES,
        }
    }
}

impl Database {
    /// Opens `dir` with the default options.
    pub fn open(dir: &Path) -> Result<Self, OpenError> {
        Self::open_with(dir, StoreOptions::default())
    }

    /// Opens `dir`, creating a new floret data dir if it is missing or empty.
    pub fn open_with(dir: &Path, options: StoreOptions) -> Result<Self, OpenError> {
        let io_error = |source| OpenError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let created = check_marker(dir)?;
        let sled_dir = dir.join("sled");
        #[cfg(feature = "failpoints")]
        let power_lost = crate::failpoints::emulate_power_loss(&dir.join("raft-log"), &sled_dir)
            .map_err(io_error)?;
        let db = sled::Config::new()
            .cache_capacity(options.cache_bytes)
            .path(&sled_dir)
            .open()
            .map_err(|error| match error {
                sled::Error::Io(source)
                    if source.kind() == io::ErrorKind::WouldBlock
                        || source.to_string().contains("lock") =>
                {
                    OpenError::Locked {
                        path: dir.to_path_buf(),
                    }
                }
                sled::Error::Io(source) => io_error(source),
                other => io_error(io::Error::other(other)),
            })?;
        let wal = Arc::new(
            Wal::open_with_segment_bytes(&dir.join("raft-log"), options.log_segment_bytes)
                .map_err(io_error)?,
        );
        let state_machines =
            StateMachineDurability::new(db.clone(), &sled_dir, wal.clone()).map_err(io_error)?;
        shard_storage::finish_retirements(&db, dir, &wal, &state_machines).map_err(io_error)?;
        wal.load_pins(load_pins(&db).map_err(io_error)?);
        #[cfg(feature = "failpoints")]
        if power_lost {
            crate::failpoints::check_power_loss_sound(wal.has_purged()).map_err(io_error)?;
        }
        let (flusher, flusher_thread) = Flusher::start(wal.clone()).map_err(io_error)?;
        let (purger, purger_thread) = Purger::start(NodeStorage {
            state_machines: state_machines.clone(),
            log: wal.clone(),
        })
        .map_err(io_error)?;
        Ok(Self {
            db,
            dir: dir.to_path_buf(),
            wal,
            state_machines,
            flusher,
            flusher_thread: Some(flusher_thread),
            purger,
            purger_thread: Some(purger_thread),
            readers: Arc::default(),
            created,
        })
    }

    /// Whether this open created the data dir (a new node, or one whose
    /// data was wiped).
    pub fn created(&self) -> bool {
        self.created
    }

    /// Bytes of torn write cut off the raft log when it was opened (see
    /// [`Wal::cut_at_open`]).
    pub fn log_cut_at_open(&self) -> u64 {
        self.wal.cut_at_open()
    }

    /// A cheap handle that tells whether the raft log stopped after an I/O failure.
    pub fn log_health(&self) -> LogHealth {
        LogHealth(self.wal.clone())
    }

    /// The node's raft log, for tests that write entries to it directly.
    #[cfg(test)]
    pub(crate) fn wal(&self) -> &Arc<Wal> {
        &self.wal
    }

    /// What the shards' raft groups store here, as a handle that outlives
    /// this borrow (a retired replica's group is opened again on it).
    pub fn shard_storage(&self) -> ShardStorage {
        ShardStorage {
            db: self.db.clone(),
            dir: self.dir.clone(),
            wal: self.wal.clone(),
            state_machines: self.state_machines.clone(),
            flusher: self.flusher.clone(),
            purger: self.purger.clone(),
            readers: self.readers.clone(),
        }
    }

    /// Log storage of one shard.
    pub fn log_store(&self, shard: ShardId) -> LogStore {
        self.shard_storage().log_store(shard)
    }

    /// State machine of one shard, reporting what it applies to `events`
    /// (see [`ShardStorage::state_machine`]).
    pub fn state_machine(
        &self,
        shard: ShardId,
        events: Option<AppliedListener>,
    ) -> Result<StateMachine, sled::Error> {
        self.shard_storage().state_machine(shard, events)
    }

    /// Waits until the purges asked so far are done and everything written
    /// so far, log and state machines, is durable.
    pub async fn sync(&self) -> io::Result<()> {
        self.purger.settled().await;
        self.flusher.sync().await?;
        let state_machines = self.state_machines.clone();
        tokio::task::spawn_blocking(move || state_machines.sync())
            .await
            .map_err(io::Error::other)?
    }

    /// Syncs, stops the flusher and waits for it, so that once every shard
    /// handle is dropped too the data dir can be opened again.
    pub fn close(mut self) {
        self.stop_purger();
        self.flusher.stop();
        if let Some(thread) = self.flusher_thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the flusher thread panicked");
        }
    }

    /// Ends the purger thread, which holds the sled database open.
    fn stop_purger(&mut self) {
        self.purger.stop();
        if let Some(thread) = self.purger_thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the purger thread panicked");
        }
    }

    /// A handle measuring what the store takes on disk.
    pub fn usage(&self) -> StoreUsage {
        StoreUsage {
            db: self.db.clone(),
            wal: self.wal.clone(),
        }
    }

    /// Bytes the database takes on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

/// A database dropped without [`Database::close`] still releases sled's
/// lock on its files once its shard handles are gone, so it can be opened
/// again.
impl Drop for Database {
    fn drop(&mut self) {
        self.stop_purger();
    }
}

/// How many runs of each shard's state machine point into each raft log
/// segment, as sled holds them at open.
fn load_pins(db: &sled::Db) -> io::Result<HashMap<ShardId, SegmentRuns>> {
    let mut per_shard = HashMap::new();
    for name in db.tree_names() {
        let Some(shard) = std::str::from_utf8(&name)
            .ok()
            .and_then(|name| name.strip_prefix("shard-")?.strip_suffix(".sm"))
            .and_then(|shard| shard.parse::<ShardId>().ok())
        else {
            continue;
        };
        let tree = db.open_tree(&name).map_err(io::Error::other)?;
        if let Some(bytes) = tree.get(keys::PAYLOAD_PINS).map_err(io::Error::other)? {
            let runs: SegmentRuns =
                records::decode("segment pins", &bytes).map_err(io::Error::other)?;
            per_shard.insert(shard, runs);
        }
    }
    Ok(per_shard)
}

#[cfg(test)]
mod tests;
