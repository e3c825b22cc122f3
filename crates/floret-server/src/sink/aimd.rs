//! How much of its part of the cap a pump uses when the sink pushes back
//! (a 429 or 5xx, a timeout, a broker's nack, messages asked for again):
//! additive increase, multiplicative decrease, as TCP does. Pure: the time
//! is passed in.
//!
//! A push-back halves the share at most once per [`CUT_SPACING`] (one
//! overload shows in several batches at once); each second without one
//! adds [`RAISE_PER_SECOND`] back, up to the whole part. The pump never
//! sends more than its part, so the cluster never passes the cap.

use std::time::{Duration, Instant};

/// The least share kept, so a sink that recovered is noticed.
pub const FLOOR: f64 = 1.0 / 32.0;
/// Share added back per second without a push-back.
pub const RAISE_PER_SECOND: f64 = 0.1;
/// Push-backs closer than this to the last cut do not cut again.
pub const CUT_SPACING: Duration = Duration::from_millis(500);

/// The share of its part a pump uses, from 1 (all of it) down to [`FLOOR`].
#[derive(Debug, Clone)]
pub struct Aimd {
    share: f64,
    last_cut: Option<Instant>,
    raised_at: Instant,
}

impl Aimd {
    /// The whole part, from `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            share: 1.0,
            last_cut: None,
            raised_at: now,
        }
    }

    /// The sink pushed back at `now`.
    pub fn pushed_back(&mut self, now: Instant) {
        self.raise(now);
        if self
            .last_cut
            .is_some_and(|cut| now.saturating_duration_since(cut) < CUT_SPACING)
        {
            return;
        }
        self.share = (self.share / 2.0).max(FLOOR);
        self.last_cut = Some(now);
    }

    /// The sink took a batch at `now`.
    pub fn took(&mut self, now: Instant) {
        self.raise(now);
    }

    /// The share to use.
    pub fn share(&self) -> f64 {
        self.share
    }

    fn raise(&mut self, now: Instant) {
        let seconds = now.saturating_duration_since(self.raised_at).as_secs_f64();
        self.share = (self.share + seconds * RAISE_PER_SECOND).min(1.0);
        self.raised_at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_overload_cuts_once_and_the_share_climbs_back_linearly() {
        let start = Instant::now();
        let mut aimd = Aimd::new(start);
        aimd.pushed_back(start);
        aimd.pushed_back(start + Duration::from_millis(100));
        assert!(
            (aimd.share() - 0.51).abs() < 1e-9,
            "cut once, then 0.1 s of climbing: {}",
            aimd.share()
        );
        aimd.took(start + Duration::from_secs(2));
        assert!((aimd.share() - 0.7).abs() < 1e-9, "{}", aimd.share());
        aimd.took(start + Duration::from_secs(60));
        assert_eq!(aimd.share(), 1.0);
    }

    #[test]
    fn a_sink_that_keeps_pushing_back_gets_the_floor_not_nothing() {
        let start = Instant::now();
        let mut aimd = Aimd::new(start);
        for second in 0..20 {
            aimd.pushed_back(start + Duration::from_secs(second));
        }
        assert!(aimd.share() >= FLOOR);
        assert!(aimd.share() < 0.2, "{}", aimd.share());
    }
}
