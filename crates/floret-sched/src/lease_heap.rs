//! Lease deadlines in expiry order.
//!
//! Settling a lease does not search the heap: the entry stays until it reaches
//! the top, where the scheduler recognises it as stale (its slot was freed, or
//! the slot no longer leases that sequence at that attempt) and discards it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use crate::slab::SlotId;

/// One lease as it was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LeaseEntry {
    /// When the lease runs out; first field, so it orders the heap.
    pub(crate) deadline: Instant,
    /// The producer's slot at the time of the lease.
    pub(crate) slot: SlotId,
    /// The leased message.
    pub(crate) sequence: u64,
    /// The attempt that was leased.
    pub(crate) attempt: u32,
}

/// Min-heap of lease entries, live and stale.
#[derive(Debug, Clone, Default)]
pub(crate) struct LeaseHeap {
    /// Earliest deadline on top.
    entries: BinaryHeap<Reverse<LeaseEntry>>,
}

impl LeaseHeap {
    /// Records a lease.
    pub(crate) fn push(&mut self, entry: LeaseEntry) {
        self.entries.push(Reverse(entry));
    }

    /// The entry with the earliest deadline.
    pub(crate) fn peek(&self) -> Option<&LeaseEntry> {
        self.entries.peek().map(|Reverse(entry)| entry)
    }

    /// Removes the entry with the earliest deadline.
    pub(crate) fn pop(&mut self) -> Option<LeaseEntry> {
        self.entries.pop().map(|Reverse(entry)| entry)
    }

    /// Removes the entry with the earliest deadline if that deadline is at or
    /// before `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<LeaseEntry> {
        if self.peek()?.deadline > now {
            return None;
        }
        self.pop()
    }

    /// Number of entries, stale ones included.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::producer::ProducerSlot;
    use crate::slab::Slab;

    #[test]
    fn leases_come_due_earliest_first_and_not_before_their_deadline() {
        let mut slab = Slab::new();
        let (slot, _) = slab.get_or_insert_with(&"a", || {
            ProducerSlot::new("a", crate::producer::ProducerPolicy::default())
        });
        let now = Instant::now();
        let lease = |seconds, sequence| LeaseEntry {
            deadline: now + Duration::from_secs(seconds),
            slot,
            sequence,
            attempt: 1,
        };
        let mut heap = LeaseHeap::default();
        heap.push(lease(20, 1));
        heap.push(lease(10, 2));
        heap.push(lease(30, 3));
        assert_eq!(heap.pop_due(now + Duration::from_secs(9)), None);
        assert_eq!(
            heap.pop_due(now + Duration::from_secs(20)),
            Some(lease(10, 2))
        );
        assert_eq!(
            heap.pop_due(now + Duration::from_secs(20)),
            Some(lease(20, 1))
        );
        assert_eq!(heap.pop_due(now + Duration::from_secs(20)), None);
        assert_eq!(heap.peek(), Some(&lease(30, 3)));
        assert_eq!(heap.len(), 1);
    }
}
