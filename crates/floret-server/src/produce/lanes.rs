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
//! - All producers' lines together are bounded in bytes: once they hold
//!   the shard's bound, a call is refused if its producer already holds
//!   at least an equal share of what waits (others still get in, so the
//!   bound may be passed by less than one share per producer).
//! - A call may be folded into the operation waiting last in its line (the
//!   caller says when two fold: `proposer.rs` folds plain produces of one
//!   producer), up to an entry's bytes: a flood of one-message calls then
//!   takes one operation of each entry, not dozens, and costs the state
//!   machine one write of the producer's records per entry.
//!
//! - While another entry of the shard is in flight, the next one leaves
//!   only once it is full ([`EntryLanes::leaves_now`]); otherwise it waits
//!   for that entry's commit and keeps filling. An idle shard's lone
//!   operation leaves at once, and a flood that fills entries keeps them
//!   pipelined; calls that trickle in between go in fewer, fuller entries,
//!   each of which costs every replica a log append, a replication round
//!   and an apply whatever it holds.
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
    /// Bytes all producers' lines may hold before the producers holding
    /// more than an equal share are refused.
    pub shard_bytes: usize,
}

/// A producer's line is full, or the shard's lines are and the producer
/// holds its share: the call was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneFull {
    /// Calls waiting in the line.
    pub calls: usize,
    /// Bytes waiting in the line.
    pub bytes: usize,
    /// Bytes waiting in all lines, when their bound refused the call.
    pub shard_bytes: Option<usize>,
}

/// An operation waiting in a producer's line.
#[derive(Debug)]
struct Waiting<T> {
    operation: T,
    /// Its bytes (folded calls' included).
    bytes: usize,
    /// The calls folded into it (at least one).
    calls: usize,
}

#[derive(Debug)]
struct Line<T> {
    waiting: VecDeque<Waiting<T>>,
    /// Whether the line is in `turns` (it may be, emptied of abandoned
    /// operations, until its turn comes).
    takes_turns: bool,
    /// Calls waiting, folded ones included.
    calls: usize,
    bytes: usize,
}

impl<T> Line<T> {
    /// Drops the operations no one waits for any more, freeing their place.
    fn drop_abandoned(&mut self, abandoned: fn(&T) -> bool) {
        self.waiting
            .retain(|waiting| !abandoned(&waiting.operation));
        self.bytes = self.waiting.iter().map(|waiting| waiting.bytes).sum();
        self.calls = self.waiting.iter().map(|waiting| waiting.calls).sum();
    }
}

impl<T> Default for Line<T> {
    fn default() -> Self {
        Self {
            waiting: VecDeque::new(),
            takes_turns: false,
            calls: 0,
            bytes: 0,
        }
    }
}

/// The waiting operations of one shard, by line.
#[derive(Debug)]
pub struct EntryLanes<T> {
    limits: LaneLimits,
    /// Whether an operation's callers have all gone away: it is dropped
    /// instead of proposed, and frees its place in a full line.
    abandoned: fn(&T) -> bool,
    settles: VecDeque<(T, usize)>,
    producers: HashMap<Lane, Line<T>>,
    /// Producers with operations waiting, in the order they take turns.
    turns: VecDeque<Lane>,
    /// Bytes waiting in all producers' lines.
    waiting_bytes: usize,
    /// Operations waiting in all producers' lines (folded calls count once).
    waiting_operations: usize,
    /// Bytes of the waiting settles.
    settle_bytes: usize,
}

impl<T> EntryLanes<T> {
    /// Empty lines under `limits`; `abandoned` says which operations no one waits for.
    pub fn new(limits: LaneLimits, abandoned: fn(&T) -> bool) -> Self {
        Self {
            limits,
            abandoned,
            settles: VecDeque::new(),
            producers: HashMap::new(),
            turns: VecDeque::new(),
            waiting_bytes: 0,
            waiting_operations: 0,
            settle_bytes: 0,
        }
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.settles.is_empty() && self.turns.is_empty()
    }

    /// Whether what waits fills an entry, by operations or by bytes.
    pub fn holds_a_full_entry(&self) -> bool {
        let operations = self.settles.len() + self.waiting_operations;
        operations >= self.limits.entry_ops
            || self.settle_bytes + self.waiting_bytes >= self.limits.entry_bytes
    }

