//! Everything the scheduler remembers about one producer that holds messages.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use crate::error::SettleError;
use crate::producer_ring::RingLinks;
use crate::undelivered::Undelivered;

/// How the scheduler treats one producer: its override, or the scheduler's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerPolicy {
    /// DRR quantum (messages per turn); 0 counts as 1.
    pub weight: u32,
    /// Tier: every producer of a higher tier is served before any of a lower one.
    pub priority: u32,
    /// Most of its messages leased at once (1: strict order, redeliveries
    /// included); `None` means no limit, 0 counts as 1.
    pub max_in_flight: Option<u32>,
}

impl Default for ProducerPolicy {
    fn default() -> Self {
        Self {
            weight: crate::config::DEFAULT_WEIGHT,
            priority: 0,
            max_in_flight: None,
        }
    }
}

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
    /// Messages held back until their time comes (sequence -> attempt of
    /// their next delivery); neither ready nor leased. A B-tree map because
    /// it is usually empty, and an empty one is half the size of a hash map
    /// in every slot.
    held: BTreeMap<u64, u32>,
    /// DRR quantum, granted as credits at the start of each turn.
    pub(crate) weight: u32,
    /// Tier whose ring the producer joins.
    pub(crate) priority: u32,
    /// Most leases at once (`u32::MAX`: no limit).
    pub(crate) max_in_flight: u32,
    /// Credits left in the current turn.
    pub(crate) deficit: u32,
    /// Whether the producer is in its tenant's ring of its tier; true
    /// exactly while it has something ready and is under `max_in_flight`.
    pub(crate) in_ring: bool,
    /// Its neighbours in that ring, while it is in it.
    pub(crate) ring_links: RingLinks,
    /// The index of the producer's tenant (`crate::tenants`).
    pub(crate) tenant: usize,
}

impl<K> ProducerSlot<K> {
    /// A slot holding nothing yet, scheduled as `policy` says.
    pub(crate) fn new(key: K, policy: ProducerPolicy) -> Self {
        let mut slot = Self {
            key,
            undelivered: Undelivered::new(),
            redeliveries: BTreeMap::new(),
            leases: HashMap::new(),
            held: BTreeMap::new(),
            weight: 1,
            priority: 0,
            max_in_flight: u32::MAX,
            deficit: 0,
            in_ring: false,
            ring_links: RingLinks::default(),
            tenant: 0,
        };
        slot.adopt(policy);
        slot
    }

    /// Takes `policy`'s weight, tier and in-flight limit (the caller moves
    /// the ring entry).
    pub(crate) fn adopt(&mut self, policy: ProducerPolicy) {
        self.weight = policy.weight.max(1);
        self.priority = policy.priority;
        self.max_in_flight = policy.max_in_flight.map_or(u32::MAX, |max| max.max(1));
    }

    /// Whether the producer belongs in the ring: something ready and room
    /// for another lease.
    pub(crate) fn eligible(&self) -> bool {
        self.ready() > 0 && self.in_flight() < u64::from(self.max_in_flight)
    }

    /// Drops every deliverable sequence below `below` (they were deleted);
    /// returns how many. Leases are kept: their settles find the message gone.
    pub(crate) fn drop_before(&mut self, below: u64) -> u64 {
        let kept = self.redeliveries.split_off(&below);
        let dropped = self.redeliveries.len() as u64;
        self.redeliveries = kept;
        self.held.retain(|&sequence, _| sequence >= below);
        dropped + self.undelivered.drop_before(below)
    }

    /// Holds back a message whose lease was just released: it is neither
    /// ready nor leased until [`Self::unhold`].
    pub(crate) fn hold(&mut self, sequence: u64, attempt: u32) {
        self.held.insert(sequence, attempt);
    }

    /// Makes a held message ready again, with the attempt it was held at;
    /// false if it is not held (anymore).
    pub(crate) fn unhold(&mut self, sequence: u64) -> bool {
        match self.held.remove(&sequence) {
            Some(attempt) => {
                self.redeliveries.insert(sequence, attempt);
                true
            }
            None => false,
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

    /// Nothing ready, leased or held: the slot can be freed.
    pub(crate) fn is_empty(&self) -> bool {
        self.ready() == 0 && self.leases.is_empty() && self.held.is_empty()
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
        let mut slot = ProducerSlot::new("a", ProducerPolicy::default());
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
