//! The producers of one tenant in one tier, in turn order, as a circular
//! list threaded through their slots ([`RingLinks`]): the ring itself holds
//! only its front and its totals.
//!
//! A turn moves the front to the next slot, which is the slot served next
//! anyway, so a decision reads no memory beyond the slots it serves. With a
//! buffer of entries per tenant instead, every decision at a million
//! producers over ten thousand tenants missed the cache on a different
//! tenant's buffer, and the two-level scheduler ran at a quarter of the
//! one-level one. A producer leaves from anywhere in O(1): its neighbours
//! are linked to each other, so no stale entry stays behind.

use crate::slab::Slab;

/// A slot's neighbours in its tenant's ring, as slab positions; only
/// meaningful while the slot is in a ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RingLinks {
    /// The producer served before this one (the back, for the front).
    pub(crate) prev: usize,
    /// The producer served after this one.
    pub(crate) next: usize,
}

/// The front of one circular list of producer slots, and its totals.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProducerRing {
    /// The slab position of the producer whose turn it is.
    front: Option<usize>,
    /// Producers in the ring.
    members: usize,
    /// Sum of their weights.
    weight: u64,
}

impl ProducerRing {
    /// Puts the producer at slab position `position`, not in any ring, at
    /// the back: it is served after every producer already in the ring.
    pub(crate) fn join<K>(&mut self, slots: &mut Slab<K>, position: usize, weight: u32) {
        let links = match self.front {
            None => {
                self.front = Some(position);
                RingLinks {
                    prev: position,
                    next: position,
                }
            }
            Some(front) => {
                let back = slots.at(front).ring_links.prev;
                slots.at_mut(back).ring_links.next = position;
                slots.at_mut(front).ring_links.prev = position;
                RingLinks {
                    prev: back,
                    next: front,
                }
            }
        };
        slots.at_mut(position).ring_links = links;
        self.members += 1;
        self.weight += u64::from(weight);
    }

    /// The slab position of the producer whose turn it is.
    pub(crate) fn front(&self) -> Option<usize> {
        self.front
    }

    /// The front producer spent its credits: the next one's turn begins.
    pub(crate) fn rotate<K>(&mut self, slots: &Slab<K>) {
        if let Some(front) = self.front {
            self.front = Some(slots.at(front).ring_links.next);
        }
    }

    /// The producer at `position`, in this ring, leaves it; when it was the
    /// front, the next producer's turn begins.
    pub(crate) fn leave<K>(&mut self, slots: &mut Slab<K>, position: usize, weight: u32) {
        self.members -= 1;
        self.weight -= u64::from(weight);
        if self.members == 0 {
            self.front = None;
            return;
        }
        let RingLinks { prev, next } = slots.at(position).ring_links;
        slots.at_mut(prev).ring_links.next = next;
        slots.at_mut(next).ring_links.prev = prev;
        if self.front == Some(position) {
            self.front = Some(next);
        }
    }

    /// A producer in the ring changed weight.
    pub(crate) fn reweigh(&mut self, old: u32, new: u32) {
        self.weight = self.weight - u64::from(old) + u64::from(new);
    }

    /// Producers in the ring.
    pub(crate) fn members(&self) -> usize {
        self.members
    }

    /// Sum of their weights.
    pub(crate) fn weight(&self) -> u64 {
        self.weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::{ProducerPolicy, ProducerSlot};

    /// A slab holding `keys`, each at the position of its index.
    fn slab_of(keys: &[&'static str]) -> Slab<&'static str> {
        let mut slab = Slab::new();
        for key in keys {
            slab.get_or_insert_with(key, || ProducerSlot::new(*key, ProducerPolicy::default()));
        }
        slab
    }

    /// The ring's members from the front, following the links.
    fn turn_order(ring: &ProducerRing, slots: &Slab<&'static str>) -> Vec<&'static str> {
        let mut order = Vec::new();
        let Some(front) = ring.front() else {
            return order;
        };
        let mut position = front;
        for _ in 0..ring.members() {
            order.push(slots.at(position).key);
            position = slots.at(position).ring_links.next;
        }
        assert_eq!(position, front, "the links close the circle");
        order
    }

    #[test]
    fn joiners_are_served_after_everyone_already_waiting() {
        let mut slots = slab_of(&["a", "b", "c"]);
        let mut ring = ProducerRing::default();
        for position in 0..3 {
            ring.join(&mut slots, position, 1);
        }
        ring.rotate(&slots);
        assert_eq!(turn_order(&ring, &slots), ["b", "c", "a"]);
        ring.leave(&mut slots, 2, 1);
        ring.join(&mut slots, 2, 1);
        assert_eq!(turn_order(&ring, &slots), ["b", "a", "c"]);
    }

    #[test]
    fn a_front_that_leaves_hands_the_turn_to_the_next() {
        let mut slots = slab_of(&["a", "b", "c"]);
        let mut ring = ProducerRing::default();
        for position in 0..3 {
            ring.join(&mut slots, position, 2);
        }
        ring.leave(&mut slots, 0, 2);
        assert_eq!(turn_order(&ring, &slots), ["b", "c"]);
        assert_eq!((ring.members(), ring.weight), (2, 4));
        ring.leave(&mut slots, 2, 2);
        ring.leave(&mut slots, 1, 2);
        assert_eq!(ring.front(), None);
        assert_eq!((ring.members(), ring.weight), (0, 0));
        ring.join(&mut slots, 1, 3);
        assert_eq!(turn_order(&ring, &slots), ["b"]);
    }
}
