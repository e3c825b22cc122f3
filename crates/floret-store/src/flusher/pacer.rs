//! When the flusher syncs: at once while writes are sparse, a little later
//! while they come fast, so that one sync carries a page of them.
//!
//! Every `fdatasync` writes the log's last page whole, however little of it
//! is new, and the next write dirties that page again. At one message per
//! call the log took about 900 syncs a second of 1.4 KiB each, so the disk
//! wrote each logged byte several times over. Holding a sync until a page
//! (4 KiB) is waiting, for at most [`MAX_LINGER`], cuts that, and costs a
//! waiter nothing when nobody else is writing:
//! - the pacer waits only when the recent write rate says enough bytes will
//!   come within the linger to be worth it ([`WORTH_WAITING_BYTES`]);
//! - it stops waiting as soon as a [`QUIET_SLICE`] passes with no new byte,
//!   which is what a lone writer blocked on this very sync looks like.
//!
//! Pure: the flusher passes the time and the log's byte count in.
//!
//! IMPLEMENTATION CAVEATS
//! - The rate is one smoothed figure for the whole node. After a flood ends,
//!   a lone writer's next syncs may each wait one quiet slice until the
//!   figure has decayed.

use std::time::{Duration, Instant};

/// A sync that carries at least this many new bytes is never held back:
/// the page `fdatasync` writes anyway is full.
pub const PAGE_BYTES: u64 = 4096;
/// The longest a waiter is held for other writes to join its sync. Under
/// load a produce waits for two syncs in parallel (leader and followers),
/// so this adds at most about this much to its latency.
pub const MAX_LINGER: Duration = Duration::from_millis(2);
/// Waiting starts only when at least this many bytes are expected within
/// the linger at the recent rate (0.5 MB/s at a 2 ms linger).
pub const WORTH_WAITING_BYTES: f64 = 1024.0;
/// While waiting, a slice this long with no new byte ends the wait: the
/// writers are blocked on this sync.
pub const QUIET_SLICE: Duration = Duration::from_micros(500);
/// Weight of the newest interval in the smoothed write rate.
const RATE_SMOOTHING: f64 = 0.25;

/// What the flusher does next with the waiters it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Sync now.
    SyncNow,
    /// Take more waiters until this time (or until one arrives), then ask again.
    WaitUntil(Instant),
}

/// Decides when to sync from the log's write rate; see the module doc.
#[derive(Debug, Default)]
pub struct SyncPacer {
    /// Smoothed bytes written per second, measured from one sync to the next.
    bytes_per_second: f64,
    /// When the last sync started and the log's byte count then (all of
    /// which that sync made durable).
    last_sync: Option<(Instant, u64)>,
    /// The wait in progress for the current waiters, if any.
    wait: Option<QuietWatch>,
}

/// A wait in progress: it ends at the end of a slice in which nothing was written.
#[derive(Debug, Clone, Copy)]
struct QuietWatch {
    slice_ends: Instant,
    bytes_at_slice_start: u64,
}

impl SyncPacer {
    /// What to do at `now` with waiters pending since `first_waiter_at`,
    /// when the log has taken `bytes_written` bytes since it opened.
    pub fn pace(&mut self, now: Instant, first_waiter_at: Instant, bytes_written: u64) -> Pace {
        let synced = self.last_sync.map_or(0, |(_, bytes)| bytes);
        let unsynced = bytes_written.saturating_sub(synced);
        let deadline = first_waiter_at + MAX_LINGER;
        if unsynced >= PAGE_BYTES || now >= deadline {
            return Pace::SyncNow;
        }
        let watch = match self.wait {
            None => {
                let expected = self.bytes_per_second * (deadline - now).as_secs_f64();
                if expected < WORTH_WAITING_BYTES {
                    return Pace::SyncNow;
                }
                QuietWatch {
                    slice_ends: now + QUIET_SLICE,
                    bytes_at_slice_start: bytes_written,
                }
            }
            Some(watch) if now < watch.slice_ends => watch,
            Some(watch) if bytes_written == watch.bytes_at_slice_start => {
                return Pace::SyncNow;
            }
            Some(_) => QuietWatch {
                slice_ends: now + QUIET_SLICE,
                bytes_at_slice_start: bytes_written,
            },
        };
        self.wait = Some(watch);
        Pace::WaitUntil(watch.slice_ends.min(deadline))
    }

