//! Where each producer's messages were last found: the stored run that
//! held them, by the producer's message prefix.
//!
//! Acks and the dispatcher's reads ask for the messages at the head of a
//! queue, one after another, and nearly always find them in the run where
//! the one before was. Finding that run in sled (a reverse range read, or
//! a point read and a parse) was the largest cost of an ack.
//!
//! A hint is one of two kinds:
//! - **Held**: the run itself and its removal marks, as the state machine
//!   left them. Only the state machine holds a run, and it keeps the hint
//!   equal to the tree: it updates the marks with every change it commits,
//!   and drops the hint when it deletes the run or forgets the producer, and
//!   every hint when a snapshot replaces the tree. A run never changes once
//!   written, so its bytes stay true while it exists.
//! - **Named**: only the run's first sequence, which a reader leaves when it
//!   found the run itself. It is never trusted: the run is read from the
//!   tree, and used only if it still holds the sequence asked for.
//!
//! Either way, one producer's runs never overlap (each starts at the
//! producer's next sequence), so a run that holds the sequence is the last
//! run at or before it: what the range read would have found.
//!
//! IMPLEMENTATION CAVEATS
//! - At most [`MAX_HINTS`] producers have a hint, and held runs take at
//!   most [`MAX_HELD_BYTES`] per shard; past those a run is named, or
//!   found by a range read.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use sled::IVec;

use super::{Run, RunStoreError};
use crate::keys;
use crate::shard_tree::ShardTree;

/// Most producers with a hint at once, per shard: about 100 bytes each
/// beside a held run.
pub(crate) const MAX_HINTS: usize = 1 << 16;

/// Most bytes of runs held by hints at once, per shard. A packed run of
/// 100 messages is about 700 bytes.
pub(crate) const MAX_HELD_BYTES: usize = 1 << 20;

/// A stored run as a lookup found it.
pub(crate) struct StoredRun {
    pub(crate) key: Vec<u8>,
    pub(crate) run: Run<IVec>,
    /// Its removal marks when a held hint gave them (the inner None: it
    /// has none); None when they must be read from the tree.
    pub(crate) marks: Option<Option<IVec>>,
}

#[derive(Clone)]
struct Hint {
    first: u64,
    held: Option<Held>,
}

#[derive(Clone)]
struct Held {
    run: Run<IVec>,
    marks: Option<IVec>,
}

#[derive(Default)]
struct Hints {
    by_prefix: HashMap<Vec<u8>, Hint>,
    /// Bytes of the runs held.
    held_bytes: usize,
}

impl Hints {
    fn replace(&mut self, prefix: &[u8], hint: Option<Hint>) {
        let held_len = |hint: &Hint| {
            hint.held
                .as_ref()
                .map_or(0, |held| held.run.as_bytes().len())
        };
        let old = match hint {
            Some(hint) => {
                self.held_bytes += held_len(&hint);
                match self.by_prefix.get_mut(prefix) {
                    Some(slot) => Some(std::mem::replace(slot, hint)),
                    None => {
                        self.by_prefix.insert(prefix.to_vec(), hint);
                        None
                    }
                }
            }
            None => self.by_prefix.remove(prefix),
        };
        self.held_bytes -= old.as_ref().map_or(0, held_len);
    }
}

/// The run each producer's messages were last found in, by message prefix.
#[derive(Default)]
pub(crate) struct RunHints {
    hints: Mutex<Hints>,
}

/// A run key's producer prefix and first sequence.
fn split_run_key(run_key: &[u8]) -> Option<(&[u8], u64)> {
    let first = keys::message_sequence(run_key)?;
    Some((&run_key[..run_key.len() - 8], first))
}

impl RunHints {
    fn lock(&self) -> MutexGuard<'_, Hints> {
        self.hints
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn hint(&self, prefix: &[u8]) -> Option<Hint> {
        self.lock().by_prefix.get(prefix).cloned()
    }

    /// Names the run starting at `first` for a reader, unless the producer
    /// has a hint.
    fn name(&self, prefix: &[u8], first: u64) {
        let mut hints = self.lock();
        if hints.by_prefix.len() < MAX_HINTS && !hints.by_prefix.contains_key(prefix) {
            hints.replace(prefix, Some(Hint { first, held: None }));
        }
    }

