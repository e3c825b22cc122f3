//! One shard's state-machine tree: its sled tree plus the applied changes
//! not yet written to it.
//!
//! The raft log makes an apply durable, not sled: after a crash openraft
//! applies again from the last applied id sled holds. So an apply need not
//! reach sled at once. Each apply's [`ChangeSet`] is merged into an
//! in-memory set of unwritten changes, and that set is written to sled as
//! one change set (crash-atomic, see `change_set.rs`) by the apply that
//! takes it past [`WRITE_OUT_BYTES`], or when the node makes its state
//! machines durable before purging the log behind them (`durability.rs`).
//! While a sync writes out, applies go on into a fresh set. A message produced
//! and acked between two write-outs never reaches sled, and the applied
//! state, producer records and segment counts are written once per
//! write-out instead of once per apply: writing every apply to sled was the
//! largest cost of a small apply and half of a node's disk writes at one
//! message per call.
//!
//! Every read goes through here: a key's unwritten change wins over sled,
//! and range reads merge the two in key order (`merged.rs`).
//!
//! IMPLEMENTATION CAVEATS
//! - Range reads copy the unwritten changes in their range first; a full
//!   iteration (snapshots, digests) copies all of them (at most about
//!   [`WRITE_OUT_BYTES`]).
//! - A reader on another task may see one write-out half written in sled,
//!   as it could see one apply half written before.
//! - sled's iterators keep the page they loaded. A range read that a
//!   write-out overtakes loads its sled side again from where it stands
//!   (`merged.rs`), or it would read that page's values from before the
//!   write-out once the changes have left the unwritten layers.

mod merged;
#[cfg(test)]
mod tests;

use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use sled::IVec;

use crate::change_set::{ChangeSet, ChangeSetError};

pub(crate) use merged::Merged;

/// Bytes of unwritten changes (keys and values held) after which an apply
/// writes them out to sled. It bounds the memory they take. 128 KiB
/// measured better than 64 (drain) and 256 (memory with a large backlog).
/// Messages produced and acked between write-outs do not count, so at a
/// steady state the unwritten changes reach sled mostly when the log is
/// about to be purged behind them.
pub(crate) const WRITE_OUT_BYTES: usize = 128 * 1024;

/// A key and its value as read.
pub(crate) type Pair = (IVec, IVec);

/// A key and its unwritten change (None: deleted).
type Change = (Vec<u8>, Option<Vec<u8>>);

/// A shard's sled tree behind its unwritten changes.
pub(crate) struct ShardTree {
    tree: sled::Tree,
    unwritten: Mutex<Unwritten>,
    /// Held for a whole write-out, so write-outs and snapshot installs
    /// follow one another.
    writing_out: Mutex<()>,
}

#[derive(Default)]
struct Unwritten {
    /// Changes applied since the last write-out began.
    pending: ChangeSet,
    /// The changes a write-out in progress is writing: still read from
    /// here until sled has them all (and for good if writing them failed).
    being_written: Option<Arc<ChangeSet>>,
    /// Why a write-out failed: the tree takes no more changes after that.
    failed: Option<String>,
    /// Bumped whenever changes leave these layers for sled (a write-out
    /// completed, an install): a range read whose sled iterator loaded its
    /// page before then must load it again (`merged.rs`).
    moved_to_sled: u64,
}

impl ShardTree {
    /// Wraps `tree`, first completing a change set a crash interrupted;
    /// true in the second field when there was one.
    pub(crate) fn open(tree: sled::Tree) -> Result<(Self, bool), ChangeSetError> {
        let completed = ChangeSet::recover(&tree)?;
        Ok((
            Self {
                tree,
                unwritten: Mutex::default(),
                writing_out: Mutex::new(()),
            },
            completed,
        ))
    }

    fn unwritten(&self) -> MutexGuard<'_, Unwritten> {
        self.unwritten
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The value of `key`: its unwritten change if it has one, else sled's.
    pub(crate) fn get(&self, key: impl AsRef<[u8]>) -> sled::Result<Option<IVec>> {
        let key = key.as_ref();
        {
            let unwritten = self.unwritten();
            let layers = [Some(&unwritten.pending), unwritten.being_written.as_deref()];
            for layer in layers.into_iter().flatten() {
                if let Some(change) = layer.pending(key) {
                    return Ok(change.map(IVec::from));
                }
            }
        }
        self.tree.get(key)
    }

