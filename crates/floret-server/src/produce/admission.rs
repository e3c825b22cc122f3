//! Whether a produce is admitted: pure decisions over figures the caller
//! has read, each refusal a [`RequestError`] with its retry hint.
//!
//! - Room: a node past its high watermark of stored bytes throttles until
//!   it is back under the low one; while it does, a producer already holding
//!   more than its fair share of the node's bytes is refused, the others
//!   are not. On a node with tenants the share is the tenant's first (the
//!   node's bytes per tenant holding some, times the tenant's weight), then
//!   the producer's within its tenant's share, so opening more producers
//!   does not earn a tenant more room.
//! - Rate: a producer over its `produce_rate` waits for its token bucket
//!   (`rate.rs` keeps the buckets).
//! - Limits: a producer whose `max_messages` / `max_bytes` a produce would
//!   pass is refused when the state machine applies it ([`over_limit`]).
//! - Disk: a node whose data dir's filesystem has less than
//!   `storage.min_free_bytes` free refuses every produce ([`check_disk`]).
//!
//! IMPLEMENTATION CAVEATS
//! - Every producer over its share is throttled at once, not the one most
//!   over it first.
//! - Shares use the producer's own weight against an unweighted average, so
//!   weights are approximate while producers of different weights flood.

use std::time::Duration;

use floret_proto::v1;
use floret_store::policy::Policy;

use crate::config::BackpressureConfig;
use crate::error::{OVER_LIMIT_RETRY_AFTER, RequestError};
use crate::request::InvalidRequest;

/// The bytes stored on a node and the producers holding them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRoom {
    /// Bytes stored over every shard replica the node holds.
    pub stored_bytes: u64,
    /// Producers with messages stored there.
    pub producers: u64,
}

/// Whether a node with `room` throttles, given whether it did (between the
/// watermarks it keeps doing what it did).
pub fn throttles(config: &BackpressureConfig, room: NodeRoom, throttled: bool) -> bool {
    if room.stored_bytes >= config.high_watermark_bytes {
        true
    } else if room.stored_bytes <= config.low_watermark_bytes {
        false
    } else {
        throttled
    }
}

/// What a producer's tenant holds on a node, over all its queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantHolding<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// Its weight in the queue produced into.
    pub weight: u32,
    /// Bytes its producers store on the node.
    pub bytes: u64,
    /// Its producers with messages stored there.
    pub producers: u64,
    /// Tenants with messages stored on the node.
    pub tenants: u64,
}

/// A producer asking a throttling node to store `incoming` more bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimant<'a> {
    /// Its id.
    pub producer: &'a str,
    /// Its weight.
    pub weight: u32,
    /// Bytes it stores on the node's shard.
    pub held: u64,
    /// Bytes the produce would store.
    pub incoming: u64,
    /// Its tenant's holding, on a node with tenants.
    pub tenant: Option<TenantHolding<'a>>,
}

/// A throttling node's verdict on a produce: admitted while the producer
/// stays within its fair share. Without tenants that is the node's bytes
/// per producer, times its weight; with tenants, its tenant must stay
/// within the node's bytes per tenant times the tenant's weight, and the
/// producer within that share per producer of the tenant, times its weight.
pub fn admit_on_full_node(
    config: &BackpressureConfig,
    room: NodeRoom,
    claimant: Claimant<'_>,
) -> Result<(), RequestError> {
    let Claimant {
        producer,
        weight,
        held,
        incoming,
        tenant,
    } = claimant;
    let refused = |whose: String| RequestError::Exhausted {
        message: format!(
            "this node stores {} bytes, over its high watermark of {}; {whose}: nothing was stored, retry later (producers under their share are still accepted)",
            room.stored_bytes, config.high_watermark_bytes
        ),
        retry_after: Duration::from_millis(config.retry_after_ms),
    };
    let share = match tenant {
        None => room.stored_bytes / room.producers.max(1) * u64::from(weight.max(1)),
        Some(tenant) => {
            let tenant_share =
                room.stored_bytes / tenant.tenants.max(1) * u64::from(tenant.weight.max(1));
            if tenant.bytes + incoming > tenant_share {
                return Err(refused(format!(
                    "tenant {:?} holds {} bytes, more than its fair share of {tenant_share}",
                    tenant.tenant, tenant.bytes
                )));
            }
            tenant_share / tenant.producers.max(1) * u64::from(weight.max(1))
        }
    };
    if held + incoming <= share {
        return Ok(());
    }
    Err(refused(format!(
        "producer {producer:?} holds {held} bytes, more than its fair share of {share}"
    )))
}

