//! Everything the scheduler remembers about one producer that holds messages.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use crate::error::SettleError;
use crate::undelivered::Undelivered;

/// Per-producer numbers for stats and the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerView {
    /// Deliverable messages: never delivered plus handed back.
    pub ready: u64,
    /// Messages leased to consumers and not yet settled.
    pub in_flight: u64,
    /// The producer's DRR quantum (override or default).
    pub weight: u32,
    /// Credits left in the producer's current turn; 0 between turns.
    pub deficit: u32,
}

/// State of one producer with something ready or leased.
#[derive(Debug, Clone)]
pub(crate) struct ProducerSlot<K> {
    /// The producer's key, cloned into every [`crate::Dispatch`].
    pub(crate) key: K,
    /// Messages never delivered, delivered after `redeliveries`.
    undelivered: Undelivered,
    /// Handed-back messages (sequence -> attempt of their next delivery); they
    /// go before `undelivered`, lowest sequence first.
    redeliveries: BTreeMap<u64, u32>,
    /// Leased messages (sequence -> attempt); deadlines live in the lease heap.
    leases: HashMap<u64, u32>,
    /// DRR quantum, granted as credits at the start of each turn.
    pub(crate) weight: u32,
    /// Credits left in the current turn.
    pub(crate) deficit: u32,
    /// Whether the producer has an entry in the ring; true exactly while it
    /// has something ready.
    pub(crate) in_ring: bool,
}

impl<K> ProducerSlot<K> {
    /// A slot holding nothing yet.
    pub(crate) fn new(key: K, weight: u32) -> Self {
        Self {
            key,
            undelivered: Undelivered::new(),
            redeliveries: BTreeMap::new(),
            leases: HashMap::new(),
            weight,
            deficit: 0,
            in_ring: false,
        }
    }

    /// Announces committed sequences; returns how many became deliverable.
    pub(crate) fn extend(&mut self, sequences: Range<u64>) -> u64 {
        self.undelivered.extend(sequences)
    }

    /// Takes the next message to deliver, redeliveries first, and leases it.
    /// Returns its sequence and attempt.
    pub(crate) fn lease_next(&mut self) -> Option<(u64, u32)> {
        let (sequence, attempt) = match self.redeliveries.pop_first() {
            Some(redelivery) => redelivery,
            None => (self.undelivered.pop()?, 1),
        };
        self.leases.insert(sequence, attempt);
        Some((sequence, attempt))
    }

    /// Drops the lease of `(sequence, attempt)` if it is live.
    pub(crate) fn release(&mut self, sequence: u64, attempt: u32) -> Result<(), SettleError> {
        if !self.holds_lease(sequence, attempt) {
            return Err(SettleError::NotLeased);
        }
        self.leases.remove(&sequence);
        Ok(())
    }

    /// Makes a message whose lease was just released deliverable again with
    /// the next attempt.
    pub(crate) fn hand_back(&mut self, sequence: u64, attempt: u32) {
        self.redeliveries
            .insert(sequence, attempt.saturating_add(1));
    }

    /// Whether `(sequence, attempt)` is leased right now.
    pub(crate) fn holds_lease(&self, sequence: u64, attempt: u32) -> bool {
        self.leases.get(&sequence) == Some(&attempt)
    }

    /// Deliverable messages.
    pub(crate) fn ready(&self) -> u64 {
        self.undelivered.len() + self.redeliveries.len() as u64
    }

    /// Leased messages.
    pub(crate) fn in_flight(&self) -> u64 {
        self.leases.len() as u64
    }

    /// Nothing ready and nothing leased: the slot can be freed.
    pub(crate) fn is_empty(&self) -> bool {
        self.ready() == 0 && self.leases.is_empty()
    }

    /// Snapshot for [`crate::Scheduler::producer`].
    pub(crate) fn view(&self) -> ProducerView {
        ProducerView {
            ready: self.ready(),
            in_flight: self.in_flight(),
            weight: self.weight,
            deficit: self.deficit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot_with(range: Range<u64>) -> ProducerSlot<&'static str> {
        let mut slot = ProducerSlot::new("a", 1);
        slot.extend(range);
        slot
    }

    #[test]
    fn handed_back_message_goes_before_undelivered_ones() {
        let mut slot = slot_with(1..4);
        assert_eq!(slot.lease_next(), Some((1, 1)));
        assert_eq!(slot.lease_next(), Some((2, 1)));
        slot.release(2, 1).unwrap();
        slot.hand_back(2, 1);
        slot.release(1, 1).unwrap();
        slot.hand_back(1, 1);
        assert_eq!(slot.lease_next(), Some((1, 2)));
        assert_eq!(slot.lease_next(), Some((2, 2)));
        assert_eq!(slot.lease_next(), Some((3, 1)));
        assert_eq!(slot.lease_next(), None);
    }

    #[test]
    fn release_of_another_attempt_is_refused() {
        let mut slot = slot_with(1..2);
        slot.lease_next();
        assert_eq!(slot.release(1, 2), Err(SettleError::NotLeased));
        assert_eq!(slot.release(9, 1), Err(SettleError::NotLeased));
        assert_eq!(slot.release(1, 1), Ok(()));
        assert_eq!(slot.release(1, 1), Err(SettleError::NotLeased));
    }

    #[test]
    fn slot_is_empty_only_when_nothing_ready_or_leased() {
        let mut slot = slot_with(1..2);
        assert!(!slot.is_empty());
        slot.lease_next();
        assert_eq!((slot.ready(), slot.in_flight()), (0, 1));
        assert!(!slot.is_empty());
        slot.release(1, 1).unwrap();
        assert!(slot.is_empty());
    }
}
