//! The scheduler: deficit round robin over producers, and delivery leases.
//!
//! A producer is in the ring while it has something ready. On its turn it gets
//! `weight` credits (when it has none left over), each dispatch spends one, and
//! it goes to the back when they run out or leaves the ring when it has nothing
//! ready. Every operation touches one slot and the front of the ring, so cost
//! does not grow with the number of producers; the lease heap adds O(log
//! leases) per dispatch and per expiry.

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::Range;
use std::time::Instant;

use crate::config::SchedulerConfig;
use crate::dispatch::Dispatch;
use crate::error::SettleError;
use crate::lease_heap::{LeaseEntry, LeaseHeap};
use crate::producer::{ProducerSlot, ProducerView};
use crate::ring::Ring;
use crate::slab::{Slab, SlotId};

#[cfg(test)]
mod tests;

/// Fair order and leases for the messages of one queue (on the node leading
/// its shard); see the crate docs for how the server drives it.
#[derive(Debug, Clone)]
pub struct Scheduler<K> {
    /// Lease timeout and default weight.
    config: SchedulerConfig,
    /// Producers holding something ready or leased.
    slots: Slab<K>,
    /// Weight overrides, kept even for producers without a slot.
    weights: HashMap<K, u32>,
    /// Backlogged producers in turn order.
    ring: Ring,
    /// Lease deadlines, for `expire` and `next_deadline`.
    lease_heap: LeaseHeap,
    /// Deliverable messages over all slots.
    ready: u64,
    /// Leased messages over all slots.
    in_flight: u64,
}