    /// The state machine holds the stored run at `run_key` with its
    /// `marks`, as it leaves them (only it may: see the module's notes).
    pub(crate) fn hold(&self, run_key: &[u8], run: &Run<IVec>, marks: Option<IVec>) {
        let Some((prefix, first)) = split_run_key(run_key) else {
            return;
        };
        let mut hints = self.lock();
        let held_before = hints
            .by_prefix
            .get(prefix)
            .and_then(|hint| hint.held.as_ref());
        let room = (MAX_HELD_BYTES + held_before.map_or(0, |held| held.run.as_bytes().len()))
            .saturating_sub(hints.held_bytes);
        let held = (run.as_bytes().len() <= room).then(|| Held {
            run: run.clone(),
            marks,
        });
        if hints.by_prefix.len() < MAX_HINTS || hints.by_prefix.contains_key(prefix) {
            hints.replace(prefix, Some(Hint { first, held }));
        }
    }

    /// The state machine changed the marks of the run at `run_key`.
    pub(crate) fn marks_changed(&self, run_key: &[u8], marks: &[u8]) {
        let Some((prefix, first)) = split_run_key(run_key) else {
            return;
        };
        if let Some(hint) = self.lock().by_prefix.get_mut(prefix)
            && hint.first == first
            && let Some(held) = &mut hint.held
        {
            held.marks = Some(IVec::from(marks));
        }
    }

    /// Drops the hint that names the run stored at `run_key`, if one does.
    pub(crate) fn forget_run(&self, run_key: &[u8]) {
        let Some((prefix, first)) = split_run_key(run_key) else {
            return;
        };
        let mut hints = self.lock();
        if hints.by_prefix.get(prefix).map(|hint| hint.first) == Some(first) {
            hints.replace(prefix, None);
        }
    }

    /// Drops the hint of the producer whose message keys begin with `prefix`.
    pub(crate) fn forget_producer(&self, prefix: &[u8]) {
        self.lock().replace(prefix, None);
    }

    /// Drops every hint (the tree was replaced by a snapshot).
    pub(crate) fn clear(&self) {
        *self.lock() = Hints::default();
    }

    /// How many producers have a hint, and the bytes of the runs held.
    #[cfg(test)]
    pub(crate) fn len_and_held_bytes(&self) -> (usize, usize) {
        let hints = self.lock();
        (hints.by_prefix.len(), hints.held_bytes)
    }
}

