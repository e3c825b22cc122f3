//! What a shard's raft group stores on this node, as a cheap handle the
//! shards keep after start: each shard's log store and state machine, and
//! retiring a replica, deleting everything this node stores of the shard
//! (its raft log, state machine and snapshot) once a move has taken the
//! replica away, so a later move can start a replica here from nothing.
//!
//! Retiring is crash-safe: a durable mark in sled's default tree comes
//! first, then the log forgets the shard, the state machine is emptied and
//! the snapshot deleted, and once that is durable the mark goes. Opening a
//! data dir finishes a retirement a crash interrupted before anything
//! reads the shard: half a retirement (a state machine without the log
//! that built it, or the reverse) must never be served.
//!
//! Every state machine of a shard shares one reader (its tree, policies,
//! totals and delays), so what holds a shard's reader, like the
//! dispatcher, keeps reading the shard through a retirement and whatever
//! replica follows it.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::change_set::ChangeSetError;
use crate::durability::StateMachineDurability;
use crate::flusher::Flusher;
use crate::log_store::LogStore;
use crate::purger::Purger;
use crate::reader::ShardReader;
use crate::shard_tree::ShardTree;
use crate::snapshot::SnapshotFile;
use crate::state_machine::{AppliedListener, StateMachine};
use crate::types::ShardId;
use crate::wal::Wal;

/// Key prefix in sled's default tree of a retirement under way.
const RETIRING_PREFIX: &[u8] = b"retiring-shard/";

/// The storage of every shard on a node; cheap to clone.
#[derive(Clone)]
pub struct ShardStorage {
    pub(super) db: sled::Db,
    pub(super) dir: PathBuf,
    pub(super) wal: Arc<Wal>,
    pub(super) state_machines: StateMachineDurability,
    pub(super) flusher: Flusher,
    pub(super) purger: Purger,
    pub(super) readers: Arc<Mutex<HashMap<ShardId, ShardReader>>>,
}

impl ShardStorage {
    /// Log storage of one shard.
    pub fn log_store(&self, shard: ShardId) -> LogStore {
        LogStore::new(
            shard,
            self.wal.clone(),
            self.flusher.clone(),
            self.purger.clone(),
        )
    }

    /// State machine of one shard, reporting what it applies to `events`.
    /// Every state machine of a shard shares its reader (tree, unwritten
    /// changes and what is loaded from them).
    pub fn state_machine(
        &self,
        shard: ShardId,
        events: Option<AppliedListener>,
    ) -> Result<StateMachine, sled::Error> {
        let snapshots = self.dir.join("snapshots");
        if let Some(reader) = self.cached_reader(shard) {
            return Ok(StateMachine::with_reader(reader, shard, &snapshots, events));
        }
        let tree = self.state_machines.shard_tree(shard, || {
            let (tree, completed) = ShardTree::open(self.db.open_tree(tree_name(shard))?).map_err(
                |error| match error {
                    ChangeSetError::Sled(error) => error,
                    redo => sled::Error::Io(io::Error::new(
                        io::ErrorKind::InvalidData,
                        redo.to_string(),
                    )),
                },
            )?;
            if completed {
                tracing::info!(
                    shard,
                    "completed a write to the state machine a crash interrupted"
                );
            }
            Ok(tree)
        })?;
        let state_machine = StateMachine::open(tree, self.wal.clone(), shard, &snapshots, events)?;
        self.readers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(shard, state_machine.reader());
        Ok(state_machine)
    }

    fn cached_reader(&self, shard: ShardId) -> Option<ShardReader> {
        self.readers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&shard)
            .cloned()
    }

    /// Deletes everything this node stores of `shard`, durably: its raft
    /// log, state machine and snapshot. Its raft group must be shut down
    /// first (nothing may append, apply or purge the shard meanwhile).
    /// The shard's reader stays valid and reads an empty shard.
    pub async fn retire(&self, shard: ShardId) -> io::Result<()> {
        self.purger.settled().await;
        let storage = self.clone();
        tokio::task::spawn_blocking(move || storage.retire_now(shard))
            .await
            .map_err(io::Error::other)?
    }

    fn retire_now(&self, shard: ShardId) -> io::Result<()> {
        self.db
            .insert(retiring_key(shard), &[])
            .map_err(io::Error::other)?;
        self.state_machines.sync()?;
        crate::failpoints::crash_if_fires("retire-mid-delete");
        self.wal.forget(shard)?;
        match self.cached_reader(shard) {
            Some(reader) => {
                reader
                    .tree()
                    .replace_all(std::iter::empty())
                    .map_err(io::Error::other)?;
                reader.reload().map_err(io::Error::other)?;
            }
            None => clear_tree(&self.db, shard)?,
        }
        SnapshotFile::new(&self.dir.join("snapshots"), shard).delete()?;
        self.state_machines.sync()?;
        self.db
            .remove(retiring_key(shard))
            .map_err(io::Error::other)?;
        self.state_machines.sync()?;
        tracing::info!(shard, "retired this node's replica: its state is deleted");
        Ok(())
    }
}

/// Finishes every retirement a crash interrupted, before any shard opens.
pub(super) fn finish_retirements(
    db: &sled::Db,
    dir: &Path,
    wal: &Wal,
    state_machines: &StateMachineDurability,
) -> io::Result<()> {
    let marks: Vec<ShardId> = db
        .scan_prefix(RETIRING_PREFIX)
        .keys()
        .map(|key| key.map_err(io::Error::other))
        .collect::<io::Result<Vec<_>>>()?
        .into_iter()
        .filter_map(|key| {
            let id = key.get(RETIRING_PREFIX.len()..)?;
            Some(ShardId::from_be_bytes(id.try_into().ok()?))
        })
        .collect();
    for shard in marks {
        tracing::warn!(
            shard,
            "finishing the retirement of a replica that a crash interrupted"
        );
        wal.forget(shard)?;
        clear_tree(db, shard)?;
        SnapshotFile::new(&dir.join("snapshots"), shard).delete()?;
        state_machines.sync()?;
        db.remove(retiring_key(shard)).map_err(io::Error::other)?;
        state_machines.sync()?;
    }
    Ok(())
}

fn tree_name(shard: ShardId) -> String {
    format!("shard-{shard}.sm")
}

pub(super) fn retiring_key(shard: ShardId) -> Vec<u8> {
    [RETIRING_PREFIX, &shard.to_be_bytes()].concat()
}

/// Empties the sled tree of `shard` that no state machine has open.
fn clear_tree(db: &sled::Db, shard: ShardId) -> io::Result<()> {
    db.open_tree(tree_name(shard))
        .and_then(|tree| tree.clear())
        .map_err(io::Error::other)
}
