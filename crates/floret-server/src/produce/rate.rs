//! The `produce_rate` token buckets: a producer with a rate may produce that
//! many messages per second, in bursts of at most one second's worth. The
//! buckets live in the memory of the shard's leader; time is passed in.
//!
//! IMPLEMENTATION CAVEATS
//! - Token buckets start full on a new leader, so a failover grants each
//!   rate-limited producer one more second of burst.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
        self.take_from(queue, producer, rate, messages, now, f64::from(rate))
    }

    /// Like [`take`](Self::take), a new bucket holding `first_tokens`
    /// rather than a full second of tokens.
    pub fn take_from(
        &self,
        queue: &str,
        producer: &str,
        rate: u32,
        messages: u64,
        now: Instant,
        first_tokens: f64,
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
                    tokens: first_tokens.min(rate),
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

    #[test]
    fn a_bucket_shared_by_nodes_starts_with_its_part_not_a_whole_second() {
        let limiter = RateLimiter::default();
        let start = Instant::now();
        assert_eq!(limiter.take_from("q", "t/", 10, 2, start, 2.5), Ok(()));
        assert!(limiter.take_from("q", "t/", 10, 1, start, 2.5).is_err());
        let later = start + Duration::from_millis(100);
        assert_eq!(limiter.take_from("q", "t/", 10, 1, later, 2.5), Ok(()));
    }
}