/// The stored run whose key is the greatest of the producer whose message
/// keys begin with `prefix` at or before message `sequence`'s: the one
/// that may hold it. Tries the producer's hint first, and names the run
/// found when it holds `sequence` and the producer has no hint.
pub(crate) fn last_at_or_before(
    tree: &ShardTree,
    hints: &RunHints,
    prefix: &[u8],
    sequence: u64,
) -> Result<Option<StoredRun>, RunStoreError> {
    let key_of = |first: u64| [prefix, &first.to_be_bytes()].concat();
    let holds =
        |first: u64, run: &Run<IVec>| first <= sequence && sequence - first < run.len() as u64;
    if let Some(hint) = hints.hint(prefix) {
        match hint.held {
            Some(held) if holds(hint.first, &held.run) => {
                return Ok(Some(StoredRun {
                    key: key_of(hint.first),
                    run: held.run,
                    marks: Some(held.marks),
                }));
            }
            Some(_) => {}
            None if hint.first <= sequence => {
                let run_key = key_of(hint.first);
                match tree.get(&run_key)? {
                    Some(bytes) => {
                        let run = Run::parse(bytes)?;
                        if holds(hint.first, &run) {
                            return Ok(Some(StoredRun {
                                key: run_key,
                                run,
                                marks: None,
                            }));
                        }
                    }
                    None => hints.forget_run(&run_key),
                }
            }
            None => {}
        }
    }
    let Some((run_key, bytes)) = tree.last_in(prefix, &key_of(sequence))? else {
        return Ok(None);
    };
    let run = Run::parse(bytes)?;
    let first = keys::message_sequence(&run_key).expect("run keys end with a sequence");
    if holds(first, &run) {
        hints.name(prefix, first);
    }
    Ok(Some(StoredRun {
        key: run_key.to_vec(),
        run,
        marks: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::super::encode;
    use super::*;

    const PREFIX: &[u8] = b"m-queue-producer-";

    fn run_key(first: u64) -> Vec<u8> {
        [PREFIX, &first.to_be_bytes()].concat()
    }

    fn run_of(len: usize) -> Run<IVec> {
        Run::parse(IVec::from(encode(&vec![b"m".to_vec(); len]))).unwrap()
    }

    /// A tree holding runs of `len` one-byte messages starting at each of
    /// `firsts`.
    fn tree_with_runs(firsts: &[(u64, usize)]) -> (tempfile::TempDir, ShardTree) {
        let dir = tempfile::tempdir().unwrap();
        let tree = sled::open(dir.path()).unwrap().open_tree("t").unwrap();
        for &(first, len) in firsts {
            tree.insert(run_key(first), encode(&vec![b"m".to_vec(); len]))
                .unwrap();
        }
        (dir, ShardTree::open(tree).unwrap().0)
    }

    fn found_first(tree: &ShardTree, hints: &RunHints, sequence: u64) -> Option<u64> {
        last_at_or_before(tree, hints, PREFIX, sequence)
            .unwrap()
            .map(|found| keys::message_sequence(&found.key).unwrap())
    }

    fn named(hints: &RunHints) -> Option<u64> {
        hints.hint(PREFIX).map(|hint| hint.first)
    }

    #[test]
    fn a_hint_to_a_run_that_does_not_hold_the_sequence_is_passed_over() {
        let (_dir, tree) = tree_with_runs(&[(0, 10), (10, 5)]);
        let hints = RunHints::default();
        assert_eq!(found_first(&tree, &hints, 3), Some(0));
        assert_eq!(named(&hints), Some(0));
        assert_eq!(
            found_first(&tree, &hints, 12),
            Some(10),
            "the named run ends before 12, so the later run holds it"
        );
        assert_eq!(
            found_first(&tree, &hints, 20),
            Some(10),
            "past every run, the last run is found as a range read finds it"
        );
        hints.hold(&run_key(0), &run_of(10), None);
        assert_eq!(
            found_first(&tree, &hints, 12),
            Some(10),
            "a held run that ends before 12 is passed over too"
        );
    }

    #[test]
    fn a_named_run_that_was_deleted_is_forgotten_and_the_run_after_it_found() {
        let (_dir, tree) = tree_with_runs(&[(0, 10), (10, 5)]);
        let hints = RunHints::default();
        assert_eq!(found_first(&tree, &hints, 9), Some(0));
        let mut deleted = crate::change_set::ChangeSet::default();
        deleted.remove(run_key(0));
        tree.apply(deleted).unwrap();
        assert_eq!(found_first(&tree, &hints, 9), None);
        assert_eq!(named(&hints), None);
        assert_eq!(found_first(&tree, &hints, 11), Some(10));
        hints.forget_run(&run_key(10));
        assert_eq!(hints.len_and_held_bytes(), (0, 0));
    }

    #[test]
    fn a_held_run_gives_its_marks_as_the_state_machine_left_them() {
        let (_dir, tree) = tree_with_runs(&[(0, 10)]);
        let hints = RunHints::default();
        hints.hold(&run_key(0), &run_of(10), None);
        let found = last_at_or_before(&tree, &hints, PREFIX, 4)
            .unwrap()
            .unwrap();
        assert_eq!(found.marks, Some(None));
        hints.marks_changed(&run_key(0), &[0b1]);
        let found = last_at_or_before(&tree, &hints, PREFIX, 4)
            .unwrap()
            .unwrap();
        assert_eq!(found.marks, Some(Some(IVec::from(&[0b1u8][..]))));
        hints.marks_changed(&run_key(10), &[0b11]);
        let found = last_at_or_before(&tree, &hints, PREFIX, 4)
            .unwrap()
            .unwrap();
        assert_eq!(
            found.marks,
            Some(Some(IVec::from(&[0b1u8][..]))),
            "marks of another run leave the held run's alone"
        );
        found_first(&tree, &hints, 4);
        assert!(
            hints.hint(PREFIX).unwrap().held.is_some(),
            "a reader's lookup never replaces what the state machine holds"
        );
        hints.forget_producer(PREFIX);
        assert_eq!(hints.len_and_held_bytes(), (0, 0));
    }

    #[test]
    fn held_runs_stay_under_their_byte_cap_and_hints_under_their_count() {
        let hints = RunHints::default();
        let run = run_of(200);
        let held_each = run.as_bytes().len();
        for producer in 0..MAX_HINTS + 10 {
            let key = [format!("p{producer}-").as_bytes(), &1u64.to_be_bytes()].concat();
            hints.hold(&key, &run, None);
        }
        let (count, held_bytes) = hints.len_and_held_bytes();
        assert_eq!(count, MAX_HINTS);
        assert_eq!(held_bytes, MAX_HELD_BYTES / held_each * held_each);
        let first = [b"p0-".as_slice(), &7u64.to_be_bytes()].concat();
        hints.hold(&first, &run, None);
        assert_eq!(
            hints
                .hint(b"p0-")
                .map(|hint| (hint.first, hint.held.is_some())),
            Some((7, true)),
            "a producer that held a run holds its next in the room the last one leaves"
        );
        assert_eq!(hints.len_and_held_bytes(), (MAX_HINTS, held_bytes));
        hints.clear();
        assert_eq!(hints.len_and_held_bytes(), (0, 0));
    }
}
