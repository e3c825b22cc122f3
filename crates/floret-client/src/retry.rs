//! Back-off for retrying calls the server answered UNAVAILABLE or
//! throttled (RESOURCE_EXHAUSTED with a hint), honouring the server's
//! `floret-retry-after-ms` hint, with jitter so that many clients do not
//! retry in lock step.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

/// Metadata key with the server's suggested wait, in ms.
pub const RETRY_AFTER_MS: &str = "floret-retry-after-ms";

/// How a client retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First wait.
    pub initial_backoff: Duration,
    /// Longest single wait.
    pub max_backoff: Duration,
    /// Give up after retrying this long in total.
    pub give_up_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(250),
            give_up_after: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Wait before retry number `attempt` (0-based) after `status`:
    /// exponential back-off up to `max_backoff`, but never less than the
    /// server's hint; plus up to 50% jitter.
    pub fn backoff(&self, attempt: u32, status: &tonic::Status) -> Duration {
        let exponential = self
            .initial_backoff
            .saturating_mul(1 << attempt.min(16))
            .min(self.max_backoff);
        let base = retry_after(status).map_or(exponential, |hint| hint.max(exponential));
        base + base.mul_f64(jitter_fraction() * 0.5)
    }
}

/// A random fraction in [0, 1) without a random-number dependency: std's
/// `RandomState` is seeded randomly per instance.
fn jitter_fraction() -> f64 {
    (RandomState::new().hash_one(0u8) >> 11) as f64 / (1u64 << 53) as f64
}

/// The server's retry-after hint, if it gave one.
fn retry_after(status: &tonic::Status) -> Option<Duration> {
    status
        .metadata()
        .get(RETRY_AFTER_MS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis)
}

/// Whether the server refused a produce to slow its producer down
/// (RESOURCE_EXHAUSTED with a retry-after hint: over its rate, over its
/// limits, or the node is short of room): nothing was stored, so any
/// produce may be sent again, idempotent or not.
pub fn is_throttled(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::ResourceExhausted && retry_after(status).is_some()
}

/// What tonic's message starts with when the HTTP/2 stream or connection
/// broke under a call (a node stopping reset it), whatever code it maps
/// the reason to (INTERNAL for most).
const BROKEN_STREAM: &str = "h2 protocol error";

/// Whether a failed call that carries an idempotency sequence may be
/// retried: the server was unavailable, or the call broke off in transport
/// (a node died or stopped mid-call: tonic reports UNKNOWN, CANCELLED, or
/// an h2 protocol error) or timed out, so its outcome is unknown and a
/// repeat with the same sequence is harmless.
pub fn is_retryable(status: &tonic::Status) -> bool {
    is_throttled(status)
        || matches!(
            status.code(),
            tonic::Code::Unavailable
                | tonic::Code::Unknown
                | tonic::Code::Cancelled
                | tonic::Code::DeadlineExceeded
        )
        || status.message().starts_with(BROKEN_STREAM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_hint_is_a_floor_under_the_exponential_backoff() {
        let policy = RetryPolicy::default();
        let mut status = tonic::Status::unavailable("no leader");
        status.metadata_mut().insert(RETRY_AFTER_MS, 300u64.into());
        let first = policy.backoff(0, &status);
        assert!(
            first >= Duration::from_millis(300) && first < Duration::from_millis(451),
            "{first:?}"
        );
        let later = policy.backoff(5, &status);
        assert!(later >= Duration::from_millis(300), "{later:?}");
        status
            .metadata_mut()
            .insert(RETRY_AFTER_MS, 2_000u64.into());
        assert!(policy.backoff(0, &status) >= Duration::from_secs(2));
    }

    #[test]
    fn a_produce_broken_off_by_a_stopping_node_fails_instead_of_retrying() {
        let reset = tonic::Status::internal("h2 protocol error: http2 error");
        assert!(is_retryable(&reset));
        assert!(!is_retryable(&tonic::Status::internal(
            "the state machine failed"
        )));
    }

    #[test]
    fn throttle_is_retryable_only_with_a_hint() {
        let mut status = tonic::Status::resource_exhausted("over its share");
        assert!(!is_retryable(&status));
        status.metadata_mut().insert(RETRY_AFTER_MS, 50u64.into());
        assert!(is_throttled(&status) && is_retryable(&status));
    }

    #[test]
    fn client_sleeps_through_a_failover_it_could_have_used() {
        let policy = RetryPolicy::default();
        let status = tonic::Status::unavailable("down");
        assert!(policy.backoff(0, &status) < Duration::from_millis(76));
        let capped = policy.backoff(30, &status);
        assert!(
            capped >= Duration::from_millis(250) && capped <= Duration::from_millis(375),
            "a client retries a failing-over shard at least every 375 ms: {capped:?}"
        );
    }
}
