//! Free space on the data dir's filesystem, sampled every second by a
//! background task ([`DiskRoom::spawn`]) and read by the produce path,
//! which refuses produces below `storage.min_free_bytes`
//! (`produce/admission.rs` decides). Keeping that room lets acks, the raft
//! metadata and sled's compaction go on when producers have filled the
//! disk; a write that still fails latches the log (`faults.rs`). The
//! sampler logs when free space falls below the watermark and when it
//! returns, so an operator sees why produces are refused.
//!
//! The `disk-free-bytes` fault point (`return(FILE)`) makes the node see
//! the number in FILE as its free space while FILE exists.
//!
//! IMPLEMENTATION CAVEATS
//! - Only this node's own disk counts: a leader with room takes produces
//!   that a follower short of room must also store.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;

/// How often free space is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The latest free-space sample of the data dir's filesystem.
#[derive(Debug, Clone, Default)]
pub struct DiskRoom {
    /// Bytes free for this process; `u64::MAX` until the first sample.
    free_bytes: Arc<AtomicU64>,
}

impl DiskRoom {
    /// Samples `data_dir`'s filesystem now and then every second, logging
    /// each crossing of `min_free_bytes`.
    pub fn spawn(data_dir: &Path, min_free_bytes: u64) -> (Self, JoinHandle<()>) {
        let room = Self {
            free_bytes: Arc::new(AtomicU64::new(u64::MAX)),
        };
        let dir = data_dir.to_path_buf();
        let sampled = room.clone();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(SAMPLE_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                sampled.sample(&dir, min_free_bytes);
            }
        });
        (room, task)
    }

    /// Bytes free on the data dir's filesystem at the last sample.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes.load(Ordering::Relaxed)
    }

    fn sample(&self, dir: &Path, min_free_bytes: u64) {
        match free_bytes(dir) {
            Ok(free) => {
                let before = self.free_bytes.swap(free, Ordering::Relaxed);
                match watermark_crossing(before, free, min_free_bytes) {
                    Some(Crossing::Below) => tracing::warn!(
                        free,
                        min_free_bytes,
                        dir = %dir.display(),
                        "data dir short of free space: produces are refused until it returns (storage.min_free_bytes)"
                    ),
                    Some(Crossing::Above) => tracing::info!(
                        free,
                        min_free_bytes,
                        "data dir has free space again: produces are taken"
                    ),
                    None => {}
                }
                metrics::gauge!("floret_disk_free_bytes").set(free as f64);
            }
            Err(error) => {
                tracing::warn!(%error, dir = %dir.display(), "cannot read the data dir's free space");
            }
        }
    }
}

/// Free space moving across the watermark between two samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crossing {
    Below,
    Above,
}

/// Whether free space went from `before` to `now` across `min_free_bytes`
/// (`before` is `u64::MAX` at the first sample, which counts as above).
fn watermark_crossing(before: u64, now: u64, min_free_bytes: u64) -> Option<Crossing> {
    match (before >= min_free_bytes, now >= min_free_bytes) {
        (true, false) => Some(Crossing::Below),
        (false, true) => Some(Crossing::Above),
        _ => None,
    }
}

/// Bytes an unprivileged process may still write on `dir`'s filesystem.
fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    if let Some(file) = floret_store::failpoints::argument("disk-free-bytes")
        && let Ok(text) = std::fs::read_to_string(&file)
    {
        return text
            .trim()
            .parse()
            .map_err(|error| std::io::Error::other(format!("{file}: {error}")));
    }
    let stats = rustix::fs::statvfs(dir)?;
    Ok(stats.f_bavail.saturating_mul(stats.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_of_a_real_directory_is_read() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert!(free_bytes(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn a_node_short_of_disk_refuses_produces_without_saying_so_in_its_log() {
        let min = 100;
        let script = [
            (u64::MAX, 500, None),
            (u64::MAX, 50, Some(Crossing::Below)),
            (50, 40, None),
            (40, 100, Some(Crossing::Above)),
            (100, 150, None),
            (150, 99, Some(Crossing::Below)),
        ];
        for (before, now, expected) in script {
            assert_eq!(
                watermark_crossing(before, now, min),
                expected,
                "{before} -> {now}"
            );
        }
    }
}
