//! Producer policies as the node uses them: checked and converted from the
//! wire, mapped onto the scheduler, and the produce-rate token buckets.
//!
//! The policies themselves are replicated state ([`floret_store::policy`]);
//! this module owns what is not: the token buckets of `produce_rate`, which
//! live on the shard's leader in memory.
//!
//! IMPLEMENTATION CAVEATS
//! - Token buckets start full on a new leader, so a failover grants each
//!   rate-limited producer one more second of burst.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use floret_proto::v1;
use floret_sched::ProducerPolicy;
use floret_store::policy::{Expiry, Overflow, Policy};
use tonic::Status;

use crate::service::status::RETRY_AFTER_MS;

/// A policy from the wire, refusing settings that cannot work (a zero
/// weight, a zero TTL...) with INVALID_ARGUMENT.
pub fn from_wire(policy: Option<v1::Policy>) -> Result<Policy, Status> {
    let Some(policy) = policy else {
        return Ok(Policy::default());
    };
    let overflow = match v1::Overflow::try_from(policy.overflow) {
        Ok(v1::Overflow::Unset) => None,
        Ok(v1::Overflow::Reject) => Some(Overflow::Reject),
        Ok(v1::Overflow::DropOldest) => Some(Overflow::DropOldest),
        Ok(v1::Overflow::DeadLetterOldest) => Some(Overflow::DeadLetterOldest),
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "unknown overflow action {}",
                policy.overflow
            )));
        }
    };
    let expiry = match v1::Expiry::try_from(policy.expiry) {
        Ok(v1::Expiry::Unset) => None,
        Ok(v1::Expiry::DeadLetter) => Some(Expiry::DeadLetter),
        Ok(v1::Expiry::Drop) => Some(Expiry::Drop),
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "unknown expiry action {}",
                policy.expiry
            )));
        }
    };
    Ok(Policy {
        weight: at_least_one("weight", policy.weight)?,
        priority: policy.priority,
        max_messages: at_least_one("max_messages", policy.max_messages)?,
        max_bytes: at_least_one("max_bytes", policy.max_bytes)?,
        overflow,
        ttl_ms: at_least_one("ttl_ms", policy.ttl_ms)?,
        expiry,
        max_attempts: at_least_one("max_attempts", policy.max_attempts)?,
        max_in_flight: at_least_one("max_in_flight", policy.max_in_flight)?,
        produce_rate: at_least_one("produce_rate", policy.produce_rate)?,
    })
}

/// A setting that must be at least 1 when it is set.
fn at_least_one<T: PartialEq + From<u8>>(
    name: &str,
    value: Option<T>,
) -> Result<Option<T>, Status> {
    if value.as_ref() == Some(&T::from(0)) {
        return Err(Status::invalid_argument(format!(
            "{name} must be at least 1 (leave it unset to inherit)"
        )));
    }
    Ok(value)
}

/// A policy on the wire.
pub fn to_wire(policy: Policy) -> v1::Policy {
    v1::Policy {
        weight: policy.weight,
        priority: policy.priority,
        max_messages: policy.max_messages,
        max_bytes: policy.max_bytes,
        overflow: match policy.overflow {
            None => v1::Overflow::Unset,
            Some(Overflow::Reject) => v1::Overflow::Reject,
            Some(Overflow::DropOldest) => v1::Overflow::DropOldest,
            Some(Overflow::DeadLetterOldest) => v1::Overflow::DeadLetterOldest,
        } as i32,
        ttl_ms: policy.ttl_ms,
        expiry: match policy.expiry {
            None => v1::Expiry::Unset,
            Some(Expiry::DeadLetter) => v1::Expiry::DeadLetter,
            Some(Expiry::Drop) => v1::Expiry::Drop,
        } as i32,
        max_attempts: policy.max_attempts,
        max_in_flight: policy.max_in_flight,
        produce_rate: policy.produce_rate,
    }
}

/// Every setting in force, floret's defaults filled in where nothing is
/// set (limits stay unset: no limit).
pub fn with_defaults(policy: Policy) -> Policy {
    Policy {
        weight: Some(policy.weight.unwrap_or(1)),
        priority: Some(policy.priority.unwrap_or(0)),
        overflow: Some(policy.overflow.unwrap_or_default()),
        expiry: Some(policy.expiry.unwrap_or_default()),
        ..policy
    }
}

