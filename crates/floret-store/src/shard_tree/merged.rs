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
///
/// sled's iterator keeps the page it loaded. A write-out that completes
/// while the read goes on moves changes the read has not fetched yet out of
/// the unwritten layers and into sled, but not into that kept page: the
/// sled side is then loaded again from the last key passed.
pub(crate) struct Merged<'t> {
    tree: &'t ShardTree,
    /// The range's bounds, to load the sled side again.
    from: Bound<Vec<u8>>,
    to: Bound<Vec<u8>>,
    unwritten: UnwrittenCursor<'t>,
    stored: Peekable<StoredPairs>,
    /// The tree's `moved_to_sled` when `stored` began.
    stored_since: u64,
    /// The last key the read went past, yielded or hidden.
    passed: Option<IVec>,
    reverse: bool,
}

impl<'t> Merged<'t> {
    pub(super) fn new(
        tree: &'t ShardTree,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        reverse: bool,
    ) -> Self {
        let unwritten = UnwrittenCursor::new(tree, from, to, reverse);
        Self {
            tree,
            from: from.map(<[u8]>::to_vec),
            to: to.map(<[u8]>::to_vec),
            stored: stored_pairs(tree, from, to, reverse).peekable(),
            stored_since: unwritten.moved_to_sled,
            unwritten,
            passed: None,
            reverse,
        }
    }

    /// Loads the sled side again past the last key passed, once a fetch of
    /// the unwritten side has seen changes move to sled since it began.
    fn reload_stored_if_overtaken(&mut self) {
        if self.unwritten.moved_to_sled == self.stored_since {
            return;
        }
        let passed = self.passed.as_deref().map(Bound::Excluded);
        let (from, to) = if self.reverse {
            (as_ref(&self.from), passed.unwrap_or(as_ref(&self.to)))
        } else {
            (passed.unwrap_or(as_ref(&self.from)), as_ref(&self.to))
        };
        self.stored = stored_pairs(self.tree, from, to, self.reverse).peekable();
        self.stored_since = self.unwritten.moved_to_sled;
    }
}

/// sled's pairs in `(from, to)`, in key order or in reverse.
fn stored_pairs(
    tree: &ShardTree,
    from: Bound<&[u8]>,
    to: Bound<&[u8]>,
    reverse: bool,
) -> StoredPairs {
    if is_empty_range(from, to) {
        Box::new(std::iter::empty())
    } else if reverse {
        Box::new(tree.tree.range::<&[u8], _>((from, to)).rev())
    } else {
        Box::new(tree.tree.range::<&[u8], _>((from, to)))
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
    /// The tree's `moved_to_sled` at the last fetch.
    moved_to_sled: u64,
}

/// Changes fetched from each layer at a time.
const FETCH: usize = 16;

impl<'t> UnwrittenCursor<'t> {
    /// Makes the first fetch at once, with the bounds borrowed: a range
    /// with no unwritten change (the usual read) copies nothing.
    fn new(tree: &'t ShardTree, from: Bound<&[u8]>, to: Bound<&[u8]>, reverse: bool) -> Self {
        let (changes, more, moved_to_sled) = fetch(tree, from, to, reverse);
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
            moved_to_sled,
        }
    }

    fn peek(&mut self) -> Option<&Change> {
        if self.fetched.is_empty() && !self.exhausted {
            let (from, to) = if self.reverse {
                (as_ref(&self.end), as_ref(&self.resume))
            } else {
                (as_ref(&self.resume), as_ref(&self.end))
            };
            let (changes, more, moved_to_sled) = fetch(self.tree, from, to, self.reverse);
            self.exhausted = !more;
            self.moved_to_sled = moved_to_sled;
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
/// can precede; true in the second field when changes may be left, and
/// the tree's `moved_to_sled` as they were taken in the third.
fn fetch(
    tree: &ShardTree,
    from: Bound<&[u8]>,
    to: Bound<&[u8]>,
    reverse: bool,
) -> (Vec<Change>, bool, u64) {
    let mut merged = BTreeMap::new();
    let mut limit: Option<Vec<u8>> = None;
    let moved_to_sled;
    {
        let unwritten = tree.unwritten();
        moved_to_sled = unwritten.moved_to_sled;
        if is_empty_range(from, to) {
            return (Vec::new(), false, moved_to_sled);
        }
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
    (changes, more, moved_to_sled)
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
            self.unwritten.peek();
            self.reload_stored_if_overtaken();
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
                self.passed = stored_key;
                return self.stored.next();
            }
            let (key, value) = self.unwritten.next().expect("peeked above");
            let key = IVec::from(key);
            self.passed = Some(key.clone());
            if let Some(value) = value {
                return Some(Ok((key, IVec::from(value))));
            }
        }
    }
}
