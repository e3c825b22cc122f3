//! The DRR ring: backlogged producers in turn order.
//!
//! Only the front is ever looked at. A producer that leaves the ring anywhere
//! but at the front (it was forgotten, moved to another tier, or reached its
//! in-flight limit) leaves its entry behind; the entry's [`RingEntry`] no
//! longer matches a slot in the ring with the same ticket, and the scheduler
//! drops it when it reaches the front. The counters are exact at all times.

use std::collections::VecDeque;

use crate::slab::SlotId;

/// One place in the ring: a slot and the ticket it got when it joined, so
/// an entry left behind by an earlier stay in the ring is told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingEntry {
    /// The producer's slot.
    pub(crate) slot: SlotId,
    /// The slot's ticket when it joined.
    pub(crate) ticket: u32,
}

/// Turn order plus the totals the cluster level reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ring {
    /// Producers in turn order, possibly with stale entries.
    order: VecDeque<RingEntry>,
    /// Producers really in the ring.
    producers: usize,
    /// Sum of their weights.
    weight: u64,
}

impl Ring {
    /// Puts a producer that just became backlogged at the back.
    pub(crate) fn join(&mut self, entry: RingEntry, weight: u32) {
        self.order.push_back(entry);
        self.producers += 1;
        self.weight += u64::from(weight);
    }

    /// The producer whose turn it is, or a stale entry.
    pub(crate) fn front(&self) -> Option<RingEntry> {
        self.order.front().copied()
    }

    /// Drops a stale front entry (its producer already left the counts).
    pub(crate) fn drop_stale_front(&mut self) {
        self.order.pop_front();
    }

    /// The front producer has nothing left to deliver.
    pub(crate) fn leave_front(&mut self, weight: u32) {
        self.order.pop_front();
        self.forget(weight);
    }

    /// The front producer spent its credits: its turn ends.
    pub(crate) fn rotate(&mut self) {
        self.order.rotate_left(1);
    }

    /// A producer left the ring from anywhere; its entry goes stale.
    pub(crate) fn forget(&mut self, weight: u32) {
        self.producers -= 1;
        self.weight -= u64::from(weight);
    }

    /// A producer in the ring changed weight.
    pub(crate) fn reweigh(&mut self, old: u32, new: u32) {
        self.weight = self.weight - u64::from(old) + u64::from(new);
    }

    /// Producers in the ring.
    pub(crate) fn producers(&self) -> usize {
        self.producers
    }

    /// Sum of the weights of producers in the ring.
    pub(crate) fn weight(&self) -> u64 {
        self.weight
    }

    /// Entries, stale ones included.
    pub(crate) fn entries(&self) -> usize {
        self.order.len()
    }
}