/// What the scheduler needs of a policy.
pub fn scheduling(policy: Policy) -> ProducerPolicy {
    ProducerPolicy {
        weight: policy.weight.unwrap_or(1),
        priority: policy.priority.unwrap_or(0),
        max_in_flight: policy.max_in_flight,
    }
}

/// RESOURCE_EXHAUSTED with a hint of when to retry.
pub fn exhausted(message: String, retry_after: Duration) -> Status {
    let mut status = Status::resource_exhausted(message);
    let millis = retry_after.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
    status.metadata_mut().insert(RETRY_AFTER_MS, millis.into());
    status
}

/// Buckets not touched for this long are full again and dropped.
const IDLE_BUCKET: Duration = Duration::from_secs(10);
/// Checks between two sweeps of idle buckets.
const CHECKS_PER_SWEEP: u32 = 4_096;

/// Token buckets of the producers with a `produce_rate`, on this node.
#[derive(Default)]
pub struct RateLimiter {
    state: Mutex<Buckets>,
}

#[derive(Default)]
struct Buckets {
    /// By queue, then producer, so a known producer is found without allocating.
    buckets: HashMap<String, HashMap<String, Bucket>>,
    checks: u32,
}

struct Bucket {
    tokens: f64,
    refilled: Instant,
}

impl RateLimiter {
    /// Takes `messages` tokens from the producer's bucket of `rate` per
    /// second (holding one second of them), or says how long until there
    /// are enough. A batch larger than the bucket waits for a full bucket
    /// and takes it all.
    pub fn take(
        &self,
        queue: &str,
        producer: &str,
        rate: u32,
        messages: u64,
        now: Instant,
    ) -> Result<(), Duration> {
        let rate = f64::from(rate.max(1));
        let mut state = self.state.lock().expect("rate limiter lock");
        state.checks += 1;
        if state.checks >= CHECKS_PER_SWEEP {
            state.checks = 0;
            state.buckets.retain(|_, producers| {
                producers.retain(|_, bucket| now.duration_since(bucket.refilled) < IDLE_BUCKET);
                !producers.is_empty()
            });
        }
        if !state.buckets.contains_key(queue) {
            state.buckets.insert(queue.to_owned(), HashMap::new());
        }
        let producers = state.buckets.get_mut(queue).expect("inserted above");
        if !producers.contains_key(producer) {
            producers.insert(
                producer.to_owned(),
                Bucket {
                    tokens: rate,
                    refilled: now,
                },
            );
        }
        let bucket = producers.get_mut(producer).expect("inserted above");
        let elapsed = now.duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(rate);
        bucket.refilled = now;
        let wanted = (messages as f64).min(rate);
        if bucket.tokens >= wanted {
            bucket.tokens -= wanted;
            return Ok(());
        }
        Err(Duration::from_secs_f64((wanted - bucket.tokens) / rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_weight_is_refused_with_a_reason() {
        let status = from_wire(Some(v1::Policy {
            weight: Some(0),
            ..v1::Policy::default()
        }))
        .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("weight"), "{}", status.message());
    }

    #[test]
    fn policy_round_trips_through_the_wire() {
        let policy = Policy {
            weight: Some(3),
            priority: Some(0),
            max_messages: Some(10),
            overflow: Some(Overflow::DeadLetterOldest),
            expiry: Some(Expiry::Drop),
            ttl_ms: Some(5),
            ..Policy::default()
        };
        assert_eq!(from_wire(Some(to_wire(policy))).unwrap(), policy);
    }

    #[test]
    fn producer_over_its_rate_waits_for_tokens_and_others_do_not() {
        let limiter = RateLimiter::default();
        let start = Instant::now();
        assert_eq!(limiter.take("q", "a", 10, 10, start), Ok(()));
        let wait = limiter.take("q", "a", 10, 5, start).unwrap_err();
        assert!(
            wait > Duration::from_millis(490) && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        assert_eq!(limiter.take("q", "b", 10, 10, start), Ok(()));
        let later = start + Duration::from_millis(500);
        assert_eq!(limiter.take("q", "a", 10, 5, later), Ok(()));
    }
}