impl<K: Clone + Eq + Hash> Scheduler<K> {
    /// A scheduler holding nothing.
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            config: SchedulerConfig {
                default_weight: config.default_weight.max(1),
                ..config
            },
            slots: Slab::new(),
            weights: HashMap::new(),
            ring: Ring::default(),
            lease_heap: LeaseHeap::default(),
            ready: 0,
            in_flight: 0,
        }
    }

    /// Messages `sequences` of `producer` were committed and are deliverable.
    ///
    /// Sequences of one producer arrive in increasing order; a range may start
    /// after the producer's tail (the hole is skipped when the cursor gets
    /// there), and a range overlapping what is already known only extends the
    /// tail. Creates the producer's slot if needed; the producer joins the back
    /// of the ring when it goes from nothing ready to ready. An empty range
    /// does nothing. O(1).
    pub fn enqueued(&mut self, producer: &K, sequences: Range<u64>) {
        if sequences.is_empty() {
            return;
        }
        let (weights, default_weight) = (&self.weights, self.config.default_weight);
        let (id, slot) = self.slots.get_or_insert_with(producer, || {
            let weight = weights.get(producer).copied().unwrap_or(default_weight);
            ProducerSlot::new(producer.clone(), weight)
        });
        let added = slot.extend(sequences);
        self.ready += added;
        if added > 0 && !slot.in_ring {
            slot.in_ring = true;
            self.ring.join(id, slot.weight);
        }
    }

    /// Weight override for `producer`; `None` goes back to the default and 0
    /// counts as 1. Kept while the producer is idle (overrides are the only
    /// memory an idle producer costs) and across [`Self::forget`]. Takes
    /// effect from the producer's next turn; [`Self::backlogged_weight`]
    /// reflects it at once.
    pub fn set_weight(&mut self, producer: &K, weight: Option<u32>) {
        match weight {
            Some(weight) => {
                self.weights.insert(producer.clone(), weight.max(1));
            }
            None => {
                self.weights.remove(producer);
            }
        }
        let weight = self.weight_of(producer);
        if let Some(slot) = self.slots.by_key_mut(producer) {
            if slot.in_ring {
                self.ring.reweigh(slot.weight, weight);
            }
            slot.weight = weight;
        }
    }

    /// Next message to deliver, chosen by deficit round robin and leased until
    /// `now + lease_timeout`. `None` when nothing is ready. O(1) amortised
    /// (plus O(log leases) for the lease heap).
    pub fn next(&mut self, now: Instant) -> Option<Dispatch<K>> {
        let id = self.front_of_ring()?;
        let slot = self.slots.get_mut(id)?;
        let (sequence, attempt) = slot.lease_next()?;
        if slot.deficit == 0 {
            slot.deficit = slot.weight;
        }
        slot.deficit -= 1;
        if slot.ready() == 0 {
            slot.in_ring = false;
            slot.deficit = 0;
            self.ring.leave_front(slot.weight);
        } else if slot.deficit == 0 {
            self.ring.rotate();
        }
        self.ready -= 1;
        self.in_flight += 1;
        self.lease_heap.push(LeaseEntry {
            deadline: now + self.config.lease_timeout,
            slot: id,
            sequence,
            attempt,
        });
        Some(Dispatch {
            producer: slot.key.clone(),
            sequence,
            attempt,
        })
    }

    /// Whether `(producer, sequence, attempt)` holds a live lease. Lets a
    /// caller make an ack durable elsewhere before it releases the lease with
    /// [`Self::ack`], so a failed removal leaves the message to expire and
    /// come back.
    pub fn is_leased(&self, producer: &K, sequence: u64, attempt: u32) -> bool {
        self.slots
            .by_key(producer)
            .is_some_and(|slot| slot.holds_lease(sequence, attempt))
    }

    /// The consumer processed the message: its lease is dropped.
    /// [`SettleError::NotLeased`] if `(producer, sequence, attempt)` holds no
    /// live lease (expired, nacked, already acked, or another attempt). A lease
    /// past its deadline is still live until [`Self::expire`] runs.
    pub fn ack(&mut self, producer: &K, sequence: u64, attempt: u32) -> Result<(), SettleError> {
        let id = self.slots.id_of(producer).ok_or(SettleError::NotLeased)?;
        let slot = self.slots.get_mut(id).ok_or(SettleError::NotLeased)?;
        slot.release(sequence, attempt)?;
        self.in_flight -= 1;
        if slot.is_empty() {
            self.slots.remove(id);
        }
        self.discard_stale_leases();
        Ok(())
    }

    /// The consumer hands the message back: it is deliverable again with
    /// attempt + 1, before that producer's never-delivered messages. Same
    /// errors as [`Self::ack`].
    pub fn nack(&mut self, producer: &K, sequence: u64, attempt: u32) -> Result<(), SettleError> {
        let id = self.slots.id_of(producer).ok_or(SettleError::NotLeased)?;
        self.redeliver(id, sequence, attempt)?;
        self.discard_stale_leases();
        Ok(())
    }

    /// Makes every lease whose deadline is at or before `now` deliverable
    /// again with attempt + 1. Returns how many expired.
    pub fn expire(&mut self, now: Instant) -> usize {
        self.expire_leases(now).len()
    }

    /// Like [`Self::expire`], naming each delivery whose lease expired, so a
    /// caller that tracks who holds what can forget those leases too.
    pub fn expire_leases(&mut self, now: Instant) -> Vec<Dispatch<K>> {
        let mut expired = Vec::new();
        while let Some(lease) = self.lease_heap.pop_due(now) {
            let Some(producer) = self.slots.get(lease.slot).map(|slot| slot.key.clone()) else {
                continue;
            };
            if self
                .redeliver(lease.slot, lease.sequence, lease.attempt)
                .is_ok()
            {
                expired.push(Dispatch {
                    producer,
                    sequence: lease.sequence,
                    attempt: lease.attempt,
                });
            }
        }
        self.discard_stale_leases();
        expired
    }

    /// Earliest deadline of a live lease, for the caller's timer. (Settled
    /// leases are dropped from the top of the heap as they are settled, so
    /// this never names one.)
    pub fn next_deadline(&self) -> Option<Instant> {
        self.lease_heap.peek().map(|lease| lease.deadline)
    }

    /// The producer's messages are gone (e.g. its shard moved away): its slot,
    /// ring entry and leases are dropped. Its weight override stays.
    pub fn forget(&mut self, producer: &K) {
        let Some(id) = self.slots.id_of(producer) else {
            return;
        };
        let Some(slot) = self.slots.remove(id) else {
            return;
        };
        if slot.in_ring {
            self.ring.forget(slot.weight);
        }
        self.ready -= slot.ready();
        self.in_flight -= slot.in_flight();
        self.discard_stale_leases();
    }

    /// Per-producer numbers for stats; `None` when the producer holds nothing.
    pub fn producer(&self, producer: &K) -> Option<ProducerView> {
        self.slots.by_key(producer).map(ProducerSlot::view)
    }

    /// Producers with deliverable messages (in the ring).
    pub fn backlogged_producers(&self) -> usize {
        self.ring.producers()
    }

    /// Sum of the weights of producers in the ring, which the gossip view
    /// reports so the cluster can split consumer credit between nodes.
    pub fn backlogged_weight(&self) -> u64 {
        self.ring.weight()
    }

    /// Deliverable (not leased) messages over all producers.
    pub fn ready_messages(&self) -> u64 {
        self.ready
    }

    /// Leased messages over all producers.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The producer whose turn it is, dropping stale entries on the way. A
    /// producer in the ring always has something ready.
    fn front_of_ring(&mut self) -> Option<SlotId> {
        loop {
            let id = self.ring.front()?;
            if self.slots.get(id).is_some() {
                return Some(id);
            }
            self.ring.drop_stale_front();
        }
    }

    /// Weight `producer` gets: its override, else the default.
    fn weight_of(&self, producer: &K) -> u32 {
        self.weights
            .get(producer)
            .copied()
            .unwrap_or(self.config.default_weight)
    }

    /// Moves the live lease `(sequence, attempt)` of slot `id` back to
    /// deliverable, putting the producer in the ring if it was out.
    fn redeliver(&mut self, id: SlotId, sequence: u64, attempt: u32) -> Result<(), SettleError> {
        let slot = self.slots.get_mut(id).ok_or(SettleError::NotLeased)?;
        slot.release(sequence, attempt)?;
        slot.hand_back(sequence, attempt);
        self.in_flight -= 1;
        self.ready += 1;
        if !slot.in_ring {
            slot.in_ring = true;
            self.ring.join(id, slot.weight);
        }
        Ok(())
    }

    /// Pops settled leases off the top of the heap, so that its top is always
    /// a live lease and `next_deadline` exact. Called after every operation
    /// that settles a lease or frees a slot.
    fn discard_stale_leases(&mut self) {
        while let Some(top) = self.lease_heap.peek() {
            let live = self
                .slots
                .get(top.slot)
                .is_some_and(|slot| slot.holds_lease(top.sequence, top.attempt));
            if live {
                return;
            }
            self.lease_heap.pop();
        }
    }
}
