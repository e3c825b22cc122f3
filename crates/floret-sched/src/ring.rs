//! The DRR ring of the tenants of one tier: backlogged members in turn
//! order. (The producers of one tenant are a ring threaded through their
//! slots instead, `producer_ring.rs`.)
//!
//! Only the front is ever looked at. A member that leaves the ring anywhere
//! but at the front (its last producer there left) leaves its entry behind;
//! the entry's ticket no longer matches the member's, and the scheduler
//! drops it when it reaches the front. The counters are exact at all times.

use std::collections::VecDeque;

/// Turn order plus the totals the cluster level reads.
#[derive(Debug, Clone)]
pub(crate) struct Ring<E> {
    /// Members in turn order, possibly with stale entries.
    order: VecDeque<E>,
    /// Members really in the ring.
    members: usize,
    /// Sum of their weights.
    weight: u64,
}

impl<E> Default for Ring<E> {
    fn default() -> Self {
        Self {
            order: VecDeque::new(),
            members: 0,
            weight: 0,
        }
    }
}

impl<E: Copy> Ring<E> {
    /// Puts a member that just became backlogged at the back.
    pub(crate) fn join(&mut self, entry: E, weight: u32) {
        self.order.push_back(entry);
        self.members += 1;
        self.weight += u64::from(weight);
    }

    /// The member whose turn it is, or a stale entry.
    pub(crate) fn front(&self) -> Option<E> {
        self.order.front().copied()
    }

    /// Drops a stale front entry (its member already left the counts).
    pub(crate) fn drop_stale_front(&mut self) {
        self.order.pop_front();
    }

    /// The front member has nothing left to deliver.
    pub(crate) fn leave_front(&mut self, weight: u32) {
        self.order.pop_front();
        self.forget(weight);
    }

    /// The front member spent its credits: its turn ends.
    pub(crate) fn rotate(&mut self) {
        self.order.rotate_left(1);
    }

    /// A member left the ring from anywhere; its entry goes stale.
    pub(crate) fn forget(&mut self, weight: u32) {
        self.members -= 1;
        self.weight -= u64::from(weight);
    }

    /// A member in the ring changed weight.
    pub(crate) fn reweigh(&mut self, old: u32, new: u32) {
        self.weight = self.weight - u64::from(old) + u64::from(new);
    }

    /// Members in the ring.
    pub(crate) fn members(&self) -> usize {
        self.members
    }

    /// Sum of the weights of members in the ring.
    pub(crate) fn weight(&self) -> u64 {
        self.weight
    }

    /// Entries, stale ones included.
    pub(crate) fn entries(&self) -> usize {
        self.order.len()
    }
}
