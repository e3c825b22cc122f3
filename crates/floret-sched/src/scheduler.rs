//! The scheduler: deficit round robin over tenants, and inside each tenant
//! over its producers, in priority tiers; and delivery leases.
//!
//! A producer is in its tenant's ring of its tier while it has something
//! ready and fewer leases than its `max_in_flight`; a tenant is in its
//! tier's ring while one of its producers is. The highest tier with a
//! tenant in its ring is served; inside it, the front tenant gets its
//! tenant weight in credits on its turn, and inside the tenant the front
//! producer gets its `weight`; each dispatch spends one of each. A member
//! goes to the back of its ring when its credits run out and leaves it when
//! it has nothing left to send, so a tenant that spreads its messages over
//! a hundred producers gets one tenant's share. Every operation touches one
//! slot, the front of one tenant ring and of one producer ring (plus a look
//! over the few tiers in use), so cost does not grow with the number of
//! producers or tenants; the lease heap adds O(log leases) per dispatch and
//! per expiry. Settling and expiring leases is `leases.rs`; joining, leaving
//! and finding the fronts of the rings is `rings.rs`.
//!
//! A scheduler made with [`Scheduler::new`] has one tenant, and schedules
//! exactly as deficit round robin over producers.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::ops::Range;
use std::time::Instant;

use crate::config::SchedulerConfig;
use crate::dispatch::Dispatch;
use crate::lease_heap::{LeaseEntry, LeaseHeap};
use crate::producer::{ProducerPolicy, ProducerSlot, ProducerView};
use crate::slab::{Slab, SlotId};
use crate::tenants::{Tenants, WHOLE_MESSAGE};
use rings::Tier;

mod leases;
mod rings;
#[cfg(test)]
mod tests;

/// Fair order and leases for the messages of one queue (on the node leading
/// its shard); see the crate docs for how the server drives it. `T` is the
/// tenant a producer belongs to (`tenant_of`); `()`: one tenant.
#[derive(Debug, Clone)]
pub struct Scheduler<K, T = ()> {
    /// Lease timeout.
    config: SchedulerConfig,
    /// How producers without an override are scheduled.
    defaults: ProducerPolicy,
    /// Producers holding something ready or leased.
    slots: Slab<K>,
    /// Policy overrides, kept even for producers without a slot.
    overrides: HashMap<K, ProducerPolicy>,
    /// Per priority tier, its eligible tenants and producers in turn order.
    tiers: BTreeMap<u32, Tier>,
    /// The tenant of a producer.
    tenant_of: fn(&K) -> T,
    /// Tenants holding slots, and tenant weight overrides.
    tenants: Tenants<T>,
    /// Lease deadlines, for `expire` and `next_deadline`.
    lease_heap: LeaseHeap,
    /// Deliverable messages over all slots.
    ready: u64,
    /// Leased messages over all slots.
    in_flight: u64,
    /// Changes to the rings' members or their weights ([`Self::ring_changes`]).
    ring_changes: u64,
}

/// How producers without an override are scheduled before any policy is set.
fn initial_defaults(config: &SchedulerConfig) -> ProducerPolicy {
    ProducerPolicy {
        weight: config.default_weight.max(1),
        ..ProducerPolicy::default()
    }
}

impl<K: Clone + Eq + Hash> Scheduler<K> {
    /// A scheduler holding nothing, with one tenant: deficit round robin
    /// over producers.
    pub fn new(config: SchedulerConfig) -> Self {
        Self::with_tenants(config, |_| ())
    }
}

