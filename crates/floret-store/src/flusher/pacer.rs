//! When the flusher syncs: at once unless other writers are busy, a little
//! later while they are, so that one sync carries more of their writes.
//!
//! Every `fdatasync` costs the disk at least a page: the log pads itself to
//! the end of its page before each sync (`Wal::sync`), so a sync of
//! 1.4 KiB writes 4 KiB. At one message per call the log took about 700
//! syncs a second of 1.4 KiB each, so the disk wrote each logged byte
//! several times over. Holding a sync until a page (4 KiB) is waiting,
//! for at most [`MAX_LINGER`], cuts that. A hold only
//! pays when someone else writes while the waiters wait, so the pacer holds
//! a sync only when both hold:
//! - the recent write rate says at least [`WORTH_WAITING_BYTES`] will come
//!   within the linger (2 MB/s);
//! - writes were seen arriving while an earlier sync ran or was held. A
//!   writer alone, blocked on its own sync, never shows that, so it is
//!   synced at once however fast it writes.
//!
//! A hold that reaches its deadline with nothing new written clears that
//! evidence until writes are seen during a sync again.
//!
//! Every waiter of a held sync waits for the hold, and under a closed loop
//! of calls the writes a hold waits for are often other calls' next steps,
//! themselves waiting on holds; so the linger is short. With 2 ms, 64
//! one-message calls in flight on three nodes went about 0.75x as fast as
//! with 0.5 ms; the disk wrote 3.3 instead of 4.0 bytes per payload byte
//! (BENCHMARKS.md, "Syncs padded to a page and held 0.5 ms").
//!
//! Pure: the flusher passes the time and the log's byte count in.

use std::time::{Duration, Instant};

use crate::wal::PAGE_BYTES;

/// The longest a waiter is held for other writes to join its sync. Under
/// load a produce waits for two syncs in parallel (leader and followers),
/// so this adds at most about this much to its latency.
pub const MAX_LINGER: Duration = Duration::from_micros(500);
/// A hold starts only when at least this many bytes are expected within
/// the linger at the recent rate (2 MB/s at a 0.5 ms linger).
pub const WORTH_WAITING_BYTES: f64 = 1024.0;
/// How fast the measured write rate forgets: an interval this long
/// between two syncs weighs about 63% in the new figure, so the figure
/// follows the load within a few milliseconds and an idle pause erases it.
const RATE_TIME_CONSTANT: Duration = Duration::from_millis(4);

/// What the flusher does next with the waiters it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Sync now.
    SyncNow,
    /// Take more waiters until this time (or until one arrives), then ask again.
    WaitUntil(Instant),
}

/// Decides when to sync from the log's write rate; see the module doc.
#[derive(Debug, Default, Clone)]
pub struct SyncPacer {
    /// Smoothed bytes written per second, measured from one sync to the next.
    bytes_per_second: f64,
    /// When the last sync started and the log's byte count then (all of
    /// which that sync made durable).
    last_sync: Option<(Instant, u64)>,
    /// Whether writes were seen arriving while a sync ran or was held.
    others_write_meanwhile: bool,
    /// The hold in progress for the current waiters, if any.
    hold: Option<Hold>,
}

/// A hold in progress: the log's byte count when it began.
#[derive(Debug, Clone, Copy)]
struct Hold {
    bytes_at_start: u64,
}

impl SyncPacer {
    /// What to do at `now` with waiters pending since `first_waiter_at`,
    /// when the log has taken `bytes_written` bytes since it opened.
    pub fn pace(&mut self, now: Instant, first_waiter_at: Instant, bytes_written: u64) -> Pace {
        let synced = self.last_sync.map_or(0, |(_, bytes)| bytes);
        let unsynced = bytes_written.saturating_sub(synced);
        if unsynced >= PAGE_BYTES {
            // The page `fdatasync` writes anyway is full.
            return Pace::SyncNow;
        }
        let deadline = first_waiter_at + MAX_LINGER;
        if now >= deadline {
            if self
                .hold
                .is_some_and(|hold| bytes_written == hold.bytes_at_start)
            {
                self.others_write_meanwhile = false;
            }
            return Pace::SyncNow;
        }
        if self.hold.is_none() {
            let expected = self.bytes_per_second * (deadline - now).as_secs_f64();
            if !self.others_write_meanwhile || expected < WORTH_WAITING_BYTES {
                return Pace::SyncNow;
            }
            self.hold = Some(Hold {
                bytes_at_start: bytes_written,
            });
        }
        Pace::WaitUntil(deadline)
    }

    /// A sync starts at `now` and makes the first `bytes_written` bytes durable.
    pub fn syncing(&mut self, now: Instant, bytes_written: u64) {
        if let Some((previous, previous_bytes)) = self.last_sync {
            let elapsed = now.saturating_duration_since(previous).as_secs_f64();
            if elapsed > 0.0 {
                let rate = bytes_written.saturating_sub(previous_bytes) as f64 / elapsed;
                let weight = 1.0 - (-elapsed / RATE_TIME_CONSTANT.as_secs_f64()).exp();
                self.bytes_per_second += weight * (rate - self.bytes_per_second);
            }
        }
        if let Some(hold) = self.hold.take()
            && bytes_written > hold.bytes_at_start
        {
            self.others_write_meanwhile = true;
        }
        self.last_sync = Some((now, bytes_written));
    }

