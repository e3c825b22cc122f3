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
//! and range reads merge the two in key order.
//!
//! IMPLEMENTATION CAVEATS
//! - Range reads copy the unwritten changes in their range first; a full
//!   iteration (snapshots, digests) copies all of them (at most about
//!   [`WRITE_OUT_BYTES`]).
//! - A reader on another task may see one write-out half written in sled,
//!   as it could see one apply half written before.

use std::cmp::Ordering;
use std::collections::{BTreeMap, VecDeque};
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use sled::IVec;

use crate::change_set::{ChangeSet, ChangeSetError};

/// Bytes of changes (keys and values, counted as merged) after which an
/// apply writes the unwritten changes out to sled. It bounds the memory
/// they take and how much a restart applies again. 128 KiB measured
/// better than 64 (drain) and 256 (memory with a large backlog).
pub(crate) const WRITE_OUT_BYTES: usize = 128 * 1024;

/// A key and its value as read.
pub(crate) type Pair = (IVec, IVec);

/// A key and its unwritten change (None: deleted).
type Change = (Vec<u8>, Option<Vec<u8>>);

/// sled's pairs in the order a [`Merged`] goes.
type StoredPairs = Box<dyn Iterator<Item = sled::Result<Pair>> + Send>;

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
    /// Bytes merged into `pending` (a key changed twice counts twice).
    pending_bytes: usize,
    /// The changes a write-out in progress is writing: still read from
    /// here until sled has them all (and for good if writing them failed).
    being_written: Option<Arc<ChangeSet>>,
    /// Why a write-out failed: the tree takes no more changes after that.
    failed: Option<String>,
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
        unwritten.pending_bytes += changes.bytes();
        for (key, value) in changes.into_changes() {
            let never_written = value.is_none()
                && matches!(unwritten.pending.pending(&key), Some(Some(_)))
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
        Ok(unwritten.pending_bytes)
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
            unwritten.pending_bytes = 0;
            unwritten.being_written = Some(changes.clone());
            changes
        };
        let written = changes.write(&self.tree);
        let mut unwritten = self.unwritten();
        match &written {
            Ok(()) => unwritten.being_written = None,
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
        *unwritten = Unwritten::default();
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

/// sled's pairs and the unwritten changes over them, merged in key order
/// (or in reverse); unwritten deletions hide sled's pairs.
pub(crate) struct Merged<'t> {
    unwritten: UnwrittenCursor<'t>,
    stored: Peekable<StoredPairs>,
    reverse: bool,
}

impl<'t> Merged<'t> {
    fn new(tree: &'t ShardTree, from: Bound<&[u8]>, to: Bound<&[u8]>, reverse: bool) -> Self {
        let stored: StoredPairs = if is_empty_range(from, to) {
            Box::new(std::iter::empty())
        } else if reverse {
            Box::new(tree.tree.range::<&[u8], _>((from, to)).rev())
        } else {
            Box::new(tree.tree.range::<&[u8], _>((from, to)))
        };
        Self {
            unwritten: UnwrittenCursor::new(tree, from, to, reverse),
            stored: stored.peekable(),
            reverse,
        }
    }
}

/// Unwritten changes fetched in a range a few at a time, so that a reader
/// that wants one pair copies a few changes, not the whole range; each
/// fetch holds the lock for a moment only.
struct UnwrittenCursor<'t> {
    tree: &'t ShardTree,
    /// Where the next fetch begins: the lower bound going forward, the
    /// upper one in reverse.
    resume: Bound<Vec<u8>>,
    /// The range's other bound.
    end: Bound<Vec<u8>>,
    reverse: bool,
    fetched: VecDeque<Change>,
    exhausted: bool,
}

/// Changes fetched from each layer at a time.
const FETCH: usize = 16;

impl<'t> UnwrittenCursor<'t> {
    fn new(tree: &'t ShardTree, from: Bound<&[u8]>, to: Bound<&[u8]>, reverse: bool) -> Self {
        let owned = |bound: Bound<&[u8]>| bound.map(<[u8]>::to_vec);
        let (resume, end) = if reverse { (to, from) } else { (from, to) };
        Self {
            tree,
            resume: owned(resume),
            end: owned(end),
            reverse,
            fetched: VecDeque::new(),
            exhausted: is_empty_range(from, to),
        }
    }

    fn peek(&mut self) -> Option<&Change> {
        if self.fetched.is_empty() && !self.exhausted {
            self.fetch();
        }
        self.fetched.front()
    }

    fn next(&mut self) -> Option<Change> {
        self.peek();
        self.fetched.pop_front()
    }

