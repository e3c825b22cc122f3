//! Making the state machines durable on demand.
//!
//! The raft log is the source of truth: applied changes wait in memory
//! (`shard_tree/`), go to sled and reach the disk lazily, and a restart
//! re-applies the log from the last applied id. Before log entries are
//! purged (after a snapshot) the state machines must be on disk for real:
//! a sync writes every shard's unwritten changes out to sled first. sled's `flush()` is not an fsync on
//! Linux (it uses `sync_file_range`) and sled never syncs the blob files it
//! writes for values over 128 KiB, so this follows the flush with
//! `fdatasync` of the database file, of every new blob file, and of the
//! folders that gained entries.
//!
//! It also tells the raft log which of its segments the state machines on
//! disk still point into: the counts taken as the sync began hold for what
//! it wrote (see `wal/pins.rs`).

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::shard_tree::ShardTree;
use crate::types::ShardId;
use crate::wal::Wal;

/// Cheap handle that syncs the node's sled database for real.
#[derive(Clone)]
pub struct StateMachineDurability {
    db: sled::Db,
    /// Every shard's tree, whose unwritten changes a sync writes out first.
    trees: Arc<Mutex<HashMap<ShardId, Arc<ShardTree>>>>,
    files: Arc<Mutex<DurableFiles>>,
    log: Arc<Wal>,
}

impl StateMachineDurability {
    /// For the sled database `db` whose files live in `dir`, whose logged
    /// payloads lie in `log`.
    pub fn new(db: sled::Db, dir: &Path, log: Arc<Wal>) -> io::Result<Self> {
        Ok(Self {
            db,
            trees: Arc::default(),
            files: Arc::new(Mutex::new(DurableFiles::open(dir)?)),
            log,
        })
    }

    /// The tree of `shard`, opened by `open` the first time it is asked for.
    pub(crate) fn shard_tree(
        &self,
        shard: ShardId,
        open: impl FnOnce() -> sled::Result<ShardTree>,
    ) -> sled::Result<Arc<ShardTree>> {
        let mut trees = self
            .trees
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(tree) = trees.get(&shard) {
            return Ok(tree.clone());
        }
        let tree = Arc::new(open()?);
        trees.insert(shard, tree.clone());
        Ok(tree)
    }

    /// Blocks until everything applied to the state machines so far is on disk.
    pub fn sync(&self) -> io::Result<()> {
        let pins = self.log.capture_pins();
        let trees: Vec<Arc<ShardTree>> = self
            .trees
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .cloned()
            .collect();
        for tree in trees {
            tree.write_out().map_err(io::Error::other)?;
        }
        self.db.flush().map_err(io::Error::other)?;
        self.files
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .sync()?;
        self.log.pins_synced(pins);
        Ok(())
    }
}

/// The files of a sled database that must reach the disk.
struct DurableFiles {
    dir: PathBuf,
    db_file: File,
    blobs_dir: PathBuf,
    synced_blobs: HashSet<OsString>,
}

impl DurableFiles {
    fn open(dir: &Path) -> io::Result<Self> {
        let db_file = File::open(dir.join("db"))?;
        File::open(dir)?.sync_all()?;
        Ok(Self {
            dir: dir.to_path_buf(),
            db_file,
            blobs_dir: dir.join("blobs"),
            synced_blobs: HashSet::new(),
        })
    }

    fn sync(&mut self) -> io::Result<()> {
        self.db_file.sync_data()?;
        self.sync_new_blobs()
    }

    fn sync_new_blobs(&mut self) -> io::Result<()> {
        let entries = match std::fs::read_dir(&self.blobs_dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        let mut present = HashSet::new();
        let mut synced_any = false;
        for entry in entries {
            let name = entry?.file_name();
            if !self.synced_blobs.contains(&name) {
                match File::open(self.blobs_dir.join(&name)) {
                    Ok(file) => file.sync_data()?,
                    Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                    Err(error) => return Err(error),
                }
                synced_any = true;
            }
            present.insert(name);
        }
        if synced_any {
            File::open(&self.blobs_dir)?.sync_all()?;
            File::open(&self.dir)?.sync_all()?;
        }
        self.synced_blobs = present;
        Ok(())
    }
}
