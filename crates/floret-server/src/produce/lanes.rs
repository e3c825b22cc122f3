//! The operations waiting for one shard's next raft entry, one line per
//! producer, and how an entry is composed from them: round robin over the
//! producers with operations waiting, so a quiet producer's produce goes
//! into the next entry however many calls a flooding producer has queued.
//!
//! - Operations that settle or govern messages (acks, discards, policies,
//!   dead-letter changes) wait in a line of their own that goes first in
//!   every entry: they free room and keep dispatch moving while produces
//!   flood.
//! - Each producer's line is bounded, by calls and by bytes. A call past
//!   the bound is refused at once ([`LaneFull`]): the flooding producer
//!   waits for its own line to drain, no one else does.
//!
//! This is pure bookkeeping: the shard's proposer (`proposer.rs`) owns one
//! and moves operations through it.
//!
//! IMPLEMENTATION CAVEATS
//! - Lines take turns by operation, not by message or byte: a producer's
//!   100-message produce and another's one-message produce count the same
//!   in an entry (the dispatcher's fairness is by message).
//! - The bound is per shard and per node; a producer has its lines on the
//!   shard's leader only, so it is in effect per producer.

use std::collections::{HashMap, VecDeque};

/// Which line an operation waits in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Settling and governing operations, first in every entry.
    Settle,
    /// One producer's produces: its queue and producer id.
    Producer {
        /// The queue.
        queue: String,
        /// The producer.
        producer: String,
    },
}

/// How large the lines and entries may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneLimits {
    /// Most operations in one entry.
    pub entry_ops: usize,
    /// Bytes after which an entry is closed (a larger operation still goes alone).
    pub entry_bytes: usize,
    /// Most calls one producer may have waiting.
    pub producer_calls: usize,
    /// Most bytes one producer may have waiting (a larger call is still
    /// taken when its line is empty).
    pub producer_bytes: usize,
}

/// A producer's line is full: the call was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneFull {
    /// Calls waiting in the line.
    pub calls: usize,
    /// Bytes waiting in the line.
    pub bytes: usize,
}

#[derive(Debug)]
struct Line<T> {
    waiting: VecDeque<(T, usize)>,
    bytes: usize,
}

impl<T> Default for Line<T> {
    fn default() -> Self {
        Self {
            waiting: VecDeque::new(),
            bytes: 0,
        }
    }
}

/// The waiting operations of one shard, by line.
#[derive(Debug)]
pub struct EntryLanes<T> {
    limits: LaneLimits,
    settles: VecDeque<(T, usize)>,
    producers: HashMap<Lane, Line<T>>,
    /// Producers with operations waiting, in the order they take turns.
    turns: VecDeque<Lane>,
}

impl<T> EntryLanes<T> {
    /// Empty lines under `limits`.
    pub fn new(limits: LaneLimits) -> Self {
        Self {
            limits,
            settles: VecDeque::new(),
            producers: HashMap::new(),
            turns: VecDeque::new(),
        }
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.settles.is_empty() && self.turns.is_empty()
    }

    /// Queues `operation` of `bytes` in `lane`, or hands it back refused
    /// when the producer's line is full. Settling operations are never refused.
    pub fn push(&mut self, lane: Lane, operation: T, bytes: usize) -> Result<(), (T, LaneFull)> {
        if lane == Lane::Settle {
            self.settles.push_back((operation, bytes));
            return Ok(());
        }
        let limits = self.limits;
        let line = self.producers.entry(lane.clone()).or_default();
        let calls = line.waiting.len();
        let over_bytes = calls > 0 && line.bytes + bytes > limits.producer_bytes;
        if calls >= limits.producer_calls || over_bytes {
            let full = LaneFull {
                calls,
                bytes: line.bytes,
            };
            return Err((operation, full));
        }
        if calls == 0 {
            self.turns.push_back(lane);
        }
        line.bytes += bytes;
        line.waiting.push_back((operation, bytes));
        Ok(())
    }

    /// The next entry: every waiting settle first, then one operation per
    /// producer in turn, round after round, until the entry is full. The
    /// producer whose turn the entry ended on goes first in the next one.
    pub fn next_entry(&mut self) -> Vec<T> {
        let mut entry = Vec::new();
        let mut bytes = 0;
        let full = |entry: &Vec<T>, bytes: usize| {
            entry.len() >= self.limits.entry_ops || bytes >= self.limits.entry_bytes
        };
        while !full(&entry, bytes) {
            let Some((operation, size)) = self.settles.pop_front() else {
                break;
            };
            bytes += size;
            entry.push(operation);
        }
        while !full(&entry, bytes) {
            let Some(lane) = self.turns.pop_front() else {
                break;
            };
            let line = self
                .producers
                .get_mut(&lane)
                .expect("a producer takes turns only while its line has operations");
            let (operation, size) = line
                .waiting
                .pop_front()
                .expect("a producer takes turns only while its line has operations");
            line.bytes -= size;
            bytes += size;
            entry.push(operation);
            if line.waiting.is_empty() {
                self.producers.remove(&lane);
            } else {
                self.turns.push_back(lane);
            }
        }
        entry
    }

    /// Drops every waiting operation `keep` refuses (a caller that gave up).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.settles.retain(|(operation, _)| keep(operation));
        for line in self.producers.values_mut() {
            line.waiting.retain(|(operation, _)| keep(operation));
            line.bytes = line.waiting.iter().map(|(_, size)| size).sum();
        }
        self.producers.retain(|_, line| !line.waiting.is_empty());
        let producers = &self.producers;
        self.turns.retain(|lane| producers.contains_key(lane));
    }
}

#[cfg(test)]
mod tests;
