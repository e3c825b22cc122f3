//! What a shard stores, kept up to date by every apply so that
//! backpressure and tenant limits read it without a scan: over all its
//! producers ([`BacklogTotals`]), and per producer group of a queue
//! ([`GroupTotals`]; a group is the part of a producer id before
//! [`PRODUCER_GROUP_SEPARATOR`], a tenant on a node with token keys).
//!
//! IMPLEMENTATION CAVEATS
//! - Group totals sit behind one lock per shard, taken once per applied
//!   batch and once per read.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the shard stores over all its producers, and per producer group,
/// kept up to date by every apply so that backpressure and tenant limits
/// read it without a scan.
#[derive(Debug, Default)]
pub struct BacklogTotals {
    bytes: AtomicU64,
    messages: AtomicU64,
    producers: AtomicU64,
    /// By queue, then producer group; groups holding nothing are left out.
    groups: Mutex<HashMap<String, HashMap<String, GroupTotals>>>,
}

/// Separates a producer id's group from the rest (`acme/orders-1` is in
/// group `acme`): a node with token keys stores its tenants' producers so.
pub const PRODUCER_GROUP_SEPARATOR: char = '/';

/// The group of a stored producer id: the part before the first
/// [`PRODUCER_GROUP_SEPARATOR`], empty for an id without one.
pub fn producer_group(producer: &str) -> &str {
    producer
        .split_once(PRODUCER_GROUP_SEPARATOR)
        .map_or("", |(group, _)| group)
}

/// What the producers of one group of a queue store in a shard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupTotals {
    /// Stored messages (in flight included).
    pub messages: u64,
    /// Their stored bytes.
    pub bytes: u64,
    /// Producers of the group with at least one stored message.
    pub producers: u64,
}

impl GroupTotals {
    /// These totals once a producer went from `before` to `after` (bytes, messages).
    pub(crate) fn changed(self, before: (u64, u64), after: (u64, u64)) -> Self {
        Self {
            messages: (self.messages + after.1).saturating_sub(before.1),
            bytes: (self.bytes + after.0).saturating_sub(before.0),
            producers: (self.producers + u64::from(after.1 > 0))
                .saturating_sub(u64::from(before.1 > 0)),
        }
    }
}

impl BacklogTotals {
    /// Stored bytes of every producer's messages.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Stored messages.
    pub fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }

    /// Producers with at least one stored message.
    pub fn producers(&self) -> u64 {
        self.producers.load(Ordering::Relaxed)
    }

    /// A producer went from `before` to `after` (bytes, messages).
    pub(crate) fn changed(&self, before: (u64, u64), after: (u64, u64)) {
        self.bytes
            .fetch_add(after.0.wrapping_sub(before.0), Ordering::Relaxed);
        self.messages
            .fetch_add(after.1.wrapping_sub(before.1), Ordering::Relaxed);
        match (before.1 > 0, after.1 > 0) {
            (false, true) => {
                self.producers.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.producers.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Producers `(queue, producer)` went from `before` to `after` (bytes,
    /// messages), in their groups' totals.
    pub(crate) fn groups_changed<'a>(
        &self,
        changes: impl IntoIterator<Item = (&'a str, &'a str, (u64, u64), (u64, u64))>,
    ) {
        let mut groups = self.groups.lock().expect("group totals lock");
        for (queue, producer, before, after) in changes {
            if before == after {
                continue;
            }
            let group = producer_group(producer);
            if !groups.contains_key(queue) {
                groups.insert(queue.to_owned(), HashMap::new());
            }
            let of_queue = groups.get_mut(queue).expect("inserted above");
            let totals = of_queue
                .get(group)
                .copied()
                .unwrap_or_default()
                .changed(before, after);
            if totals == GroupTotals::default() {
                of_queue.remove(group);
            } else {
                of_queue.insert(group.to_owned(), totals);
            }
            if of_queue.is_empty() {
                groups.remove(queue);
            }
        }
    }

    /// What the producers of `group` in `queue` store in this shard.
    pub fn group(&self, queue: &str, group: &str) -> GroupTotals {
        let groups = self.groups.lock().expect("group totals lock");
        groups
            .get(queue)
            .and_then(|of_queue| of_queue.get(group))
            .copied()
            .unwrap_or_default()
    }

    /// Calls `each` with every group holding messages: `(queue, group, totals)`.
    pub fn for_each_group(&self, mut each: impl FnMut(&str, &str, GroupTotals)) {
        let groups = self.groups.lock().expect("group totals lock");
        for (queue, of_queue) in groups.iter() {
            for (group, totals) in of_queue {
                each(queue, group, *totals);
            }
        }
    }

    pub(crate) fn reset(
        &self,
        bytes: u64,
        messages: u64,
        producers: u64,
        groups: HashMap<String, HashMap<String, GroupTotals>>,
    ) {
        self.bytes.store(bytes, Ordering::Relaxed);
        self.messages.store(messages, Ordering::Relaxed);
        self.producers.store(producers, Ordering::Relaxed);
        *self.groups.lock().expect("group totals lock") = groups;
    }
}