    /// Adds one apply's changes; the unwritten changes' size after it. A
    /// key that this apply deletes and that only the pending changes ever
    /// held (a message produced and acked since the last write-out) is
    /// dropped from them, not kept as a deletion.
    pub(crate) fn apply(&self, changes: ChangeSet) -> Result<usize, ChangeSetError> {
        let mut guard = self.unwritten();
        let unwritten = &mut *guard;
        if let Some(failed) = &unwritten.failed {
            return Err(ChangeSetError::EarlierWriteFailed(failed.clone()));
        }
        for (key, value) in changes.into_changes() {
            let held = unwritten.pending.pending(&key);
            let never_written = value.is_none()
                && matches!(held, Some(Some(_)))
                && unwritten
                    .being_written
                    .as_ref()
                    .is_none_or(|layer| layer.pending(&key).is_none())
                && !self.tree.contains_key(&key)?;
            if never_written {
                unwritten.pending.forget(&key);
            } else {
                unwritten.pending.set(key, value);
            }
        }
        Ok(unwritten.pending.bytes())
    }

    /// The keys the unwritten changes set (true) or delete (false).
    #[cfg(test)]
    pub(crate) fn unwritten_keys(&self) -> Vec<(Vec<u8>, bool)> {
        self.unwritten()
            .pending
            .range(Bound::Unbounded, Bound::Unbounded)
            .map(|(key, value)| (key.to_vec(), value.is_some()))
            .collect()
    }

    /// Writes every change applied so far to sled (which buffers it; a
    /// sync of the database makes it durable). A failure is kept: the
    /// changes stay readable here, and every later apply and write-out
    /// fails with it.
    pub(crate) fn write_out(&self) -> Result<(), ChangeSetError> {
        let _one_at_a_time = self
            .writing_out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let changes = {
            let mut unwritten = self.unwritten();
            if let Some(failed) = &unwritten.failed {
                return Err(ChangeSetError::EarlierWriteFailed(failed.clone()));
            }
            if unwritten.pending.is_empty() {
                return Ok(());
            }
            let changes = Arc::new(std::mem::take(&mut unwritten.pending));
            unwritten.being_written = Some(changes.clone());
            changes
        };
        let written = changes.write(&self.tree);
        let mut unwritten = self.unwritten();
        match &written {
            Ok(()) => {
                unwritten.being_written = None;
                unwritten.moved_to_sled += 1;
            }
            Err(error) => unwritten.failed = Some(error.to_string()),
        }
        written
    }

    /// Replaces the whole tree with `pairs`, dropping the unwritten changes
    /// (a snapshot install).
    pub(crate) fn replace_all(
        &self,
        pairs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
    ) -> sled::Result<()> {
        let _one_at_a_time = self
            .writing_out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut unwritten = self.unwritten();
        *unwritten = Unwritten {
            moved_to_sled: unwritten.moved_to_sled + 1,
            ..Unwritten::default()
        };
        let mut batch = sled::Batch::default();
        for key in self.tree.iter().keys() {
            batch.remove(key?);
        }
        for (key, value) in pairs {
            batch.insert(key, value);
        }
        self.tree.apply_batch(batch)
    }

    /// Pairs with keys in `(from, to)`, in key order.
    pub(crate) fn range(&self, from: Bound<&[u8]>, to: Bound<&[u8]>) -> Merged<'_> {
        Merged::new(self, from, to, false)
    }

    /// Pairs with keys from `from` on, in key order.
    pub(crate) fn range_from(&self, from: &[u8]) -> Merged<'_> {
        self.range(Bound::Included(from), Bound::Unbounded)
    }

    /// Pairs whose keys begin with `prefix`, in key order.
    pub(crate) fn scan_prefix<'p>(
        &self,
        prefix: &'p [u8],
    ) -> impl Iterator<Item = sled::Result<Pair>> + use<'_, 'p> {
        self.range_from(prefix).take_while(move |item| {
            item.as_ref()
                .map_or(true, |(key, _)| key.starts_with(prefix))
        })
    }

    /// Every pair, in key order.
    pub(crate) fn iter(&self) -> Merged<'_> {
        self.range(Bound::Unbounded, Bound::Unbounded)
    }

    /// The pair with the greatest key in `from..=to`.
    pub(crate) fn last_in(&self, from: &[u8], to: &[u8]) -> sled::Result<Option<Pair>> {
        Merged::new(self, Bound::Included(from), Bound::Included(to), true)
            .next()
            .transpose()
    }
}
