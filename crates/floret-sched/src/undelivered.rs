//! The never-delivered sequences of one producer.
//!
//! Normally one run `cursor..tail`. Sequences are committed in increasing
//! order but not always densely (a rejected or dropped message leaves a hole),
//! so a range announced past the tail starts a new run and the cursor jumps the
//! hole when it gets there. Memory is one `Range` per hole still ahead of the
//! cursor, never one entry per message.

use std::collections::VecDeque;
use std::ops::Range;

/// First-delivery queue of one producer, in sequence order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Undelivered {
    /// Disjoint, increasing, non-empty runs; the front run starts at the cursor.
    runs: VecDeque<Range<u64>>,
    /// One past the highest sequence ever announced.
    tail: u64,
    /// Sum of the run lengths.
    len: u64,
}

impl Undelivered {
    /// An empty queue whose first announced range may start anywhere.
    pub(crate) fn new() -> Self {
        Self {
            runs: VecDeque::new(),
            tail: 0,
            len: 0,
        }
    }

    /// Adds the part of `range` beyond the tail; returns how many sequences
    /// became deliverable.
    pub(crate) fn extend(&mut self, range: Range<u64>) -> u64 {
        let start = range.start.max(self.tail);
        if start >= range.end {
            return 0;
        }
        match self.runs.back_mut() {
            Some(last) if last.end == start => last.end = range.end,
            _ => self.runs.push_back(start..range.end),
        }
        let added = range.end - start;
        self.tail = range.end;
        self.len += added;
        added
    }

    /// Takes the lowest never-delivered sequence.
    pub(crate) fn pop(&mut self) -> Option<u64> {
        let run = self.runs.front_mut()?;
        let sequence = run.start;
        run.start += 1;
        if run.is_empty() {
            self.runs.pop_front();
        }
        self.len -= 1;
        Some(sequence)
    }

    /// Drops every sequence below `below`; returns how many there were.
    pub(crate) fn drop_before(&mut self, below: u64) -> u64 {
        let mut dropped = 0;
        while let Some(run) = self.runs.front_mut() {
            if run.start >= below {
                break;
            }
            let end = run.end.min(below);
            dropped += end - run.start;
            run.start = end;
            if run.is_empty() {
                self.runs.pop_front();
            }
        }
        self.len -= dropped;
        dropped
    }

    /// Number of never-delivered sequences.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(queue: &mut Undelivered) -> Vec<u64> {
        std::iter::from_fn(|| queue.pop()).collect()
    }

    #[test]
    fn dropping_below_a_sequence_skips_runs_and_holes() {
        let mut queue = Undelivered::new();
        queue.extend(0..3);
        queue.extend(5..8);
        assert_eq!(queue.drop_before(6), 4);
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.drop_before(2), 0);
        assert_eq!(drain(&mut queue), [6, 7]);
    }

    #[test]
    fn first_range_may_start_anywhere() {
        let mut queue = Undelivered::new();
        assert_eq!(queue.extend(7..10), 3);
        assert_eq!(drain(&mut queue), [7, 8, 9]);
    }

    #[test]
    fn overlapping_range_only_extends_the_tail() {
        let mut queue = Undelivered::new();
        queue.extend(1..4);
        assert_eq!(queue.pop(), Some(1));
        assert_eq!(queue.extend(2..6), 2);
        assert_eq!(queue.len(), 4);
        assert_eq!(drain(&mut queue), [2, 3, 4, 5]);
    }

    #[test]
    fn range_already_known_adds_nothing() {
        let mut queue = Undelivered::new();
        queue.extend(1..6);
        assert_eq!(queue.extend(2..4), 0);
        assert_eq!(queue.extend(5..5), 0);
        assert_eq!(queue.len(), 5);
    }

    #[test]
    fn hole_is_skipped_without_losing_messages_before_it() {
        let mut queue = Undelivered::new();
        queue.extend(1..3);
        assert_eq!(queue.extend(5..7), 2);
        assert_eq!(queue.len(), 4);
        assert_eq!(drain(&mut queue), [1, 2, 5, 6]);
    }

    #[test]
    fn delivered_tail_is_remembered_after_draining() {
        let mut queue = Undelivered::new();
        queue.extend(1..3);
        drain(&mut queue);
        assert_eq!(queue.extend(1..4), 1);
        assert_eq!(drain(&mut queue), [3]);
    }
}