/// Wait suggested while the disk is short of room: about one free-space sample.
pub const DISK_FULL_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Refuses a produce while the data dir's filesystem has `free_bytes`, less
/// than `min_free_bytes`.
pub fn check_disk(free_bytes: u64, min_free_bytes: u64) -> Result<(), RequestError> {
    if free_bytes >= min_free_bytes {
        return Ok(());
    }
    Err(RequestError::Exhausted {
        message: format!(
            "disk: this node's data dir has {free_bytes} bytes free, below storage.min_free_bytes ({min_free_bytes}); nothing was stored, produces are refused until space returns (acks and consumes go on)"
        ),
        retry_after: DISK_FULL_RETRY_AFTER,
    })
}

/// A producer over its `produce_rate`, which has tokens again in `wait`.
pub fn over_rate(producer: &str, rate: u32, wait: Duration) -> RequestError {
    RequestError::Exhausted {
        message: format!(
            "producer {producer:?} is over its produce_rate of {rate} messages/s; nothing was stored, retry later"
        ),
        retry_after: wait,
    }
}

/// A produce of `count` messages (`batch_bytes` stored) that the state
/// machine refused: the producer holds `messages` (`bytes`) and `limits`
/// would be passed. A batch over the limits by itself can never be stored.
pub fn over_limit(
    producer: &str,
    count: usize,
    batch_bytes: u64,
    held: (u64, u64),
    limits: &Policy,
) -> RequestError {
    let (messages, bytes) = held;
    if limits.exceeded_by(count as u64, batch_bytes) {
        return InvalidRequest::BatchOverLimit {
            count,
            producer: producer.to_owned(),
            limits: describe_limits(limits),
        }
        .into();
    }
    RequestError::Exhausted {
        message: format!(
            "producer {producer:?} holds {messages} messages ({bytes} bytes) and this produce of {count} would pass its limit ({}); nothing was stored, retry once consumers have drained it",
            describe_limits(limits)
        ),
        retry_after: OVER_LIMIT_RETRY_AFTER,
    }
}

/// About the bytes a message takes once stored (payload, headers, timestamp).
pub fn stored_size_estimate(message: &v1::Message) -> u64 {
    let headers: usize = message
        .headers
        .iter()
        .map(|(key, value)| key.len() + value.len() + 2)
        .sum();
    (message.payload.len() + headers + 12) as u64
}

