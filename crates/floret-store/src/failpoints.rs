//! Named fault points for the chaos tests, switched on through the
//! `FAILPOINTS` environment variable in the `fail` crate's syntax (for
//! example `FAILPOINTS="wal-after-append=5%return"`).
//!
//! Without the `failpoints` feature every check here is a constant `false`
//! and the emulation code is not compiled: release builds cannot be told to
//! crash. The points:
//!
//! | name | effect when it fires |
//! |---|---|
//! | `wal-after-append` | the process aborts after a log append reached the file, before it is synced |
//! | `apply-mid-batch` | the process aborts between two entries of one `apply` call |
//! | `retire-mid-delete` | the process aborts while retiring a replica, after its durable mark, before anything is deleted |
//! | `proposer-before-reply` | (in the server) the process aborts after a produce committed, before its reply |
//! | `apply-drop-enqueue` | an applied enqueue stores nothing (the negative control: acknowledged, then lost) |
//! | `wal-skip-sync` | the raft log's sync returns without syncing (acknowledges before the flush) |
//! | `wal-sync-fails` | the raft log's sync fails as an `fdatasync` error would (the log stops) |
//! | `power-loss-on-open` | opening the data dir first throws away what the last run wrote and never synced |
//! | `disk-free-bytes` | (in the server) `return(FILE)`: the free space the node sees is the number in FILE, while FILE exists |
//! | `gossip-send-drop` | (in the cluster) every gossip datagram this node would send is dropped, as by a firewall that passes only TCP; with `return(FILE)`, while FILE exists |
//!
//! **Power-loss emulation.** SIGKILL keeps the page cache, so it cannot show
//! a missing `fdatasync`. With the feature on, every completed sync of the
//! raft log records how far it reached (`raft-log/synced-upto`, written but
//! not synced: it survives a SIGKILL like the page cache does). When
//! `power-loss-on-open` is on, opening the data dir cuts the log back to
//! that point and deletes the sled state machines, which are never synced
//! while the log holds everything they were built from. That is a crash
//! state a power failure could leave; it is only sound while nothing was
//! purged from the log, so it refuses a log with a purge.
//!
//! IMPLEMENTATION CAVEATS
//! - The emulation does not cover snapshots or purged logs (run it with
//!   snapshots far apart).

#[cfg(feature = "failpoints")]
use std::path::Path;

/// Reads `FAILPOINTS` from the environment; call once at process start.
/// Does nothing without the `failpoints` feature.
pub fn configure_from_env() {
    #[cfg(feature = "failpoints")]
    std::mem::forget(fail::FailScenario::setup());
}

/// Whether the fault point `name` fires now.
#[inline]
pub fn fires(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    {
        fail::eval(name, |_| ()).is_some()
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        false
    }
}

/// Whether the fault point `name` fires now, with its argument if it has
/// one (`return(ARG)`): one evaluation, so counted actions (`2*return`)
/// count once.
pub fn fires_with(name: &str) -> Option<Option<String>> {
    #[cfg(feature = "failpoints")]
    {
        fail::eval(name, |argument| argument)
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        None
    }
}

/// The argument of the fault point `name` (`return(ARG)`) when it fires.
pub fn argument(name: &str) -> Option<String> {
    fires_with(name).flatten()
}

/// Aborts the process, as a crash would, when the fault point `name` fires.
#[inline]
pub fn crash_if_fires(name: &str) {
    if fires(name) {
        tracing::error!(failpoint = name, "crashing at a fault point");
        std::process::abort();
    }
}

/// Name of the file that records how far the last completed sync reached.
#[cfg(feature = "failpoints")]
const SYNCED_UPTO_FILE: &str = "synced-upto";

