//! Producer policies: what a queue allows each of its producers, as defaults
//! per queue and overrides per producer, and the table of them every shard
//! keeps in memory.
//!
//! A policy is a set of optional settings; an unset one inherits (producer
//! override, then queue default, then floret's default). Policies are part of
//! the replicated state: a queue's defaults are written to every shard (each
//! shard enforces them on its own producers at apply), a producer's override
//! to its shard only. The [`PolicyTable`] mirrors what a shard's tree holds so
//! that apply and dispatch read a policy without touching sled.
//!
//! IMPLEMENTATION CAVEATS
//! - A queue's defaults are set shard by shard; while a change is being
//!   written to every shard, some shards may still apply the old one.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// What happens to a produce that would take a producer past its
/// `max_messages` or `max_bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Overflow {
    /// The produce fails (RESOURCE_EXHAUSTED with a retry hint); nothing is stored.
    #[default]
    Reject,
    /// The produce is stored and the producer's oldest messages are deleted.
    DropOldest,
    /// The produce is stored and the producer's oldest messages move to the
    /// queue's dead letters.
    DeadLetterOldest,
}

/// What happens to a message whose TTL passed before it was delivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Expiry {
    /// It moves to the queue's dead letters.
    #[default]
    DeadLetter,
    /// It is deleted.
    Drop,
}

/// Settings of one queue (defaults) or one producer (overrides); `None`
/// inherits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy {
    /// DRR quantum: messages per turn (floret's default: 1).
    pub weight: Option<u32>,
    /// Tier: producers of a higher tier are served before any of a lower
    /// one; DRR inside a tier (default 0).
    pub priority: Option<u32>,
    /// Most messages the producer may have stored (default: no limit).
    pub max_messages: Option<u64>,
    /// Most stored bytes (message, headers and timestamp encoded) (default: no limit).
    pub max_bytes: Option<u64>,
    /// What a produce over those limits does (default: reject).
    pub overflow: Option<Overflow>,
    /// Messages not delivered within this many ms of their commit expire (default: never).
    pub ttl_ms: Option<u64>,
    /// What expiry does (default: dead-letter).
    pub expiry: Option<Expiry>,
    /// Deliveries of one message before it is dead-lettered instead (default: no limit).
    pub max_attempts: Option<u32>,
    /// Deliveries of the producer leased at once; 1 keeps its order strict
    /// even across redeliveries (default: no limit).
    pub max_in_flight: Option<u32>,
    /// Messages per second the producer may produce, as a token bucket
    /// holding one second of them (default: no limit).
    pub produce_rate: Option<u32>,
}

impl Policy {
    /// This policy's settings, with `base`'s where this one leaves them unset.
    pub fn over(self, base: Policy) -> Policy {
        Policy {
            weight: self.weight.or(base.weight),
            priority: self.priority.or(base.priority),
            max_messages: self.max_messages.or(base.max_messages),
            max_bytes: self.max_bytes.or(base.max_bytes),
            overflow: self.overflow.or(base.overflow),
            ttl_ms: self.ttl_ms.or(base.ttl_ms),
            expiry: self.expiry.or(base.expiry),
            max_attempts: self.max_attempts.or(base.max_attempts),
            max_in_flight: self.max_in_flight.or(base.max_in_flight),
            produce_rate: self.produce_rate.or(base.produce_rate),
        }
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == Policy::default()
    }

    /// Whether `messages` stored messages of `bytes` are over this policy's limits.
    pub fn exceeded_by(&self, messages: u64, bytes: u64) -> bool {
        self.max_messages.is_some_and(|max| messages > max)
            || self.max_bytes.is_some_and(|max| bytes > max)
    }
}

/// The policies of one shard: every queue's defaults and the overrides of
/// the shard's producers. Its size is O(queues + producers with an override).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyTable {
    queues: HashMap<String, QueuePolicies>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct QueuePolicies {
    defaults: Policy,
    overrides: HashMap<String, Policy>,
}