impl<K: Clone + Eq + Hash, T: Clone + Eq + Hash> Scheduler<K, T> {
    /// A scheduler holding nothing, whose producers belong to the tenants
    /// `tenant_of` names: deficit round robin over tenants, then over each
    /// tenant's producers.
    pub fn with_tenants(config: SchedulerConfig, tenant_of: fn(&K) -> T) -> Self {
        Self {
            defaults: initial_defaults(&config),
            config,
            slots: Slab::new(),
            overrides: HashMap::new(),
            tiers: BTreeMap::new(),
            tenant_of,
            tenants: Tenants::default(),
            lease_heap: LeaseHeap::default(),
            ready: 0,
            in_flight: 0,
            ring_changes: 0,
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
        let tenant = match self.slots.id_of(producer) {
            Some(_) => None,
            None => Some(self.tenants.acquire((self.tenant_of)(producer))),
        };
        let (overrides, defaults) = (&self.overrides, self.defaults);
        let (id, slot) = self.slots.get_or_insert_with(producer, || {
            let policy = overrides.get(producer).copied().unwrap_or(defaults);
            let mut slot = ProducerSlot::new(producer.clone(), policy);
            slot.tenant = tenant.unwrap_or_default();
            slot
        });
        let added = slot.extend(sequences);
        self.ready += added;
        if added > 0 {
            self.join_if_eligible(id);
        }
    }

    /// Policy override for `producer` (weight, tier, in-flight limit);
    /// `None` goes back to the defaults. Kept while the producer is idle
    /// (overrides are the only memory an idle producer costs) and across
    /// [`Self::forget`]. A new weight takes effect from the producer's next
    /// turn, a new tier or limit at once; [`Self::backlogged_weight`]
    /// reflects it at once.
    pub fn set_policy(&mut self, producer: &K, policy: Option<ProducerPolicy>) {
        match policy {
            Some(policy) => {
                self.overrides.insert(producer.clone(), policy);
            }
            None => {
                self.overrides.remove(producer);
            }
        }
        let policy = self.policy_of(producer);
        if let Some(id) = self.slots.id_of(producer) {
            self.reschedule(id, policy);
        }
    }

    /// Drops the overrides of the producers `matches` picks (their policy
    /// source was lost, e.g. their shard moved away); producers holding
    /// messages go back to the defaults.
    pub fn forget_overrides(&mut self, matches: impl Fn(&K) -> bool) {
        let dropped: Vec<K> = self
            .overrides
            .keys()
            .filter(|producer| matches(producer))
            .cloned()
            .collect();
        for producer in dropped {
            self.set_policy(&producer, None);
        }
    }

    /// Weight override of `tenant` among the tenants (messages per turn);
    /// `None` goes back to 1. Kept while the tenant holds nothing. A new
    /// weight takes effect from the tenant's next turn.
    pub fn set_tenant_weight(&mut self, tenant: &T, weight: Option<u32>) {
        let Some((index, old, new)) = self.tenants.set_weight(tenant, weight) else {
            return;
        };
        self.ring_changes += 1;
        for tier in self.tiers.values_mut() {
            if tier.turns.get(index).is_some_and(|turn| turn.in_ring) {
                tier.tenants.reweigh(old, new);
            }
        }
    }

    /// Each tenant's share of its weight on this node, in parts per million
    /// ([`WHOLE_SHARE`](crate::WHOLE_SHARE) is all of it): the part of the
    /// tenant's backlogged producer weight in the cluster that is here, so
    /// a tenant spread over several nodes gets its weight once over all of
    /// them. Replaces every earlier share; unlisted tenants get a whole
    /// share, and shares under [`MIN_SHARE`](crate::MIN_SHARE) count as
    /// that. A share under one message per turn is saved up over turns, so
    /// a decision may pass over a few tenants: at most 64 turns of a tenant
    /// per message. Takes effect from each tenant's next turn.
    pub fn set_tenant_shares(&mut self, shares: impl IntoIterator<Item = (T, u32)>) {
        self.tenants.set_shares(shares);
    }

    /// Per tenant with a producer in a ring: the tenant, the sum of the
    /// weights of those producers, and the tenant's weight; what a node
    /// reports so the cluster can compute each tenant's share on it.
    /// O(the most tenants that held messages at once, per tier in use).
    pub fn backlogged_tenant_weights(&self) -> Vec<(T, u64, u32)> {
        let mut by_tenant: HashMap<usize, u64> = HashMap::new();
        for tier in self.tiers.values() {
            for (index, turn) in tier.turns.iter().enumerate() {
                if turn.in_ring {
                    *by_tenant.entry(index).or_default() += turn.producers.weight();
                }
            }
        }
        by_tenant
            .into_iter()
            .map(|(index, weight)| {
                (
                    self.tenants.key(index).clone(),
                    weight,
                    self.tenants.weight(index),
                )
            })
            .collect()
    }

    /// How many times a producer or tenant joined or left a ring or changed
    /// weight: while it stays the same, so do the backlogged weights
    /// ([`Self::backlogged_weight`], [`Self::backlogged_tenant_weights`]).
    pub fn ring_changes(&self) -> u64 {
        self.ring_changes
    }

    /// Whether it holds nothing a new scheduler would not: no producer with
    /// messages or leases, no override, the defaults it started with. Such
    /// a scheduler can be dropped and made again when needed. O(1).
    pub fn holds_nothing(&self) -> bool {
        self.slots.is_empty()
            && self.overrides.is_empty()
            && !self.tenants.has_overrides()
            && self.defaults == initial_defaults(&self.config)
    }

    /// How producers without an override are scheduled.
    pub fn defaults(&self) -> ProducerPolicy {
        self.defaults
    }

    /// How producers without an override are scheduled from now on.
    /// O(producers holding messages).
    pub fn set_defaults(&mut self, defaults: ProducerPolicy) {
        self.defaults = defaults;
        let inheriting: Vec<SlotId> = self
            .slots
            .keys()
            .filter(|key| !self.overrides.contains_key(*key))
            .filter_map(|key| self.slots.id_of(key))
            .collect();
        for id in inheriting {
            self.reschedule(id, defaults);
        }
    }

    /// The producer's messages below `below` were deleted (its oldest were
    /// dropped or dead-lettered): they are no longer deliverable. Leased ones
    /// stay leased; their settles find them gone. Returns how many were
    /// dropped. O(holes and redeliveries below `below`).
    pub fn drop_before(&mut self, producer: &K, below: u64) -> u64 {
        let Some(id) = self.slots.id_of(producer) else {
            return 0;
        };
        let slot = self.slots.get_mut(id).expect("id just looked up");
        let dropped = slot.drop_before(below);
        self.ready -= dropped;
        let (priority, tenant, weight) = (slot.priority, slot.tenant, slot.weight);
        let left_ring = slot.in_ring && slot.ready() == 0;
        if left_ring {
            slot.in_ring = false;
            slot.deficit = 0;
        }
        let empty = slot.is_empty();
        if left_ring {
            self.producer_left(id, priority, tenant, weight);
        }
        if empty {
            self.remove_slot(id);
            self.discard_stale_leases();
        }
        dropped
    }

    /// Next message to deliver, chosen by deficit round robin and leased until
    /// `now + lease_timeout`. `None` when nothing is ready. O(1) amortised
    /// (plus O(log leases) for the lease heap).
    pub fn next(&mut self, now: Instant) -> Option<Dispatch<K>> {
        let (tier, tenant, id) = self.front_of_rings()?;
        let tenant_weight = self.tenants.weight(tenant);
        let slot = self.slots.get_mut(id)?;
        let (sequence, attempt) = slot.lease_next()?;
        if slot.deficit == 0 {
            slot.deficit = slot.weight;
        }
        slot.deficit -= 1;
        let (eligible, turn_spent, weight) = (slot.eligible(), slot.deficit == 0, slot.weight);
        let producer = slot.key.clone();
        if !eligible {
            slot.in_ring = false;
            slot.deficit = 0;
        }
        let tier = self.tiers.get_mut(&tier).expect("front found in this tier");
        let turn = &mut tier.turns[tenant];
        turn.credit -= WHOLE_MESSAGE;
        if !eligible {
            self.ring_changes += 1;
            turn.producers.leave(&mut self.slots, id.position(), weight);
            tier.producers -= 1;
            tier.weight -= u64::from(weight);
        } else if turn_spent {
            turn.producers.rotate(&self.slots);
        }
        if turn.producers.members() == 0 {
            turn.in_ring = false;
            turn.credit = 0;
            tier.tenants.leave_front(tenant_weight);
        } else if turn.credit < WHOLE_MESSAGE {
            tier.tenants.rotate();
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
            producer,
            sequence,
            attempt,
        })
    }