/// "max_messages 10, max_bytes 4096" for the limits a policy sets.
pub(super) fn describe_limits(policy: &Policy) -> String {
    let mut limits = Vec::new();
    if let Some(max) = policy.max_messages {
        limits.push(format!("max_messages {max}"));
    }
    if let Some(max) = policy.max_bytes {
        limits.push(format!("max_bytes {max}"));
    }
    limits.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BackpressureConfig {
        BackpressureConfig {
            high_watermark_bytes: 1_000,
            low_watermark_bytes: 800,
            retry_after_ms: 250,
        }
    }

    fn room(stored_bytes: u64, producers: u64) -> NodeRoom {
        NodeRoom {
            stored_bytes,
            producers,
        }
    }

    #[test]
    fn produce_fills_the_disk_to_the_last_byte() {
        assert!(check_disk(1_000, 1_000).is_ok());
        let refused = check_disk(999, 1_000).unwrap_err();
        assert!(refused.to_string().starts_with("disk:"), "{refused}");
        assert_eq!(refused.retry_after(), Some(DISK_FULL_RETRY_AFTER));
    }

    #[test]
    fn throttling_starts_at_the_high_watermark_and_ends_at_the_low_one() {
        let config = config();
        assert!(!throttles(&config, room(999, 1), false));
        assert!(throttles(&config, room(1_000, 1), false));
        assert!(
            throttles(&config, room(801, 1), true),
            "between: keeps throttling"
        );
        assert!(
            !throttles(&config, room(801, 1), false),
            "between: keeps admitting"
        );
        assert!(!throttles(&config, room(800, 1), true));
    }

    fn claimant(producer: &str, weight: u32, held: u64, incoming: u64) -> Claimant<'_> {
        Claimant {
            producer,
            weight,
            held,
            incoming,
            tenant: None,
        }
    }

    #[test]
    fn a_full_node_refuses_the_flood_and_admits_a_quiet_producer() {
        let config = config();
        let full = room(1_200, 4);
        let quiet = admit_on_full_node(&config, full, claimant("quiet", 1, 0, 100));
        assert_eq!(quiet, Ok(()));
        let flood =
            admit_on_full_node(&config, full, claimant("flood", 1, 1_000, 100)).unwrap_err();
        assert_eq!(flood.retry_after(), Some(Duration::from_millis(250)));
        assert!(flood.to_string().contains("fair share of 300"), "{flood}");
        let weighted = admit_on_full_node(&config, full, claimant("heavy", 4, 1_000, 100));
        assert_eq!(weighted, Ok(()), "weight 4 has four shares");
    }

    #[test]
    fn a_tenant_with_a_hundred_producers_gets_no_more_room_than_a_tenant_with_one() {
        let config = config();
        let full = room(2_000, 101);
        let of_tenant = |tenant, weight, bytes, producers| TenantHolding {
            tenant,
            weight,
            bytes,
            producers,
            tenants: 2,
        };
        let sybil = Claimant {
            tenant: Some(of_tenant("sybil", 1, 1_500, 100)),
            ..claimant("sybil/p7", 1, 0, 10)
        };
        let refused = admit_on_full_node(&config, full, sybil).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("tenant \"sybil\" holds 1500 bytes, more than its fair share of 1000"),
            "a producer holding nothing is still refused while its tenant is over: {refused}"
        );
        let honest = Claimant {
            tenant: Some(of_tenant("honest", 1, 500, 1)),
            ..claimant("honest/only", 1, 500, 10)
        };
        assert_eq!(
            admit_on_full_node(&config, full, honest),
            Ok(()),
            "per producer it holds 25 times the node's average, per tenant it is under"
        );
        let weighted = Claimant {
            tenant: Some(of_tenant("sybil", 3, 1_500, 100)),
            ..claimant("sybil/p7", 1, 0, 10)
        };
        assert_eq!(admit_on_full_node(&config, full, weighted), Ok(()));
        let hog_inside = Claimant {
            tenant: Some(of_tenant("honest", 1, 500, 2)),
            ..claimant("honest/hog", 1, 490, 20)
        };
        let refused = admit_on_full_node(&config, full, hog_inside).unwrap_err();
        assert!(
            refused.to_string().contains(
                "producer \"honest/hog\" holds 490 bytes, more than its fair share of 500"
            ),
            "inside its tenant's share a producer gets its own: {refused}"
        );
    }

    #[test]
    fn a_batch_over_the_limits_by_itself_is_invalid_not_retryable() {
        let limits = Policy {
            max_messages: Some(10),
            ..Policy::default()
        };
        let never = over_limit("p", 11, 100, (0, 0), &limits);
        assert!(matches!(never, RequestError::Invalid(_)), "{never:?}");
        assert_eq!(never.retry_after(), None);
        let later = over_limit("p", 5, 100, (8, 800), &limits);
        assert_eq!(later.retry_after(), Some(OVER_LIMIT_RETRY_AFTER));
        assert!(later.to_string().contains("max_messages 10"), "{later}");
    }
}
