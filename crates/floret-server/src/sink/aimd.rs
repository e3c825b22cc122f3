//! How much of its part of the cap a pump uses when the sink pushes back
//! (a 429 or 5xx, a timeout, a broker's nack, messages asked for again):
//! additive increase, multiplicative decrease, as TCP does. Pure: the time
//! is passed in.
//!
//! A push-back halves the share at most once per [`CUT_SPACING`] (one
//! overload shows in several batches at once); each second without one
//! adds [`RAISE_PER_SECOND`] back, up to the whole part. The pump never
//! sends more than its part, so the cluster never passes the cap.
//!
//! A slow answer pushes back too ([`AnswerTimes`]): a sink that queues
//! what it takes (a broker confirming late, a service answering slower
//! and slower) is overloaded before it fails.

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

/// An answer slower than this many times the sink's usual one is slow.
pub const SLOW_FACTOR: u32 = 4;
/// No answer faster than this is slow, however fast the usual one.
pub const SLOW_AT_LEAST: Duration = Duration::from_millis(100);
/// How long a fastest answer stays the sink's usual one: the usual answer
/// follows a sink that became slower for good after one to two of these.
pub const USUAL_WINDOW: Duration = Duration::from_secs(10);
/// Slow answers in a row that push back: one late answer may be this
/// node's own stall (a busy runtime, a pause), a queueing sink answers
/// every batch late.
pub const SLOW_IN_A_ROW: u32 = 3;

/// A sink's usual answer time (the fastest of the last one to two
/// [`USUAL_WINDOW`]s), and which answers are slow against it.
#[derive(Debug, Clone)]
pub struct AnswerTimes {
    fastest_before: Option<Duration>,
    fastest_now: Option<Duration>,
    window_started: Instant,
    slow_in_a_row: u32,
}

impl AnswerTimes {
    /// No answer yet, from `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            fastest_before: None,
            fastest_now: None,
            window_started: now,
            slow_in_a_row: 0,
        }
    }

    /// Records an answer that took `answered_in`, at `now`; true if it and
    /// the [`SLOW_IN_A_ROW`] answers up to it were slow: each at least
    /// [`SLOW_FACTOR`] times the usual answer, and at least
    /// [`SLOW_AT_LEAST`]. The first answer is never slow.
    pub fn answered(&mut self, answered_in: Duration, now: Instant) -> bool {
        if now.saturating_duration_since(self.window_started) >= USUAL_WINDOW {
            self.fastest_before = self.fastest_now.take();
            self.window_started = now;
        }
        let usual = match (self.fastest_before, self.fastest_now) {
            (Some(before), Some(current)) => Some(before.min(current)),
            (before, current) => before.or(current),
        };
        self.fastest_now = Some(self.fastest_now.map_or(answered_in, |f| f.min(answered_in)));
        let slow =
            usual.is_some_and(|usual| answered_in >= (usual * SLOW_FACTOR).max(SLOW_AT_LEAST));
        self.slow_in_a_row = if slow { self.slow_in_a_row + 1 } else { 0 };
        self.slow_in_a_row >= SLOW_IN_A_ROW
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn a_broker_that_starts_confirming_late_pushes_back_until_late_is_its_usual() {
        let start = Instant::now();
        let mut answers = AnswerTimes::new(start);
        assert!(
            !answers.answered(ms(400), start),
            "the first answer sets the usual"
        );
        let mut at = start + ms(100);
        for _ in 0..50 {
            assert!(!answers.answered(ms(10), at), "10 ms is this sink's usual");
            at += ms(100);
        }
        assert!(!answers.answered(ms(90), at), "under 100 ms is never slow");
        assert!(
            !answers.answered(ms(150), at),
            "one late answer is not a slow sink"
        );
        assert!(!answers.answered(ms(10), at));
        assert!(!answers.answered(ms(150), at));
        assert!(!answers.answered(ms(150), at));
        assert!(
            answers.answered(ms(150), at),
            "the third late answer in a row"
        );
        let mut slow_for = Duration::ZERO;
        while answers.answered(ms(150), at) {
            at += ms(100);
            slow_for += ms(100);
            assert!(slow_for <= 2 * USUAL_WINDOW, "150 ms never became usual");
        }
        assert!(
            slow_for >= USUAL_WINDOW / 2,
            "a sink that stays slow is slow for a while: {slow_for:?}"
        );
        for _ in 1..SLOW_IN_A_ROW {
            assert!(!answers.answered(ms(600), at));
        }
        assert!(!answers.answered(ms(400), at), "under 4 times 150 ms");
        for _ in 1..SLOW_IN_A_ROW {
            assert!(!answers.answered(ms(600), at));
        }
        assert!(
            answers.answered(ms(600), at),
            "4 times the new usual, 3 in a row"
        );
    }

    #[test]
    fn a_sink_slow_from_the_start_is_never_called_slow_for_being_itself() {
        let start = Instant::now();
        let mut answers = AnswerTimes::new(start);
        for tenth in 0..300 {
            let answered_in = ms(300 + (tenth % 7) * 50);
            assert!(!answers.answered(answered_in, start + ms(tenth * 100)));
        }
    }

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