    /// The producer's messages are gone (e.g. its shard moved away): its slot,
    /// ring entry and leases are dropped. Its weight override stays. Returns
    /// how many leases it held, so a caller that mirrors leases elsewhere
    /// knows whether there is anything of this producer to drop there.
    pub fn forget(&mut self, producer: &K) -> u64 {
        let Some(id) = self.slots.id_of(producer) else {
            return 0;
        };
        let Some(slot) = self.slots.get_mut(id) else {
            return 0;
        };
        if slot.in_ring {
            slot.in_ring = false;
            let (priority, tenant, weight) = (slot.priority, slot.tenant, slot.weight);
            self.producer_left(id, priority, tenant, weight);
        }
        let slot = self.remove_slot(id).expect("id just looked up");
        let leased = slot.in_flight();
        self.ready -= slot.ready();
        self.in_flight -= leased;
        self.discard_stale_leases();
        leased
    }

    /// Per-producer numbers for stats; `None` when the producer holds nothing.
    pub fn producer(&self, producer: &K) -> Option<ProducerView> {
        self.slots.by_key(producer).map(ProducerSlot::view)
    }

    /// Producers with deliverable messages and room for another lease (in a ring).
    pub fn backlogged_producers(&self) -> usize {
        self.tiers.values().map(|tier| tier.producers).sum()
    }

    /// Tenants with a producer in a ring (counted once per tier).
    pub fn backlogged_tenants(&self) -> usize {
        self.tiers.values().map(|tier| tier.tenants.members()).sum()
    }

    /// Sum of the weights of the tenants in the rings (once per tier).
    pub fn backlogged_tenant_weight(&self) -> u64 {
        self.tiers.values().map(|tier| tier.tenants.weight()).sum()
    }

    /// Sum of the weights of producers in the rings, which each node reports
    /// to the merges of its consumers so they split credit between nodes.
    pub fn backlogged_weight(&self) -> u64 {
        self.tiers.values().map(|tier| tier.weight).sum()
    }

    /// Deliverable (not leased) messages over all producers.
    pub fn ready_messages(&self) -> u64 {
        self.ready
    }

    /// Leased messages over all producers.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Frees slot `id` and its hold on its tenant.
    fn remove_slot(&mut self, id: SlotId) -> Option<ProducerSlot<K>> {
        let slot = self.slots.remove(id)?;
        self.tenants.release(slot.tenant);
        Some(slot)
    }

    /// The policy `producer` gets: its override, else the defaults.
    fn policy_of(&self, producer: &K) -> ProducerPolicy {
        self.overrides
            .get(producer)
            .copied()
            .unwrap_or(self.defaults)
    }
}
