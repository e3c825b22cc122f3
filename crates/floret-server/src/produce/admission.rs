//! Whether a produce is admitted: pure decisions over figures the caller
//! has read, each refusal a [`RequestError`] with its retry hint.
//!
//! - Room: a node past its high watermark of stored bytes throttles until
//!   it is back under the low one; while it does, a producer already holding
//!   more than its fair share of the node's bytes is refused, the others
//!   are not.
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

/// A throttling node's verdict on a produce of `incoming` bytes from a
/// producer of `weight` that holds `held` bytes: admitted while it stays
/// within its fair share (the node's bytes per producer, times its weight).
pub fn admit_on_full_node(
    config: &BackpressureConfig,
    room: NodeRoom,
    producer: &str,
    weight: u32,
    held: u64,
    incoming: u64,
) -> Result<(), RequestError> {
    let share = room.stored_bytes / room.producers.max(1) * u64::from(weight.max(1));
    if held + incoming <= share {
        return Ok(());
    }
    Err(RequestError::Exhausted {
        message: format!(
            "this node stores {} bytes, over its high watermark of {}; producer {producer:?} holds {held} bytes, more than its fair share of {share}: nothing was stored, retry later (producers under their share are still accepted)",
            room.stored_bytes, config.high_watermark_bytes
        ),
        retry_after: Duration::from_millis(config.retry_after_ms),
    })
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
fn describe_limits(policy: &Policy) -> String {
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

    #[test]
    fn a_full_node_refuses_the_flood_and_admits_a_quiet_producer() {
        let config = config();
        let full = room(1_200, 4);
        let quiet = admit_on_full_node(&config, full, "quiet", 1, 0, 100);
        assert_eq!(quiet, Ok(()));
        let flood = admit_on_full_node(&config, full, "flood", 1, 1_000, 100).unwrap_err();
        assert_eq!(flood.retry_after(), Some(Duration::from_millis(250)));
        assert!(flood.to_string().contains("fair share of 300"), "{flood}");
        let weighted = admit_on_full_node(&config, full, "heavy", 4, 1_000, 100);
        assert_eq!(weighted, Ok(()), "weight 4 has four shares");
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
