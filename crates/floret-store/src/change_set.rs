//! Crash-atomic writes to a state-machine tree without sled's atomic batch:
//! how a shard's applied changes are written out to sled (`shard_tree/`).
//!
//! sled 0.34 rolls its IO buffer twice for every `apply_batch` or
//! transaction (`pin_log` marks where the batch starts and ends): two buffer
//! writes, a `sync_file_range` and hand-offs to its IO threads. When every
//! raft apply was written this way, that fixed cost, not the inserts, was
//! most of a small apply. A [`ChangeSet`] gets the same all-or-nothing outcome
//! with plain writes, which sled only buffers:
//!
//! 1. the whole change set is stored as one redo record ([`keys::REDO`]),
//! 2. each change is written,
//! 3. the redo record is removed.
//!
//! sled recovers a prefix of its log after a crash, so a crash leaves either
//! no redo record and none of the changes, a redo record and some of them,
//! or all of them. [`ChangeSet::recover`] (run when the tree is opened)
//! writes a redo record left behind again, completing the set. The raft log,
//! not sled, makes an apply durable; this only keeps a replica's state whole.
//!
//! A set larger than [`MAX_REDO_BYTES`] goes through sled's atomic batch
//! instead: sled stores a value that large as a file of its own, which costs
//! more than the two buffer rolls, and beside that many inserts the rolls are
//! cheap.
//!
//! IMPLEMENTATION CAVEATS
//! - Readers on other tasks can see a set half written (a message before its
//!   producer record); the dispatcher reads only what an applied event named,
//!   and digests are compared only between replicas at rest.
//! - Every value is written twice (in the redo record and on its own key).

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::keys;
use crate::records::{DecodeError, decode, encode};

/// Most bytes of keys and values a change set may hold to be written
/// through a redo record: with its framing the record stays well below
/// sled's 128 KiB threshold for storing a value as a separate blob file.
pub(crate) const MAX_REDO_BYTES: usize = 64 * 1024;

/// Each key's last change: a new value, or None to delete it. The redo
/// record is this map encoded.
type Changes = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// Changes to one tree, applied in key order; the last change of a key wins.
#[derive(Debug, Default)]
pub(crate) struct ChangeSet {
    changes: Changes,
    /// Bytes of the keys and values `changes` holds, kept as they change.
    bytes: usize,
}

/// What stopped a change set from being written or recovered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangeSetError {
    #[error(transparent)]
    Sled(#[from] sled::Error),
    #[error("the redo record of an interrupted apply is unreadable: {0}")]
    Redo(#[from] DecodeError),
    #[error("an earlier write of applied changes to the state machine failed: {0}")]
    EarlierWriteFailed(String),
}

impl ChangeSet {
    /// Sets `key` to `value`.
    pub(crate) fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.set(key, Some(value));
    }

    /// Deletes `key`.
    pub(crate) fn remove(&mut self, key: Vec<u8>) {
        self.set(key, None);
    }

    /// What this set does to `key`: `Some(Some(value))` writes it,
    /// `Some(None)` deletes it, `None` leaves it alone.
    pub(crate) fn pending(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.changes.get(key).map(Option::as_deref)
    }

    /// Sets `key` to `value`, or deletes it when `value` is None.
    pub(crate) fn set(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        let added = change_bytes(&key, &value);
        let key_len = key.len();
        let replaced = self
            .changes
            .insert(key, value)
            .map_or(0, |previous| key_len + previous.map_or(0, |v| v.len()));
        self.bytes = self.bytes + added - replaced;
    }

    /// Drops whatever this set does to `key`.
    pub(crate) fn forget(&mut self, key: &[u8]) {
        if let Some(previous) = self.changes.remove(key) {
            self.bytes -= change_bytes(key, &previous);
        }
    }

    /// Every change, in key order.
    pub(crate) fn into_changes(self) -> impl Iterator<Item = (Vec<u8>, Option<Vec<u8>>)> {
        self.changes.into_iter()
    }

    /// Whether the set changes nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Bytes of its keys and values: a lower bound of its redo record's
    /// size, known without encoding it.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The changes to keys in `(from, to)`, in key order.
    pub(crate) fn range<'s>(
        &'s self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
    ) -> impl DoubleEndedIterator<Item = (&'s [u8], Option<&'s [u8]>)> + use<'s> {
        self.changes
            .range::<[u8], _>((from, to))
            .map(|(key, value)| (key.as_slice(), value.as_deref()))
    }

    /// Writes every change to `tree` so that a crash keeps all or none.
    pub(crate) fn write(&self, tree: &sled::Tree) -> Result<(), ChangeSetError> {
        if self.bytes() > MAX_REDO_BYTES {
            let mut batch = sled::Batch::default();
            for (key, value) in &self.changes {
                match value {
                    Some(value) => batch.insert(key.as_slice(), value.as_slice()),
                    None => batch.remove(key.as_slice()),
                }
            }
            tree.apply_batch(batch)?;
            return Ok(());
        }
        tree.insert(keys::REDO, encode(&self.changes))?;
        apply(&self.changes, tree)?;
        tree.remove(keys::REDO)?;
        Ok(())
    }

    /// Completes a change set a crash interrupted, if there is one; true
    /// when it did.
    pub(crate) fn recover(tree: &sled::Tree) -> Result<bool, ChangeSetError> {
        let Some(redo) = tree.get(keys::REDO)? else {
            return Ok(false);
        };
        let changes: Changes = decode("redo record", &redo)?;
        apply(&changes, tree)?;
        tree.remove(keys::REDO)?;
        Ok(true)
    }
}

