//! The scheduler: deficit round robin over producers in priority tiers, and
//! delivery leases.
//!
//! A producer is in its tier's ring while it has something ready and fewer
//! leases than its `max_in_flight`. The highest tier with a producer in its
//! ring is served; inside it, the front producer gets `weight` credits on its
//! turn (when it has none left over), each dispatch spends one, and it goes to
//! the back when they run out or leaves the ring when it has nothing ready or
//! reached its in-flight limit. Every operation touches one slot and the
//! front of one ring (plus a look over the few tiers in use), so cost does not
//! grow with the number of producers; the lease heap adds O(log leases) per
//! dispatch and per expiry. Settling and expiring leases is `leases.rs`.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::ops::Range;
use std::time::Instant;

use crate::config::SchedulerConfig;
use crate::dispatch::Dispatch;
use crate::lease_heap::{LeaseEntry, LeaseHeap};
use crate::producer::{ProducerPolicy, ProducerSlot, ProducerView};
use crate::ring::{Ring, RingEntry};
use crate::slab::{Slab, SlotId};

mod leases;
#[cfg(test)]
mod tests;

/// Fair order and leases for the messages of one queue (on the node leading
/// its shard); see the crate docs for how the server drives it.
#[derive(Debug, Clone)]
pub struct Scheduler<K> {
    /// Lease timeout.
    config: SchedulerConfig,
    /// How producers without an override are scheduled.
    defaults: ProducerPolicy,
    /// Producers holding something ready or leased.
    slots: Slab<K>,
    /// Policy overrides, kept even for producers without a slot.
    overrides: HashMap<K, ProducerPolicy>,
    /// Per priority tier, its eligible producers in turn order.
    tiers: BTreeMap<u32, Ring>,
    /// Lease deadlines, for `expire` and `next_deadline`.
    lease_heap: LeaseHeap,
    /// Deliverable messages over all slots.
    ready: u64,
    /// Leased messages over all slots.
    in_flight: u64,
}

/// How producers without an override are scheduled before any policy is set.
fn initial_defaults(config: &SchedulerConfig) -> ProducerPolicy {
    ProducerPolicy {
        weight: config.default_weight.max(1),
        ..ProducerPolicy::default()
    }
}