    /// Takes up to [`FETCH`] changes of each layer past `resume`, and keeps
    /// those that no change left behind in a layer can precede.
    fn fetch(&mut self) {
        let (from, to) = if self.reverse {
            (as_ref(&self.end), as_ref(&self.resume))
        } else {
            (as_ref(&self.resume), as_ref(&self.end))
        };
        if is_empty_range(from, to) {
            self.exhausted = true;
            return;
        }
        let reverse = self.reverse;
        let mut merged = BTreeMap::new();
        let mut limit: Option<Vec<u8>> = None;
        {
            let unwritten = self.tree.unwritten();
            let layers = [unwritten.being_written.as_deref(), Some(&unwritten.pending)];
            for layer in layers.into_iter().flatten() {
                let range = layer.range(from, to);
                let taken: Vec<_> = if reverse {
                    range.rev().take(FETCH).collect()
                } else {
                    range.take(FETCH).collect()
                };
                if let Some((last, _)) = taken.last().filter(|_| taken.len() == FETCH)
                    && limit
                        .as_deref()
                        .is_none_or(|limit| order(last, limit, reverse) == Ordering::Less)
                {
                    limit = Some(last.to_vec());
                }
                for (key, value) in taken {
                    merged.insert(key.to_vec(), value.map(<[u8]>::to_vec));
                }
            }
        }
        let mut changes: Vec<Change> = merged.into_iter().collect();
        if reverse {
            changes.reverse();
        }
        if let Some(limit) = &limit {
            changes.retain(|(key, _)| order(key, limit, reverse) != Ordering::Greater);
        } else {
            self.exhausted = true;
        }
        if let Some((last, _)) = changes.last() {
            self.resume = Bound::Excluded(last.clone());
        }
        self.fetched.extend(changes);
    }
}

fn as_ref(bound: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    bound.as_ref().map(Vec::as_slice)
}

/// Whether `a` comes before `b` in key order, or in reverse.
fn order(a: &[u8], b: &[u8], reverse: bool) -> Ordering {
    if reverse { b.cmp(a) } else { a.cmp(b) }
}

/// Whether no key lies in `(from, to)` (a range map ranges refuse).
fn is_empty_range(from: Bound<&[u8]>, to: Bound<&[u8]>) -> bool {
    match (from, to) {
        (Bound::Included(from), Bound::Included(to)) => from > to,
        (Bound::Included(from) | Bound::Excluded(from), Bound::Excluded(to))
        | (Bound::Excluded(from), Bound::Included(to)) => from >= to,
        _ => false,
    }
}