    /// The sync returned; the log had taken `bytes_written` bytes by then.
    /// Bytes written while it ran came from writers not waiting on it.
    pub fn synced(&mut self, bytes_written: u64) {
        if let Some((_, bytes_at_start)) = self.last_sync
            && bytes_written > bytes_at_start
        {
            self.others_write_meanwhile = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: f64) -> Duration {
        Duration::from_secs_f64(millis / 1000.0)
    }

    /// Forty syncs `interval` apart, each carrying `bytes_each`, with
    /// `written_meanwhile` more arriving while each runs; returns the time
    /// and byte count reached.
    fn steady_syncs(
        pacer: &mut SyncPacer,
        interval: Duration,
        bytes_each: u64,
        written_meanwhile: u64,
    ) -> (Instant, u64) {
        let (mut now, mut written) = (Instant::now(), 0);
        for _ in 0..40 {
            now += interval;
            written += bytes_each;
            pacer.syncing(now, written);
            written += written_meanwhile;
            pacer.synced(written);
        }
        (now, written)
    }

    #[test]
    fn lone_writer_is_never_held_however_fast_it_writes() {
        let mut pacer = SyncPacer::default();
        // 3 MB/s, nothing written while a sync runs.
        let (now, written) = steady_syncs(&mut pacer, ms(1.0), 3_000, 0);
        let next = now + ms(1.0);
        assert_eq!(pacer.pace(next, next, written + 3_000), Pace::SyncNow);
    }

    #[test]
    fn slow_log_is_synced_at_once_even_with_others_writing() {
        let mut pacer = SyncPacer::default();
        // One 250-byte produce every 2 ms: 125 kB/s.
        let (now, written) = steady_syncs(&mut pacer, ms(2.0), 200, 50);
        let next = now + ms(2.0);
        assert_eq!(pacer.pace(next, next, written + 250), Pace::SyncNow);
    }

    #[test]
    fn busy_log_is_held_until_a_page_is_waiting() {
        let mut pacer = SyncPacer::default();
        // 2.5 MB/s, some of it arriving while syncs run.
        let (now, written) = steady_syncs(&mut pacer, ms(1.1), 2_600, 100);
        let first_waiter = now + ms(0.1);
        let Pace::WaitUntil(until) = pacer.pace(first_waiter, first_waiter, written + 300) else {
            panic!("a busy log should hold the sync for more writes");
        };
        assert_eq!(until, first_waiter + MAX_LINGER);
        assert_eq!(
            pacer.pace(first_waiter + ms(0.3), first_waiter, written + 2_000),
            Pace::WaitUntil(until),
            "a waiter that arrives during the hold does not end it"
        );
        assert_eq!(
            pacer.pace(first_waiter + ms(0.4), first_waiter, written + PAGE_BYTES),
            Pace::SyncNow,
            "a full page is synced at once"
        );
    }

    #[test]
    fn held_sync_happens_at_the_linger_deadline_however_busy() {
        let mut pacer = SyncPacer::default();
        let (now, mut written) = steady_syncs(&mut pacer, ms(1.0), 2_800, 100);
        let first_waiter = now;
        let mut at = first_waiter;
        while let Pace::WaitUntil(until) = pacer.pace(at, first_waiter, written + 100) {
            assert_eq!(until, first_waiter + MAX_LINGER);
            at = until;
            written += 300;
        }
        assert_eq!(at, first_waiter + MAX_LINGER);
    }

    #[test]
    fn hold_in_which_nobody_writes_stops_the_next_ones() {
        let mut pacer = SyncPacer::default();
        let (now, written) = steady_syncs(&mut pacer, ms(1.0), 2_800, 100);
        let Pace::WaitUntil(until) = pacer.pace(now, now, written + 200) else {
            panic!("the busy history makes it hold");
        };
        assert_eq!(pacer.pace(until, now, written + 200), Pace::SyncNow);
        pacer.syncing(until, written + 200);
        pacer.synced(written + 200);
        let next = until + ms(0.5);
        assert_eq!(
            pacer.pace(next, next, written + 1_600),
            Pace::SyncNow,
            "without new evidence of other writers the next sync is not held"
        );
    }

    #[test]
    fn idle_pause_erases_the_rate_of_a_flood() {
        let mut pacer = SyncPacer::default();
        let (now, written) = steady_syncs(&mut pacer, ms(1.0), 2_800, 100);
        let before_pause = now + ms(1.0);
        assert!(
            matches!(
                pacer
                    .clone()
                    .pace(before_pause, before_pause, written + 500),
                Pace::WaitUntil(_)
            ),
            "the flood alone would hold it"
        );
        let after_pause = now + Duration::from_secs(1);
        pacer.syncing(after_pause, written + 250);
        pacer.synced(written + 250);
        let next = after_pause + ms(2.0);
        assert_eq!(pacer.pace(next, next, written + 500), Pace::SyncNow);
    }

    #[test]
    fn first_sync_of_a_new_log_is_not_held() {
        let mut pacer = SyncPacer::default();
        let now = Instant::now();
        assert_eq!(pacer.pace(now, now, 100), Pace::SyncNow);
    }
}