    /// A sync starts at `now` and makes the first `bytes_written` bytes durable.
    pub fn syncing(&mut self, now: Instant, bytes_written: u64) {
        if let Some((previous, previous_bytes)) = self.last_sync {
            let seconds = now.saturating_duration_since(previous).as_secs_f64();
            if seconds > 0.0 {
                let rate = bytes_written.saturating_sub(previous_bytes) as f64 / seconds;
                self.bytes_per_second += RATE_SMOOTHING * (rate - self.bytes_per_second);
            }
        }
        self.last_sync = Some((now, bytes_written));
        self.wait = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: f64) -> Duration {
        Duration::from_secs_f64(millis / 1000.0)
    }

    /// Syncs every `interval` with `bytes_each` written in between, so the
    /// pacer learns that rate; returns the time and byte count reached.
    fn steady_writes(
        pacer: &mut SyncPacer,
        start: Instant,
        interval: Duration,
        bytes_each: u64,
    ) -> (Instant, u64) {
        let (mut now, mut written) = (start, 0);
        for _ in 0..40 {
            now += interval;
            written += bytes_each;
            pacer.syncing(now, written);
        }
        (now, written)
    }

    #[test]
    fn lone_writer_is_never_held_for_others() {
        let mut pacer = SyncPacer::default();
        let start = Instant::now();
        // One 250-byte produce every 2 ms: 125 kB/s.
        let (now, written) = steady_writes(&mut pacer, start, ms(2.0), 250);
        assert_eq!(pacer.pace(now, now, written + 250), Pace::SyncNow);
    }

    #[test]
    fn fast_writes_are_held_until_a_page_is_waiting() {
        let mut pacer = SyncPacer::default();
        let start = Instant::now();
        // 1,400 bytes every 1.1 ms: 1.3 MB/s, as at one message per call.
        let (now, written) = steady_writes(&mut pacer, start, ms(1.1), 1_400);
        let first_waiter = now + ms(0.1);
        let Pace::WaitUntil(until) = pacer.pace(first_waiter, first_waiter, written + 300) else {
            panic!("a fast log should wait for more writes");
        };
        assert!(until <= first_waiter + QUIET_SLICE);
        assert_eq!(
            pacer.pace(first_waiter + ms(0.3), first_waiter, written + 2_000),
            Pace::WaitUntil(until),
            "a waiter that arrives mid-slice does not end the wait"
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
        let start = Instant::now();
        let (now, mut written) = steady_writes(&mut pacer, start, ms(1.0), 1_500);
        let first_waiter = now;
        let mut at = first_waiter;
        while let Pace::WaitUntil(until) = pacer.pace(at, first_waiter, written + 100) {
            assert!(until <= first_waiter + MAX_LINGER);
            at = until;
            written += 300;
        }
        assert!(at <= first_waiter + MAX_LINGER);
        assert!(at >= first_waiter + MAX_LINGER - QUIET_SLICE);
    }

    #[test]
    fn writer_blocked_on_its_own_sync_waits_one_quiet_slice_only() {
        let mut pacer = SyncPacer::default();
        let start = Instant::now();
        let (now, written) = steady_writes(&mut pacer, start, ms(1.0), 1_500);
        let Pace::WaitUntil(until) = pacer.pace(now, now, written + 200) else {
            panic!("the recent rate is high enough to wait");
        };
        assert_eq!(until, now + QUIET_SLICE);
        assert_eq!(pacer.pace(until, now, written + 200), Pace::SyncNow);
    }

    #[test]
    fn rate_decays_after_a_flood_so_lone_writers_stop_waiting() {
        let mut pacer = SyncPacer::default();
        let start = Instant::now();
        let (mut now, mut written) = steady_writes(&mut pacer, start, ms(1.0), 1_500);
        let mut quiet_syncs = 0;
        loop {
            now += ms(2.5);
            written += 250;
            if pacer.pace(now, now, written) == Pace::SyncNow {
                break;
            }
            now += QUIET_SLICE;
            pacer.syncing(now, written);
            quiet_syncs += 1;
        }
        assert!(quiet_syncs <= 12, "took {quiet_syncs} syncs to decay");
    }

    #[test]
    fn first_sync_of_a_new_log_is_not_held() {
        let mut pacer = SyncPacer::default();
        let now = Instant::now();
        assert_eq!(pacer.pace(now, now, 100), Pace::SyncNow);
    }
}
