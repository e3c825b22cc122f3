//! How long a pump waits before sending again what a sink did not take:
//! doubling from [`FIRST`] up to [`LONGEST`], each wait moved by up to a
//! fifth either way so that pumps of many nodes do not retry in step.
//! Pure: the jitter is passed in.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

/// The wait before the first retry.
pub const FIRST: Duration = Duration::from_millis(100);
/// The longest wait.
pub const LONGEST: Duration = Duration::from_secs(5);

/// The wait before retry number `retry` (1 for the first), with `jitter`
/// in `[0, 1)` placing it between 0.8 and 1.2 times the nominal wait.
pub fn wait(retry: u32, jitter: f64) -> Duration {
    let doublings = retry.saturating_sub(1).min(16);
    let nominal = FIRST.saturating_mul(1 << doublings).min(LONGEST);
    nominal.mul_f64(0.8 + 0.4 * jitter.clamp(0.0, 1.0))
}

/// A jitter in `[0, 1)` from the process's random hash keys.
pub fn jitter() -> f64 {
    let bits = RandomState::new().hash_one(std::time::Instant::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_longest() {
        assert_eq!(wait(1, 0.5), FIRST);
        assert_eq!(wait(2, 0.5), FIRST * 2);
        assert_eq!(wait(4, 0.5), FIRST * 8);
        assert_eq!(wait(40, 0.5), LONGEST);
    }

    #[test]
    fn jitter_moves_a_wait_by_a_fifth_at_most() {
        assert_eq!(wait(1, 0.0), FIRST.mul_f64(0.8));
        assert!(wait(1, 0.999) < FIRST.mul_f64(1.2));
        for _ in 0..100 {
            assert!((0.0..1.0).contains(&jitter()));
        }
    }
}
