//! Producer slots by index, reused through a free list, plus the key index.
//!
//! The ring and the lease heap refer to slots by [`SlotId`] rather than by key,
//! so they need no hashing and no clone of the key; the generation in the id
//! lets them notice, without a search, that the slot was freed (and maybe
//! reused by another producer) since they stored it.

use std::collections::HashMap;
use std::hash::Hash;

use crate::producer::ProducerSlot;

/// Handle of one occupancy of one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct SlotId {
    /// Position in the slab.
    index: usize,
    /// Bumped each time the slot is freed, so old handles stop matching.
    generation: u64,
}

/// One position of the slab, occupied or free.
#[derive(Debug, Clone)]
struct Entry<K> {
    /// Current occupancy's generation (the next one's while free).
    generation: u64,
    /// `None` while the position is on the free list.
    slot: Option<ProducerSlot<K>>,
}

impl SlotId {
    /// The slot's position in the slab.
    pub(crate) fn position(self) -> usize {
        self.index
    }
}

/// Slots of the producers that hold something.
#[derive(Debug, Clone)]
pub(crate) struct Slab<K> {
    /// Slots, occupied or free; never shrinks.
    entries: Vec<Entry<K>>,
    /// Free positions, reused last-freed first.
    free: Vec<usize>,
    /// Position of each occupied slot by producer key.
    by_key: HashMap<K, usize>,
}

impl<K> Slab<K> {
    /// The id of the occupied slot at `position`.
    pub(crate) fn id_at(&self, position: usize) -> SlotId {
        SlotId {
            index: position,
            generation: self.entries[position].generation,
        }
    }

    /// The occupied slot at `position` (rings link occupied slots only).
    pub(crate) fn at(&self, position: usize) -> &ProducerSlot<K> {
        self.entries[position]
            .slot
            .as_ref()
            .expect("a linked position is occupied")
    }

    /// The occupied slot at `position`, to change.
    pub(crate) fn at_mut(&mut self, position: usize) -> &mut ProducerSlot<K> {
        self.entries[position]
            .slot
            .as_mut()
            .expect("a linked position is occupied")
    }
}

impl<K: Clone + Eq + Hash> Slab<K> {
    /// An empty slab.
    pub(crate) fn new() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            by_key: HashMap::new(),
        }
    }

    /// The id of `key`'s slot, if it has one.
    pub(crate) fn id_of(&self, key: &K) -> Option<SlotId> {
        let index = *self.by_key.get(key)?;
        Some(SlotId {
            index,
            generation: self.entries[index].generation,
        })
    }

    /// `key`'s slot, if it has one.
    pub(crate) fn by_key(&self, key: &K) -> Option<&ProducerSlot<K>> {
        let index = *self.by_key.get(key)?;
        self.entries[index].slot.as_ref()
    }

    /// The slot `id` names, unless it was freed since.
    pub(crate) fn get(&self, id: SlotId) -> Option<&ProducerSlot<K>> {
        let entry = self.entries.get(id.index)?;
        (entry.generation == id.generation)
            .then_some(entry.slot.as_ref())
            .flatten()
    }

    /// The slot `id` names, unless it was freed since.
    pub(crate) fn get_mut(&mut self, id: SlotId) -> Option<&mut ProducerSlot<K>> {
        let entry = self.entries.get_mut(id.index)?;
        (entry.generation == id.generation)
            .then_some(entry.slot.as_mut())
            .flatten()
    }

    /// `key`'s slot, created by `make` if it has none.
    pub(crate) fn get_or_insert_with(
        &mut self,
        key: &K,
        make: impl FnOnce() -> ProducerSlot<K>,
    ) -> (SlotId, &mut ProducerSlot<K>) {
        let index = match self.by_key.get(key) {
            Some(&index) => index,
            None => self.insert(make()),
        };
        let entry = &mut self.entries[index];
        let id = SlotId {
            index,
            generation: entry.generation,
        };
        let slot = entry
            .slot
            .as_mut()
            .expect("a position in the key index is occupied");
        (id, slot)
    }

    /// Stores a slot for a producer that has none; returns its position.
    fn insert(&mut self, slot: ProducerSlot<K>) -> usize {
        let key = slot.key.clone();
        let index = match self.free.pop() {
            Some(index) => {
                self.entries[index].slot = Some(slot);
                index
            }
            None => {
                self.entries.push(Entry {
                    generation: 0,
                    slot: Some(slot),
                });
                self.entries.len() - 1
            }
        };
        self.by_key.insert(key, index);
        index
    }

    /// Frees the slot `id` names; every id of this occupancy goes stale.
    pub(crate) fn remove(&mut self, id: SlotId) -> Option<ProducerSlot<K>> {
        let entry = self.entries.get_mut(id.index)?;
        if entry.generation != id.generation {
            return None;
        }
        let slot = entry.slot.take()?;
        entry.generation += 1;
        self.free.push(id.index);
        self.by_key.remove(&slot.key);
        Some(slot)
    }

    /// Keys of the occupied slots.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.by_key.keys()
    }

    /// Number of occupied slots.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether no slot is taken.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::ProducerPolicy;

    #[test]
    fn reused_slot_does_not_answer_to_old_id() {
        let mut slab = Slab::new();
        let (a, _) =
            slab.get_or_insert_with(&"a", || ProducerSlot::new("a", ProducerPolicy::default()));
        assert!(slab.remove(a).is_some());
        let (b, _) =
            slab.get_or_insert_with(&"b", || ProducerSlot::new("b", ProducerPolicy::default()));
        assert_eq!(a.index, b.index);
        assert!(slab.get(a).is_none());
        assert!(slab.remove(a).is_none());
        assert_eq!(slab.get(b).map(|slot| slot.key), Some("b"));
        assert_eq!(slab.id_of(&"b"), Some(b));
    }

    #[test]
    fn existing_slot_is_not_replaced() {
        let mut slab = Slab::new();
        let (a, slot) =
            slab.get_or_insert_with(&"a", || ProducerSlot::new("a", ProducerPolicy::default()));
        slot.weight = 5;
        let (again, slot) =
            slab.get_or_insert_with(&"a", || ProducerSlot::new("a", ProducerPolicy::default()));
        assert_eq!((again, slot.weight), (a, 5));
        assert_eq!(slab.len(), 1);
    }

    #[test]
    fn removed_slot_drops_its_key() {
        let mut slab = Slab::new();
        let (a, _) =
            slab.get_or_insert_with(&"a", || ProducerSlot::new("a", ProducerPolicy::default()));
        slab.remove(a);
        assert_eq!(slab.id_of(&"a"), None);
        assert!(slab.by_key(&"a").is_none());
        assert_eq!(slab.len(), 0);
    }
}
