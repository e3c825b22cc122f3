//! The rings of a scheduler: per priority tier, the tenants with something
//! to send in turn order, and per tenant its producers in turn order; how a
//! producer joins them, leaves them, and is found at their fronts. A
//! producer leaves its tenant's ring at once, wherever it is; a tenant
//! leaving from anywhere but the front leaves a stale entry (its ticket no
//! longer matches), dropped when it reaches the front.

use std::hash::Hash;

use super::Scheduler;
use crate::producer::ProducerPolicy;
use crate::producer_ring::ProducerRing;
use crate::ring::Ring;
use crate::slab::SlotId;
use crate::tenants::WHOLE_MESSAGE;

/// One tenant's place in one tier: its producers there in turn order, and
/// its own turn among the tier's tenants.
#[derive(Debug, Clone, Default)]
pub(super) struct TenantTurn {
    /// The tenant's producers in this tier's rings.
    pub(super) producers: ProducerRing,
    /// Credit of the tenant in its current turn, in millionths of a message:
    /// it is granted its quantum at the start of a turn and sends while it
    /// holds a whole message; what is left under one is kept for its next
    /// turn (a share under one message is saved up), and dropped when it
    /// leaves the ring.
    pub(super) credit: u64,
    /// Whether the tenant has a live entry in the tier's tenant ring.
    pub(super) in_ring: bool,
    /// Bumped on every join (and kept across reuses of the tenant's index),
    /// so entries of earlier stays go stale.
    pub(super) ticket: u32,
}

/// A tenant's place in a tier's tenant ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TenantEntry {
    pub(super) tenant: usize,
    pub(super) ticket: u32,
}

/// One priority tier.
#[derive(Debug, Clone, Default)]
pub(super) struct Tier {
    /// Tenants with a producer in this tier, in turn order.
    pub(super) tenants: Ring<TenantEntry>,
    /// Per tenant index, its place in this tier.
    pub(super) turns: Vec<TenantTurn>,
    /// Producers in this tier's rings, over every tenant.
    pub(super) producers: usize,
    /// Sum of their weights.
    pub(super) weight: u64,
}

impl<K: Clone + Eq + Hash, T: Clone + Eq + Hash> Scheduler<K, T> {
    /// The tier served now, the tenant whose turn it is there, and that
    /// tenant's producer whose turn it is: the fronts of the highest tier
    /// with a live entry, dropping stale entries (and drained tiers) on the
    /// way.
    pub(super) fn front_of_rings(&mut self) -> Option<(u32, usize, SlotId)> {
        let tenants = &self.tenants;
        let mut drained = false;
        let mut found = None;
        for (&priority, tier) in self.tiers.iter_mut().rev() {
            while let Some(entry) = tier.tenants.front() {
                let turn = &mut tier.turns[entry.tenant];
                if !(turn.in_ring && turn.ticket == entry.ticket) {
                    tier.tenants.drop_stale_front();
                    continue;
                }
                if turn.credit < WHOLE_MESSAGE {
                    turn.credit += tenants.quantum(entry.tenant);
                    if turn.credit < WHOLE_MESSAGE {
                        tier.tenants.rotate();
                        continue;
                    }
                }
                let front = turn
                    .producers
                    .front()
                    .expect("a tenant in a ring has a producer in it");
                found = Some((priority, entry.tenant, self.slots.id_at(front)));
                break;
            }
            if found.is_some() {
                break;
            }
            drained |= tier.tenants.entries() == 0;
        }
        if drained {
            self.tiers.retain(|_, tier| tier.tenants.entries() > 0);
        }
        found
    }

    /// Slot `id` of `tenant`, whose `in_ring` the caller just cleared,
    /// leaves that tenant's ring in tier `priority` with `weight` (what it
    /// joined with); the tenant leaves the tier's ring with its last
    /// producer there (its entry goes stale). The slot must still be in
    /// the slab: its neighbours are linked through it.
    pub(super) fn producer_left(&mut self, id: SlotId, priority: u32, tenant: usize, weight: u32) {
        self.ring_changes += 1;
        let tier = self
            .tiers
            .get_mut(&priority)
            .expect("a producer in a ring has its tier");
        tier.producers -= 1;
        tier.weight -= u64::from(weight);
        let turn = &mut tier.turns[tenant];
        turn.producers.leave(&mut self.slots, id.position(), weight);
        if turn.producers.members() == 0 {
            turn.in_ring = false;
            turn.credit = 0;
            tier.tenants.forget(self.tenants.weight(tenant));
        }
    }

    /// Puts slot `id` at the back of its tenant's ring in its tier if it
    /// belongs there and is not in it, and the tenant at the back of the
    /// tier's ring if it was not in it.
    pub(super) fn join_if_eligible(&mut self, id: SlotId) {
        let Some(slot) = self.slots.get_mut(id) else {
            return;
        };
        if slot.in_ring || !slot.eligible() {
            return;
        }
        slot.in_ring = true;
        let (tenant, weight) = (slot.tenant, slot.weight);
        self.ring_changes += 1;
        let tier = self.tiers.entry(slot.priority).or_default();
        if tier.turns.len() <= tenant {
            tier.turns.resize_with(tenant + 1, TenantTurn::default);
        }
        let turn = &mut tier.turns[tenant];
        turn.producers.join(&mut self.slots, id.position(), weight);
        tier.producers += 1;
        tier.weight += u64::from(weight);
        if !turn.in_ring {
            turn.in_ring = true;
            turn.ticket = turn.ticket.wrapping_add(1);
            tier.tenants.join(
                TenantEntry {
                    tenant,
                    ticket: turn.ticket,
                },
                self.tenants.weight(tenant),
            );
        }
    }

    /// Applies a changed policy to slot `id`: a new tier or a reached
    /// in-flight limit takes it out of its ring, and
    /// it joins again where it now belongs.
    pub(super) fn reschedule(&mut self, id: SlotId, policy: ProducerPolicy) {
        let Some(slot) = self.slots.get_mut(id) else {
            return;
        };
        let was_in_ring = slot.in_ring;
        let (old_tier, old_weight, tenant) = (slot.priority, slot.weight, slot.tenant);
        slot.adopt(policy);
        if was_in_ring {
            if slot.priority == old_tier && slot.eligible() {
                let new_weight = slot.weight;
                let tier = self
                    .tiers
                    .get_mut(&old_tier)
                    .expect("a producer in a ring has its tier");
                tier.turns[tenant].producers.reweigh(old_weight, new_weight);
                self.ring_changes += 1;
                tier.weight = tier.weight - u64::from(old_weight) + u64::from(new_weight);
                return;
            }
            slot.in_ring = false;
            slot.deficit = 0;
            self.producer_left(id, old_tier, tenant, old_weight);
        }
        self.join_if_eligible(id);
    }
}
