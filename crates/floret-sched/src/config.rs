//! Tunables of one [`Scheduler`](crate::Scheduler).

use std::time::Duration;

/// Credits per turn for a producer without an override: one message per turn
/// makes unweighted producers alternate message by message, the finest
/// interleaving DRR offers.
pub(crate) const DEFAULT_WEIGHT: u32 = 1;

/// How long a consumer may hold a message before it is redelivered: long enough
/// for ordinary processing plus a network round trip, short enough that a
/// crashed consumer's messages come back within a minute.
pub(crate) const DEFAULT_LEASE_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings for one queue's scheduler; the server fills it from the queue's
/// replicated policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// DRR quantum (messages per turn) of a producer without a weight
    /// override; 0 is treated as 1.
    pub default_weight: u32,
    /// How long a dispatched message stays leased before it becomes
    /// deliverable again. Must be small enough to add to an `Instant`
    /// (any real timeout is).
    pub lease_timeout: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            default_weight: DEFAULT_WEIGHT,
            lease_timeout: DEFAULT_LEASE_TIMEOUT,
        }
    }
}