/// Bytes a change of `key` counts: the key and the new value, if any.
fn change_bytes(key: &[u8], value: &Option<Vec<u8>>) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len)
}

/// Writes each change to `tree`, in key order.
fn apply(changes: &Changes, tree: &sled::Tree) -> Result<(), sled::Error> {
    for (key, value) in changes {
        match value {
            Some(value) => tree.insert(key, value.as_slice())?,
            None => tree.remove(key)?,
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens the database again once sled's background flusher, which
    /// outlives the dropped handle for a moment, has let go of its lock.
    fn reopen(path: &std::path::Path) -> sled::Db {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match sled::open(path) {
                Ok(db) => return db,
                Err(error) if std::time::Instant::now() > deadline => {
                    panic!("the database stays locked: {error}")
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
    }

    fn change_set() -> ChangeSet {
        let mut changes = ChangeSet::default();
        changes.insert(b"a".to_vec(), b"1".to_vec());
        changes.insert(b"b".to_vec(), b"2".to_vec());
        changes.remove(b"old".to_vec());
        changes
    }

    #[test]
    fn pending_changes_are_visible_before_the_write() {
        let changes = change_set();
        assert_eq!(changes.pending(b"a"), Some(Some(b"1".as_slice())));
        assert_eq!(changes.pending(b"old"), Some(None));
        assert_eq!(changes.pending(b"z"), None);
    }

    #[test]
    fn written_set_leaves_no_redo_record() {
        let dir = tempfile::tempdir().unwrap();
        let tree = sled::open(dir.path()).unwrap().open_tree("t").unwrap();
        tree.insert(b"old", b"x".as_slice()).unwrap();
        change_set().write(&tree).unwrap();
        assert_eq!(tree.get(b"a").unwrap().unwrap().as_ref(), b"1");
        assert_eq!(tree.get(b"old").unwrap(), None);
        assert_eq!(tree.get(keys::REDO).unwrap(), None);
        assert!(!ChangeSet::recover(&tree).unwrap());
    }

    #[test]
    fn set_too_large_for_a_redo_record_is_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let tree = sled::open(dir.path()).unwrap().open_tree("t").unwrap();
        let mut changes = ChangeSet::default();
        for index in 0u32..1_000 {
            changes.insert(index.to_be_bytes().to_vec(), vec![7; 128]);
        }
        assert!(encode(&changes.changes).len() > MAX_REDO_BYTES);
        assert!(changes.bytes() > MAX_REDO_BYTES);
        changes.write(&tree).unwrap();
        assert_eq!(tree.len(), 1_000);
        assert_eq!(tree.get(keys::REDO).unwrap(), None);
    }

    #[test]
    fn set_interrupted_after_its_redo_record_is_completed_on_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::open(dir.path()).unwrap();
            let tree = db.open_tree("t").unwrap();
            tree.insert(b"old", b"x".as_slice()).unwrap();
            let changes = change_set();
            tree.insert(keys::REDO, encode(&changes.changes)).unwrap();
            tree.insert(b"a", b"1".as_slice()).unwrap();
            db.flush().unwrap();
        }
        let db = reopen(dir.path());
        let tree = db.open_tree("t").unwrap();
        assert!(ChangeSet::recover(&tree).unwrap());
        assert_eq!(tree.get(b"a").unwrap().unwrap().as_ref(), b"1");
        assert_eq!(tree.get(b"b").unwrap().unwrap().as_ref(), b"2");
        assert_eq!(tree.get(b"old").unwrap(), None);
        assert_eq!(tree.get(keys::REDO).unwrap(), None);
    }
}
