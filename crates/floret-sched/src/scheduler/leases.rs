//! Delivery leases of the scheduler: a dispatch leases its message until it
//! is acked, nacked, held back (delayed) or its lease expires; the lease
//! heap orders the deadlines. A nack or an expiry makes the message
//! deliverable again with the next attempt.

use std::hash::Hash;
use std::time::Instant;

use super::Scheduler;
use crate::dispatch::Dispatch;
use crate::error::SettleError;
use crate::slab::SlotId;

impl<K: Clone + Eq + Hash, T: Clone + Eq + Hash> Scheduler<K, T> {
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
            self.remove_slot(id);
        } else {
            self.join_if_eligible(id);
        }
        self.discard_stale_leases();
        Ok(())
    }

    /// Holds back a leased message that must not be delivered yet (its time
    /// has not come): the lease ends without a redelivery, and the message
    /// is neither ready nor leased until [`Self::unhold`], so the
    /// producer's other messages and the other producers go on. Same errors
    /// as [`Self::ack`].
    pub fn hold(&mut self, producer: &K, sequence: u64, attempt: u32) -> Result<(), SettleError> {
        let id = self.slots.id_of(producer).ok_or(SettleError::NotLeased)?;
        let slot = self.slots.get_mut(id).ok_or(SettleError::NotLeased)?;
        slot.release(sequence, attempt)?;
        slot.hold(sequence, attempt);
        self.in_flight -= 1;
        self.join_if_eligible(id);
        self.discard_stale_leases();
        Ok(())
    }

    /// A held message's time has come: it is ready again, before the
    /// producer's never-delivered messages. False when it is no longer held
    /// (forgotten or dropped since).
    pub fn unhold(&mut self, producer: &K, sequence: u64) -> bool {
        let Some(id) = self.slots.id_of(producer) else {
            return false;
        };
        let slot = self.slots.get_mut(id).expect("id just looked up");
        if !slot.unhold(sequence) {
            return false;
        }
        self.ready += 1;
        self.join_if_eligible(id);
        true
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

    /// Moves the live lease `(sequence, attempt)` of slot `id` back to
    /// deliverable, putting the producer in the ring if it was out.
    pub(super) fn redeliver(
        &mut self,
        id: SlotId,
        sequence: u64,
        attempt: u32,
    ) -> Result<(), SettleError> {
        let slot = self.slots.get_mut(id).ok_or(SettleError::NotLeased)?;
        slot.release(sequence, attempt)?;
        slot.hand_back(sequence, attempt);
        self.in_flight -= 1;
        self.ready += 1;
        self.join_if_eligible(id);
        Ok(())
    }

    /// Pops settled leases off the top of the heap, so that its top is always
    /// a live lease and `next_deadline` exact. Called after every operation
    /// that settles a lease or frees a slot.
    pub(super) fn discard_stale_leases(&mut self) {
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