    /// Whether the next entry should leave now, with `others_in_flight`
    /// of the shard's entries proposed and not yet committed: at once when
    /// none is, and otherwise only once it is full; until then it waits for
    /// a commit and fills.
    pub fn leaves_now(&self, others_in_flight: usize) -> bool {
        !self.is_empty() && (others_in_flight == 0 || self.holds_a_full_entry())
    }

    /// Queues `operation` of `bytes` in `lane`, or hands it back refused
    /// when the producer's line is full. Settling operations are never
    /// refused. `fold` may fold it into the line's last waiting operation,
    /// or hand it back when the two do not fold; it is only asked while
    /// the two together stay within an entry's bytes.
    pub fn push(
        &mut self,
        lane: Lane,
        operation: T,
        bytes: usize,
        fold: impl FnOnce(&mut T, T) -> Option<T>,
    ) -> Result<(), (T, LaneFull)> {
        if lane == Lane::Settle {
            self.settles.push_back((operation, bytes));
            self.settle_bytes += bytes;
            return Ok(());
        }
        let limits = self.limits;
        let waiting_lines = self.producers.len().max(1);
        let line = self.producers.entry(lane.clone()).or_default();
        let full = |line: &Line<T>| {
            let over_bytes = line.calls > 0 && line.bytes + bytes > limits.producer_bytes;
            line.calls >= limits.producer_calls || over_bytes
        };
        let over_share = |line: &Line<T>, waiting: usize| {
            waiting > 0
                && waiting + bytes > limits.shard_bytes
                && line.bytes >= waiting / waiting_lines
        };
        if full(line) || over_share(line, self.waiting_bytes) {
            let (bytes_before, operations_before) = (line.bytes, line.waiting.len());
            line.drop_abandoned(self.abandoned);
            self.waiting_bytes -= bytes_before - line.bytes;
            self.waiting_operations -= operations_before - line.waiting.len();
        }
        let refused = if full(line) {
            Some(None)
        } else if over_share(line, self.waiting_bytes) {
            Some(Some(self.waiting_bytes))
        } else {
            None
        };
        if let Some(shard_bytes) = refused {
            let full = LaneFull {
                calls: line.calls,
                bytes: line.bytes,
                shard_bytes,
            };
            if line.calls == 0 && !line.takes_turns {
                self.producers.remove(&lane);
            }
            return Err((operation, full));
        }
        line.calls += 1;
        line.bytes += bytes;
        self.waiting_bytes += bytes;
        let operation = match line.waiting.back_mut() {
            Some(last) if last.bytes + bytes <= limits.entry_bytes => {
                match fold(&mut last.operation, operation) {
                    None => {
                        last.bytes += bytes;
                        last.calls += 1;
                        return Ok(());
                    }
                    Some(unfolded) => unfolded,
                }
            }
            _ => operation,
        };
        if !line.takes_turns {
            line.takes_turns = true;
            self.turns.push_back(lane);
        }
        line.waiting.push_back(Waiting {
            operation,
            bytes,
            calls: 1,
        });
        self.waiting_operations += 1;
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
            self.settle_bytes -= size;
            if !(self.abandoned)(&operation) {
                bytes += size;
                entry.push(operation);
            }
        }
        while !full(&entry, bytes) {
            let Some(lane) = self.turns.pop_front() else {
                break;
            };
            let Some(line) = self.producers.get_mut(&lane) else {
                continue;
            };
            let Some(waiting) = line.waiting.pop_front() else {
                self.producers.remove(&lane);
                continue;
            };
            line.bytes -= waiting.bytes;
            line.calls -= waiting.calls;
            self.waiting_bytes -= waiting.bytes;
            self.waiting_operations -= 1;
            if !(self.abandoned)(&waiting.operation) {
                bytes += waiting.bytes;
                entry.push(waiting.operation);
            }
            if line.waiting.is_empty() {
                self.producers.remove(&lane);
            } else {
                self.turns.push_back(lane);
            }
        }
        entry
    }
}

#[cfg(test)]
mod tests;