/// Records that segment `segment` of the log in `dir` is durable up to
/// `len` bytes (through a rename, so a kill never leaves half a record).
/// Syncs may run at once (the flusher's and a retirement's): the records
/// are written one at a time, and one behind what is recorded already is
/// skipped, so the record only moves forward.
#[cfg(feature = "failpoints")]
pub(crate) fn record_synced(dir: &Path, segment: u64, len: u64) -> std::io::Result<()> {
    use std::collections::HashMap;
    use std::path::PathBuf;
    use std::sync::Mutex;

    static RECORDED: Mutex<Option<HashMap<PathBuf, (u64, u64)>>> = Mutex::new(None);
    let mut recorded = RECORDED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let furthest = recorded
        .get_or_insert_with(HashMap::new)
        .entry(dir.to_path_buf())
        .or_insert((0, 0));
    if (segment, len) < *furthest {
        return Ok(());
    }
    let mut bytes = segment.to_le_bytes().to_vec();
    bytes.extend(len.to_le_bytes());
    let fresh = dir.join(format!("{SYNCED_UPTO_FILE}.new"));
    std::fs::write(&fresh, bytes)?;
    std::fs::rename(fresh, dir.join(SYNCED_UPTO_FILE))?;
    *furthest = (segment, len);
    Ok(())
}

/// Emulates a power failure on the data dir `data_dir` (raft log in
/// `log_dir`, sled in `sled_dir`) when `power-loss-on-open` fires: drops the
/// log past the last completed sync and the unsynced state machines.
/// Returns whether it did; the caller must then refuse a log with a purge
/// (see [`check_power_loss_sound`]).
#[cfg(feature = "failpoints")]
pub(crate) fn emulate_power_loss(log_dir: &Path, sled_dir: &Path) -> std::io::Result<bool> {
    use std::io::{Error, ErrorKind};
    if !fires("power-loss-on-open") {
        return Ok(false);
    }
    let Ok(bytes) = std::fs::read(log_dir.join(SYNCED_UPTO_FILE)) else {
        return Ok(false);
    };
    let field = |at: usize| -> std::io::Result<u64> {
        let raw: [u8; 8] = bytes
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| Error::new(ErrorKind::InvalidData, "short synced-upto file"))?;
        Ok(u64::from_le_bytes(raw))
    };
    let (synced_segment, synced_len) = (field(0)?, field(8)?);
    let mut dropped = 0;
    for entry in std::fs::read_dir(log_dir)? {
        let path = entry?.path();
        let Some(id) = path.file_name().and_then(|n| n.to_str()).and_then(|n| {
            n.strip_prefix("wal-")?
                .strip_suffix(".log")?
                .parse::<u64>()
                .ok()
        }) else {
            continue;
        };
        let len = std::fs::metadata(&path)?.len();
        if id > synced_segment {
            dropped += len;
            std::fs::remove_file(&path)?;
        } else if id == synced_segment && len > synced_len {
            dropped += len - synced_len;
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)?
                .set_len(synced_len)?;
        }
    }
    if sled_dir.exists() {
        std::fs::remove_dir_all(sled_dir)?;
    }
    tracing::warn!(
        dropped_log_bytes = dropped,
        "emulated power loss: dropped the unsynced raft log and the state machines"
    );
    Ok(true)
}

/// After an emulated power loss, the opened log must never have been
/// purged (`log_was_purged`): the state machines it dropped were built from
/// the purged part.
#[cfg(feature = "failpoints")]
pub(crate) fn check_power_loss_sound(log_was_purged: bool) -> std::io::Result<()> {
    if log_was_purged {
        return Err(std::io::Error::other(
            "power-loss emulation needs a log that was never purged (space snapshots further apart)",
        ));
    }
    Ok(())
}

#[cfg(all(test, feature = "failpoints"))]
mod tests {
    use super::*;

    #[test]
    fn syncs_recorded_at_once_neither_fail_nor_move_the_record_back() {
        let dir = tempfile::tempdir().unwrap();
        std::thread::scope(|threads| {
            for thread in 0..8u64 {
                let dir = dir.path();
                threads.spawn(move || {
                    for len in 0..200u64 {
                        record_synced(dir, 3, len * 8 + thread).unwrap();
                    }
                });
            }
        });
        let bytes = std::fs::read(dir.path().join(SYNCED_UPTO_FILE)).unwrap();
        let len = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
        assert_eq!(len, 199 * 8 + 7, "the furthest sync of any thread");
    }
}
