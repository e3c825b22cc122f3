//! Range reads of a [`ShardTree`]: sled's pairs and the unwritten changes
//! over them, merged in key order or in reverse, the unwritten side
//! fetched a few changes at a time.

use std::cmp::Ordering;
use std::collections::{BTreeMap, VecDeque};
use std::iter::Peekable;
use std::ops::Bound;

use sled::IVec;

use super::{Change, Pair, ShardTree};

/// sled's pairs in the order a [`Merged`] goes.
type StoredPairs = Box<dyn Iterator<Item = sled::Result<Pair>> + Send>;

/// sled's pairs and the unwritten changes over them, merged in key order
/// (or in reverse); unwritten deletions hide sled's pairs.
pub(crate) struct Merged<'t> {
    unwritten: UnwrittenCursor<'t>,
    stored: Peekable<StoredPairs>,
    reverse: bool,
}

impl<'t> Merged<'t> {
    pub(super) fn new(
        tree: &'t ShardTree,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        reverse: bool,
    ) -> Self {
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
    /// Makes the first fetch at once, with the bounds borrowed: a range
    /// with no unwritten change (the usual read) copies nothing.
    fn new(tree: &'t ShardTree, from: Bound<&[u8]>, to: Bound<&[u8]>, reverse: bool) -> Self {
        let (changes, more) = fetch(tree, from, to, reverse);
        let owned = |bound: Bound<&[u8]>| bound.map(<[u8]>::to_vec);
        let (resume, end) = match changes.last() {
            Some((last, _)) if more => {
                let end = if reverse { from } else { to };
                (Bound::Excluded(last.clone()), owned(end))
            }
            _ => (Bound::Unbounded, Bound::Unbounded),
        };
        Self {
            tree,
            resume,
            end,
            reverse,
            fetched: changes.into(),
            exhausted: !more,
        }
    }

    fn peek(&mut self) -> Option<&Change> {
        if self.fetched.is_empty() && !self.exhausted {
            let (from, to) = if self.reverse {
                (as_ref(&self.end), as_ref(&self.resume))
            } else {
                (as_ref(&self.resume), as_ref(&self.end))
            };
            let (changes, more) = fetch(self.tree, from, to, self.reverse);
            self.exhausted = !more;
            if let Some((last, _)) = changes.last() {
                self.resume = Bound::Excluded(last.clone());
            }
            self.fetched.extend(changes);
        }
        self.fetched.front()
    }

    fn next(&mut self) -> Option<Change> {
        self.peek();
        self.fetched.pop_front()
    }
}

/// Takes up to [`FETCH`] changes of each layer in `(from, to)`, in the
/// cursor's order, and keeps those that no change left behind in a layer
/// can precede; true in the second field when changes may be left.
fn fetch(
    tree: &ShardTree,
    from: Bound<&[u8]>,
    to: Bound<&[u8]>,
    reverse: bool,
) -> (Vec<Change>, bool) {
    if is_empty_range(from, to) {
        return (Vec::new(), false);
    }
    let mut merged = BTreeMap::new();
    let mut limit: Option<Vec<u8>> = None;
    {
        let unwritten = tree.unwritten();
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
    let more = limit.is_some();
    if let Some(limit) = &limit {
        changes.retain(|(key, _)| order(key, limit, reverse) != Ordering::Greater);
    }
    (changes, more)
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