impl<K: Clone + Eq + Hash> Scheduler<K> {
    /// A scheduler holding nothing.
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            defaults: initial_defaults(&config),
            config,
            slots: Slab::new(),
            overrides: HashMap::new(),
            tiers: BTreeMap::new(),
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
        let (overrides, defaults) = (&self.overrides, self.defaults);
        let (id, slot) = self.slots.get_or_insert_with(producer, || {
            let policy = overrides.get(producer).copied().unwrap_or(defaults);
            ProducerSlot::new(producer.clone(), policy)
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

    /// Whether it holds nothing a new scheduler would not: no producer with
    /// messages or leases, no override, the defaults it started with. Such
    /// a scheduler can be dropped and made again when needed. O(1).
    pub fn holds_nothing(&self) -> bool {
        self.slots.is_empty()
            && self.overrides.is_empty()
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
        if slot.in_ring && slot.ready() == 0 {
            slot.in_ring = false;
            slot.deficit = 0;
            self.tiers
                .get_mut(&slot.priority)
                .expect("a producer in a ring has its tier")
                .forget(slot.weight);
        }
        if slot.is_empty() {
            self.slots.remove(id);
            self.discard_stale_leases();
        }
        dropped
    }

    /// Next message to deliver, chosen by deficit round robin and leased until
    /// `now + lease_timeout`. `None` when nothing is ready. O(1) amortised
    /// (plus O(log leases) for the lease heap).
    pub fn next(&mut self, now: Instant) -> Option<Dispatch<K>> {
        let (tier, id) = self.front_of_rings()?;
        let slot = self.slots.get_mut(id)?;
        let (sequence, attempt) = slot.lease_next()?;
        if slot.deficit == 0 {
            slot.deficit = slot.weight;
        }
        slot.deficit -= 1;
        let ring = self.tiers.get_mut(&tier).expect("front found in this tier");
        if !slot.eligible() {
            slot.in_ring = false;
            slot.deficit = 0;
            ring.leave_front(slot.weight);
        } else if slot.deficit == 0 {
            ring.rotate();
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

    /// The producer's messages are gone (e.g. its shard moved away): its slot,
    /// ring entry and leases are dropped. Its weight override stays. Returns
    /// how many leases it held, so a caller that mirrors leases elsewhere
    /// knows whether there is anything of this producer to drop there.
    pub fn forget(&mut self, producer: &K) -> u64 {
        let Some(id) = self.slots.id_of(producer) else {
            return 0;
        };
        let Some(slot) = self.slots.remove(id) else {
            return 0;
        };
        let leased = slot.in_flight();
        if slot.in_ring
            && let Some(ring) = self.tiers.get_mut(&slot.priority)
        {
            ring.forget(slot.weight);
        }
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
        self.tiers.values().map(Ring::producers).sum()
    }

    /// Sum of the weights of producers in the rings, which each node reports
    /// to the merges of its consumers so they split credit between nodes.
    pub fn backlogged_weight(&self) -> u64 {
        self.tiers.values().map(Ring::weight).sum()
    }

    /// Deliverable (not leased) messages over all producers.
    pub fn ready_messages(&self) -> u64 {
        self.ready
    }

    /// Leased messages over all producers.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The tier served now and the producer whose turn it is there: the
    /// front of the highest tier with a live entry, dropping stale entries
    /// (and drained tiers) on the way.
    fn front_of_rings(&mut self) -> Option<(u32, SlotId)> {
        let mut drained = false;
        let mut found = None;
        for (&tier, ring) in self.tiers.iter_mut().rev() {
            while let Some(entry) = ring.front() {
                if self.slots.get(entry.slot).is_some_and(|slot| {
                    slot.in_ring && slot.ticket == entry.ticket && slot.priority == tier
                }) {
                    found = Some((tier, entry.slot));
                    break;
                }
                ring.drop_stale_front();
            }
            if found.is_some() {
                break;
            }
            drained |= ring.entries() == 0;
        }
        if drained {
            self.tiers.retain(|_, ring| ring.entries() > 0);
        }
        found
    }

    /// The policy `producer` gets: its override, else the defaults.
    fn policy_of(&self, producer: &K) -> ProducerPolicy {
        self.overrides
            .get(producer)
            .copied()
            .unwrap_or(self.defaults)
    }

    /// Puts slot `id` at the back of its tier's ring if it belongs there and is not in it.
    fn join_if_eligible(&mut self, id: SlotId) {
        let Some(slot) = self.slots.get_mut(id) else {
            return;
        };
        if slot.in_ring || !slot.eligible() {
            return;
        }
        slot.in_ring = true;
        slot.ticket = slot.ticket.wrapping_add(1);
        self.tiers.entry(slot.priority).or_default().join(
            RingEntry {
                slot: id,
                ticket: slot.ticket,
            },
            slot.weight,
        );
    }

    /// Applies a changed policy to slot `id`: a new tier or a reached
    /// in-flight limit takes it out of its ring (its entry goes stale), and
    /// it joins again where it now belongs.
    fn reschedule(&mut self, id: SlotId, policy: ProducerPolicy) {
        let Some(slot) = self.slots.get_mut(id) else {
            return;
        };
        let was_in_ring = slot.in_ring;
        let (old_tier, old_weight) = (slot.priority, slot.weight);
        slot.adopt(policy);
        if was_in_ring {
            let ring = self
                .tiers
                .get_mut(&old_tier)
                .expect("a producer in a ring has its tier");
            if slot.priority == old_tier && slot.eligible() {
                ring.reweigh(old_weight, slot.weight);
                return;
            }
            ring.forget(old_weight);
            slot.in_ring = false;
            slot.deficit = 0;
        }
        self.join_if_eligible(id);
    }
}