impl PolicyTable {
    /// The policy in force for `producer` of `queue`: its override over the queue's defaults.
    pub fn effective(&self, queue: &str, producer: &str) -> Policy {
        match self.queues.get(queue) {
            Some(policies) => match policies.overrides.get(producer) {
                Some(own) => own.over(policies.defaults),
                None => policies.defaults,
            },
            None => Policy::default(),
        }
    }

    /// The policy stored for `queue` (`producer` None) or for one producer, as set.
    pub fn stored(&self, queue: &str, producer: Option<&str>) -> Policy {
        let Some(policies) = self.queues.get(queue) else {
            return Policy::default();
        };
        match producer {
            None => policies.defaults,
            Some(producer) => policies
                .overrides
                .get(producer)
                .copied()
                .unwrap_or_default(),
        }
    }

    /// Replaces what is stored for `queue` or one of its producers; an empty
    /// policy removes the entry.
    pub fn set(&mut self, queue: &str, producer: Option<&str>, policy: Policy) {
        let policies = self.queues.entry(queue.to_owned()).or_default();
        match producer {
            None => policies.defaults = policy,
            Some(producer) if policy.is_empty() => {
                policies.overrides.remove(producer);
            }
            Some(producer) => {
                policies.overrides.insert(producer.to_owned(), policy);
            }
        }
        if policies.defaults.is_empty() && policies.overrides.is_empty() {
            self.queues.remove(queue);
        }
    }

    /// Producers of `queue` with an override.
    pub fn overridden(&self, queue: &str) -> impl Iterator<Item = &str> {
        self.queues
            .get(queue)
            .into_iter()
            .flat_map(|policies| policies.overrides.keys().map(String::as_str))
    }

    /// Every override: `(queue, producer, policy)`.
    pub fn overrides(&self) -> impl Iterator<Item = (&str, &str, Policy)> {
        self.queues.iter().flat_map(|(queue, policies)| {
            policies
                .overrides
                .iter()
                .map(move |(producer, policy)| (queue.as_str(), producer.as_str(), *policy))
        })
    }

    /// Every queue with defaults or overrides, with its defaults.
    pub fn queues_with_defaults(&self) -> impl Iterator<Item = (&str, Policy)> {
        self.queues
            .iter()
            .map(|(queue, policies)| (queue.as_str(), policies.defaults))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producer_override_wins_and_unset_fields_inherit_the_queue_defaults() {
        let mut table = PolicyTable::default();
        table.set(
            "q",
            None,
            Policy {
                weight: Some(2),
                max_messages: Some(10),
                ..Policy::default()
            },
        );
        table.set(
            "q",
            Some("p"),
            Policy {
                weight: Some(5),
                ..Policy::default()
            },
        );
        let effective = table.effective("q", "p");
        assert_eq!(effective.weight, Some(5));
        assert_eq!(effective.max_messages, Some(10));
        assert_eq!(table.effective("q", "other").weight, Some(2));
        assert_eq!(table.effective("elsewhere", "p"), Policy::default());
    }

    #[test]
    fn empty_override_is_removed_so_idle_producers_cost_nothing() {
        let mut table = PolicyTable::default();
        let weight = Policy {
            weight: Some(3),
            ..Policy::default()
        };
        table.set("q", Some("p"), weight);
        assert_eq!(table.overridden("q").count(), 1);
        table.set("q", Some("p"), Policy::default());
        assert_eq!(table.overridden("q").count(), 0);
        assert_eq!(table, PolicyTable::default());
    }

    #[test]
    fn limits_are_exceeded_only_past_the_maximum() {
        let policy = Policy {
            max_messages: Some(2),
            max_bytes: Some(100),
            ..Policy::default()
        };
        assert!(!policy.exceeded_by(2, 100));
        assert!(policy.exceeded_by(3, 10));
        assert!(policy.exceeded_by(1, 101));
        assert!(!Policy::default().exceeded_by(u64::MAX, u64::MAX));
    }
}