impl Iterator for Merged<'_> {
    type Item = sled::Result<Pair>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let stored_key = match self.stored.peek() {
                Some(Ok((key, _))) => Some(key.clone()),
                Some(Err(_)) => return self.stored.next(),
                None => None,
            };
            let reverse = self.reverse;
            let unwritten_first = match (&stored_key, self.unwritten.peek()) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(stored), Some((key, _))) => match order(key, stored, reverse) {
                    Ordering::Less => true,
                    Ordering::Equal => {
                        self.stored.next();
                        true
                    }
                    Ordering::Greater => false,
                },
            };
            if !unwritten_first {
                return self.stored.next();
            }
            let (key, value) = self.unwritten.next().expect("peeked above");
            if let Some(value) = value {
                return Some(Ok((IVec::from(key), IVec::from(value))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree_with(stored: &[(&str, &str)]) -> (tempfile::TempDir, ShardTree) {
        let dir = tempfile::tempdir().unwrap();
        let tree = sled::open(dir.path()).unwrap().open_tree("t").unwrap();
        for (key, value) in stored {
            tree.insert(key.as_bytes(), value.as_bytes()).unwrap();
        }
        (dir, ShardTree::open(tree).unwrap().0)
    }

    fn changes(set: &[(&str, Option<&str>)]) -> ChangeSet {
        let mut changes = ChangeSet::default();
        for (key, value) in set {
            match value {
                Some(value) => changes.insert(key.as_bytes().to_vec(), value.as_bytes().to_vec()),
                None => changes.remove(key.as_bytes().to_vec()),
            }
        }
        changes
    }

    fn listed(items: impl Iterator<Item = sled::Result<Pair>>) -> Vec<(String, String)> {
        items
            .map(|item| {
                let (key, value) = item.unwrap();
                (
                    String::from_utf8(key.to_vec()).unwrap(),
                    String::from_utf8(value.to_vec()).unwrap(),
                )
            })
            .collect()
    }

    fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
        expected
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn unwritten_change_hides_the_stored_value_until_written_out() {
        let (_dir, tree) = tree_with(&[("a", "old"), ("b", "kept")]);
        tree.apply(changes(&[("a", Some("new")), ("b", None)]))
            .unwrap();
        assert_eq!(tree.get(b"a").unwrap().unwrap().as_ref(), b"new");
        assert_eq!(tree.get(b"b").unwrap(), None);
        assert_eq!(tree.tree.get(b"a").unwrap().unwrap().as_ref(), b"old");
        tree.write_out().unwrap();
        assert_eq!(tree.tree.get(b"a").unwrap().unwrap().as_ref(), b"new");
        assert_eq!(tree.tree.get(b"b").unwrap(), None);
        assert_eq!(tree.get(b"a").unwrap().unwrap().as_ref(), b"new");
    }

    #[test]
    fn message_produced_and_acked_between_write_outs_never_reaches_sled() {
        let (_dir, tree) = tree_with(&[]);
        tree.apply(changes(&[("m1", Some("run"))])).unwrap();
        tree.apply(changes(&[("m1", None)])).unwrap();
        assert!(
            tree.unwritten().pending.is_empty(),
            "no deletion is kept for a key sled never had"
        );
        tree.write_out().unwrap();
        assert_eq!(tree.tree.len(), 0);
        assert_eq!(tree.get(b"m1").unwrap(), None);
    }

    #[test]
    fn ranges_merge_unwritten_changes_with_stored_pairs_both_ways() {
        let (_dir, tree) = tree_with(&[("a", "1"), ("c", "3"), ("e", "5"), ("g", "7")]);
        tree.apply(changes(&[
            ("b", Some("2")),
            ("c", None),
            ("e", Some("five")),
            ("h", Some("8")),
        ]))
        .unwrap();
        assert_eq!(
            listed(tree.iter()),
            pairs(&[
                ("a", "1"),
                ("b", "2"),
                ("e", "five"),
                ("g", "7"),
                ("h", "8")
            ])
        );
        assert_eq!(
            listed(tree.range(Bound::Excluded(b"a"), Bound::Included(b"g"))),
            pairs(&[("b", "2"), ("e", "five"), ("g", "7")])
        );
        let last = |from: &str, to: &str| {
            tree.last_in(from.as_bytes(), to.as_bytes())
                .unwrap()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
        };
        assert_eq!(last("a", "d"), Some((b"b".to_vec(), b"2".to_vec())));
        assert_eq!(
            last("c", "d"),
            None,
            "a deleted stored key must not come back"
        );
        assert_eq!(last("a", "z"), Some((b"h".to_vec(), b"8".to_vec())));
    }

    #[test]
    fn prefix_scan_stops_at_the_prefix_end() {
        let (_dir, tree) = tree_with(&[("pa", "1"), ("q", "x")]);
        tree.apply(changes(&[("pb", Some("2")), ("r", Some("y"))]))
            .unwrap();
        assert_eq!(
            listed(tree.scan_prefix(b"p")),
            pairs(&[("pa", "1"), ("pb", "2")])
        );
    }

    #[test]
    fn changes_applied_after_a_write_out_go_into_the_next() {
        let (_dir, tree) = tree_with(&[]);
        tree.apply(changes(&[("a", Some("1"))])).unwrap();
        tree.write_out().unwrap();
        tree.apply(changes(&[("a", Some("2")), ("b", Some("3"))]))
            .unwrap();
        assert_eq!(tree.get(b"a").unwrap().unwrap().as_ref(), b"2");
        tree.write_out().unwrap();
        assert_eq!(tree.tree.get(b"a").unwrap().unwrap().as_ref(), b"2");
        assert_eq!(tree.tree.get(b"b").unwrap().unwrap().as_ref(), b"3");
    }

    #[test]
    fn snapshot_install_drops_unwritten_changes() {
        let (_dir, tree) = tree_with(&[("old", "1")]);
        tree.apply(changes(&[("gone", Some("2"))])).unwrap();
        tree.replace_all([(b"new".to_vec(), b"3".to_vec())])
            .unwrap();
        assert_eq!(listed(tree.iter()), pairs(&[("new", "3")]));
        tree.write_out().unwrap();
        assert_eq!(listed(tree.iter()), pairs(&[("new", "3")]));
    }

    #[test]
    fn long_ranges_over_both_layers_read_like_one_map() {
        let key = |n: u32| format!("k{n:03}");
        let stored: Vec<(String, String)> =
            (0..100).step_by(2).map(|n| (key(n), "s".into())).collect();
        let stored_refs: Vec<(&str, &str)> = stored
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let (_dir, tree) = tree_with(&stored_refs);
        let mut model: BTreeMap<String, String> = stored.iter().cloned().collect();
        let mut being_written = ChangeSet::default();
        for n in (0..100).filter(|n| n % 5 == 0) {
            being_written.insert(key(n).into_bytes(), b"w".to_vec());
            model.insert(key(n), "w".into());
        }
        tree.unwritten().being_written = Some(Arc::new(being_written));
        let mut pending = ChangeSet::default();
        for n in 0..100 {
            if n % 3 == 0 {
                pending.remove(key(n).into_bytes());
                model.remove(&key(n));
            } else if n % 2 == 1 {
                pending.insert(key(n).into_bytes(), b"p".to_vec());
                model.insert(key(n), "p".into());
            }
        }
        tree.unwritten().pending = pending;
        let expected: Vec<(String, String)> = model.into_iter().collect();
        assert_eq!(listed(tree.iter()), expected);
        let mut reversed = expected.clone();
        reversed.reverse();
        let backwards = Merged::new(&tree, Bound::Unbounded, Bound::Unbounded, true);
        assert_eq!(listed(backwards), reversed);
        let (from, to) = (key(17), key(83));
        let within: Vec<_> = expected
            .iter()
            .filter(|(k, _)| *k >= from && *k <= to)
            .cloned()
            .collect();
        let range = tree.range(
            Bound::Included(from.as_bytes()),
            Bound::Included(to.as_bytes()),
        );
        assert_eq!(listed(range), within);
        let last = tree
            .last_in(from.as_bytes(), to.as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(last.0.as_ref(), within.last().unwrap().0.as_bytes());
    }
}
