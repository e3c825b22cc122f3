//! The node's raft write-ahead log: one append-only file for the log
//! entries, votes and commit marks of every shard, so that one `fdatasync`
//! makes the appends of all shards durable at once (group commit across
//! raft groups).
//!
//! Why not sled for the log: sled's `flush` costs several
//! `sync_file_range` calls through its IO thread pool (about 1.1 ms a cycle
//! here) before our `fdatasync`, and while it runs it holds the read side of
//! sled's global lock, so every shard's `apply_batch` waits. Here a sync
//! cycle is one `fdatasync`.
//!
//! Layout: segment files `wal-{id:020}.log`, each a sequence of frames
//! `[len: u32 le][crc32: u32 le][record][payloads]`, records encoded with
//! postcard. An entry's record holds the entry without its messages'
//! payloads; the payloads follow it raw, one after the other, so that a
//! stored message can point at its payload here instead of copying it
//! (write once, see [`crate::resting::LoggedPayload`]).
//! A sync first pads the segment to the end of its page with a padding
//! frame, so the page a sync wrote is never written again.
//! A new segment starts when the active one passes [`SEGMENT_BYTES`], with a
//! checkpoint of every shard's vote, commit mark and purge point, so an old
//! segment is only needed for the entries and the payloads it holds; it is
//! deleted once every shard has purged its entries and no stored message
//! points into it (`pins.rs`). Memory holds one location per live entry,
//! never an entry itself.
//!
//! Recovery reads every segment in order. A frame cut short (unless it
//! claims more than [`MAX_FRAME_BYTES`]), or the very last frame of the last
//! segment failing its checksum, is a torn write: it is cut off. Any other
//! bad frame is corruption, and opening fails rather than serve a log with
//! a hole. A write or sync that fails while running stops the log for good
//! (see `WalState::failed`).
//!
//! Files: `segment.rs` (segment files, frames and the records they carry), `recovery.rs` (replaying
//! a segment at open, torn write or corruption), `reading.rs` (entries and
//! payloads read back), `retention.rs` (purges and which segments go),
//! `pins.rs` (segments that stored messages point into), `forgetting.rs`
//! (a retired replica's shard dropped from the log), `holes.rs` (appends
//! that would leave a hole, refused), `index.rs` (where each live entry
//! is), `tests.rs`.
//!
//! IMPLEMENTATION CAVEATS
//! - A segment is read whole into memory during recovery (64 MiB at most).
//! - One entry is one frame; a 1 MiB message is one 1 MiB write.
//! - A damaged length that still fits under [`MAX_FRAME_BYTES`] and runs
//!   past the end of the last segment looks like a torn write and is cut.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::Vote;

use crate::types::{LogId, NodeId, ShardId};

mod forgetting;
mod holes;
mod index;
mod pins;
mod reading;
mod recovery;
mod retention;
mod segment;

use forgetting::Forgotten;
use holes::hole_in_append;
use index::{EntryIndex, Location};
use pins::Pins;
pub use pins::{PinCapture, SegmentRuns};
use recovery::replay_segment;
use segment::{Record, create_segment, entry_frame, frame, segment_path};

/// A segment is closed and a new one started past this size.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// Frame header: length and checksum.
const FRAME_HEADER: usize = 8;
/// Bytes of a page: `fdatasync` writes a dirty page whole, so a sync ends
/// the segment on a page boundary and costs the disk at least this much.
pub const PAGE_BYTES: u64 = 4096;
/// No frame is larger: a raft entry is bounded well below it by the node's
/// request and batching limits (see floret-server's config). A frame that
/// claims more, running past the end of the log, is a damaged length, not a
/// torn write.
pub const MAX_FRAME_BYTES: usize = SEGMENT_BYTES as usize;
/// A shard with at most this many bytes of live entries in sealed segments
/// has them copied forward rather than keep those segments.
const CARRY_FORWARD_BYTES: u64 = 1024 * 1024;

/// One raft entry as the log stores it: the entry encoded without its
/// payloads, and the payloads in the order the entry lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedEntry {
    /// The entry, payloads left empty.
    pub meta: Vec<u8>,
    /// The payloads taken out of it.
    pub payloads: Vec<Vec<u8>>,
}

/// Where an entry's payloads lie in the log, once they are durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadSection {
    /// The segment.
    pub segment: u64,
    /// Offset of the first payload in the segment.
    pub offset: u64,
}

/// What the log knows of one shard.
#[derive(Debug, Default)]
struct ShardLog {
    entries: EntryIndex,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId>,
    /// The last entry the log has dropped for good.
    last_purged: Option<LogId>,
    /// The last entry openraft asked to purge: the entries up to it are
    /// hidden from reads and the log state until [`Wal::purge`] drops them.
    purge_asked: Option<LogId>,
}

impl ShardLog {
    /// The last purged entry as openraft sees it.
    fn purged(&self) -> Option<LogId> {
        self.last_purged.max(self.purge_asked)
    }

    /// Whether the entry at `index` is still there for readers.
    fn is_visible(&self, index: u64) -> bool {
        self.purged().is_none_or(|purged| index > purged.index)
    }
}

struct Segment {
    id: u64,
    file: Arc<File>,
    len: u64,
}

struct WalState {
    active: Segment,
    /// Bytes of the active segment known to be on disk.
    synced_len: u64,
    /// Bytes written to any segment since the log was opened.
    written_since_open: u64,
    sealed: BTreeMap<u64, Arc<File>>,
    shards: HashMap<ShardId, ShardLog>,
    /// Set by a write or sync that failed: after it nothing in the file can be
    /// trusted to be where the index says, or to be on disk (a failed
    /// `fdatasync` may drop dirty pages and a retry would then succeed), so
    /// every later call fails until the node restarts and recovers.
    failed: Option<String>,
    pins: Pins,
    /// Where each retired shard was forgotten, while older frames remain.
    forgotten: Forgotten,
}

/// The log of every shard of a node.
pub struct Wal {
    dir: PathBuf,
    segment_bytes: u64,
    state: Mutex<WalState>,
    /// Bytes of torn write cut off the end while opening.
    cut_at_open: u64,
}

/// A log file that cannot be trusted.
#[derive(Debug, thiserror::Error)]
#[error(
    "raft log {path} is corrupt at byte {offset}: {reason}; restore the data dir or resync this node"
)]
pub struct CorruptLog {
    /// The segment.
    pub path: PathBuf,
    /// Where the bad frame starts.
    pub offset: u64,
    /// What is wrong.
    pub reason: String,
}

impl Wal {
    /// Opens (or creates) the log in `dir`, recovering every shard's state.
    pub fn open(dir: &Path) -> io::Result<Self> {
        Self::open_with_segment_bytes(dir, SEGMENT_BYTES)
    }

    /// Like [`Wal::open`], starting a new segment past `segment_bytes`.
    pub fn open_with_segment_bytes(dir: &Path, segment_bytes: u64) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let mut ids: Vec<u64> = fs::read_dir(dir)?
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                name.strip_prefix("wal-")?
                    .strip_suffix(".log")?
                    .parse()
                    .ok()
            })
            .collect();
        ids.sort_unstable();
        let mut shards: HashMap<ShardId, ShardLog> = HashMap::new();
        let mut forgotten = Forgotten::default();
        let mut sealed = BTreeMap::new();
        let mut active = None;
        let mut cut_at_open = 0;
        for (position, &id) in ids.iter().enumerate() {
            let path = segment_path(dir, id);
            let is_last = position + 1 == ids.len();
            let valid_len = replay_segment(&path, id, is_last, &mut shards, &mut forgotten)?;
            let file = OpenOptions::new().read(true).append(true).open(&path)?;
            if is_last {
                cut_at_open = file.metadata()?.len().saturating_sub(valid_len);
                file.set_len(valid_len)?;
                file.sync_all()?;
                active = Some(Segment {
                    id,
                    file: Arc::new(file),
                    len: valid_len,
                });
            } else {
                sealed.insert(id, Arc::new(file));
            }
        }
        let active = match active {
            Some(active) => active,
            None => create_segment(dir, 1)?,
        };
        #[cfg(feature = "failpoints")]
        crate::failpoints::record_synced(dir, active.id, active.len)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            segment_bytes,
            state: Mutex::new(WalState {
                synced_len: active.len,
                written_since_open: 0,
                active,
                sealed,
                shards,
                failed: None,
                pins: Pins::default(),
                forgotten,
            }),
            cut_at_open,
        })
    }

    fn lock(&self) -> MutexGuard<'_, WalState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends encoded entries of `shard` (visible to reads at once, durable
    /// after [`Wal::sync`]), refusing entries that would leave a hole: openraft
    /// would fail on it at its next apply, after telling the leader they were stored.
    pub fn append(&self, shard: ShardId, entries: Vec<(LogId, EncodedEntry)>) -> io::Result<()> {
        let mut state = self.lock();
        if let Some(hole) = hole_in_append(shard, state.shards.get(&shard), &entries) {
            tracing::error!(%hole, "refusing a raft log append");
            return Err(io::Error::new(io::ErrorKind::InvalidInput, hole));
        }
        let mut buffer = Vec::new();
        let mut locations = Vec::with_capacity(entries.len());
        let segment = state.active.id;
        for (log_id, entry) in entries {
            let offset = state.active.len + buffer.len() as u64;
            let (bytes, payloads_at) = entry_frame(shard, log_id, entry);
            locations.push((
                log_id,
                Location {
                    segment,
                    offset,
                    len: bytes.len() as u32,
                    payloads_at,
                },
            ));
            buffer.extend_from_slice(&bytes);
        }
        state.write(&buffer)?;
        crate::failpoints::crash_if_fires("wal-after-append");
        let log = state.shards.entry(shard).or_default();
        for (log_id, location) in locations {
            log.entries.insert(log_id, location);
        }
        self.maybe_rotate(&mut state)
    }

    /// Records `shard`'s vote (durable after [`Wal::sync`]).
    pub fn save_vote(&self, shard: ShardId, vote: &Vote<NodeId>) -> io::Result<()> {
        let mut state = self.lock();
        state.write(&frame(&Record::Vote { shard, vote: *vote }))?;
        state.shards.entry(shard).or_default().vote = Some(*vote);
        self.maybe_rotate(&mut state)
    }

    /// Records `shard`'s commit mark.
    pub fn save_committed(&self, shard: ShardId, committed: Option<LogId>) -> io::Result<()> {
        let mut state = self.lock();
        state.write(&frame(&Record::Committed { shard, committed }))?;
        state.shards.entry(shard).or_default().committed = committed;
        self.maybe_rotate(&mut state)
    }

    /// Drops `shard`'s entries from `since` on.
    pub fn truncate(&self, shard: ShardId, since: u64) -> io::Result<()> {
        let mut state = self.lock();
        state.write(&frame(&Record::Truncate { shard, since }))?;
        state
            .shards
            .entry(shard)
            .or_default()
            .entries
            .truncate(since);
        self.maybe_rotate(&mut state)
    }

    /// `shard`'s (last purged, last) log ids.
    pub fn log_state(&self, shard: ShardId) -> (Option<LogId>, Option<LogId>) {
        let state = self.lock();
        let Some(log) = state.shards.get(&shard) else {
            return (None, None);
        };
        let purged = log.purged();
        let last = log
            .entries
            .last_log_id()
            .filter(|last| log.is_visible(last.index))
            .or(purged);
        (purged, last)
    }

    /// `shard`'s last saved vote.
    pub fn vote(&self, shard: ShardId) -> Option<Vote<NodeId>> {
        self.lock().shards.get(&shard).and_then(|log| log.vote)
    }

    /// `shard`'s last saved commit mark.
    pub fn committed(&self, shard: ShardId) -> Option<LogId> {
        self.lock().shards.get(&shard).and_then(|log| log.committed)
    }

    /// Makes everything appended so far durable. The segment is first
    /// padded to the end of its page: `fdatasync` writes the last page
    /// whole, and without the padding the next append would dirty that
    /// page again, so that at one message per call each sync wrote about
    /// 1.6 pages (see `segment::padding_to_page_end`).
    pub fn sync(&self) -> io::Result<()> {
        let (active, segment, len) = {
            let mut state = self.lock();
            state.check()?;
            state.pad_to_page_end()?;
            (state.active.file.clone(), state.active.id, state.active.len)
        };
        if crate::failpoints::fires("wal-skip-sync") {
            return Ok(());
        }
        let synced = if crate::failpoints::fires("wal-sync-fails") {
            Err(io::Error::other(
                "injected by the wal-sync-fails fault point",
            ))
        } else {
            active.sync_data()
        };
        {
            let mut state = self.lock();
            state.latch("fdatasync", synced)?;
            if state.active.id == segment {
                state.synced_len = state.synced_len.max(len);
            }
        }
        #[cfg(feature = "failpoints")]
        crate::failpoints::record_synced(&self.dir, segment, len)?;
        Ok(())
    }

    /// Why the log stopped, once a write or sync failed (it stays stopped
    /// until the node restarts).
    pub fn failure(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// Bytes written since the log was opened (the flusher paces its syncs by them).
    pub fn bytes_written(&self) -> u64 {
        self.lock().written_since_open
    }

    /// The segments this log keeps, and the bytes they take on disk.
    pub fn segments_on_disk(&self) -> (u64, u64) {
        let (sealed, active_len) = {
            let state = self.lock();
            let sealed: Vec<Arc<File>> = state.sealed.values().cloned().collect();
            (sealed, state.active.len)
        };
        let sealed_bytes: u64 = sealed
            .iter()
            .filter_map(|file| file.metadata().ok())
            .map(|metadata| metadata.len())
            .sum();
        (sealed.len() as u64 + 1, sealed_bytes + active_len)
    }

    /// Bytes cut off the end of the log as a torn write when it was opened.
    /// A torn write is normally data that was never synced, but the same
    /// shape is left by a disk that lost synced data, so a node that cut
    /// one cannot be sure it kept every vote and entry it acknowledged.
    pub fn cut_at_open(&self) -> u64 {
        self.cut_at_open
    }

    /// Whether any shard has purged entries from this log.
    pub fn has_purged(&self) -> bool {
        self.lock()
            .shards
            .values()
            .any(|log| log.last_purged.is_some())
    }

    /// Starts a new segment once the active one is full: the old one is
    /// synced first, the new one opens with a checkpoint of every shard.
    fn maybe_rotate(&self, state: &mut WalState) -> io::Result<()> {
        if state.active.len < self.segment_bytes {
            return Ok(());
        }
        let synced = state.active.file.sync_data();
        state.latch("fdatasync of the full segment", synced)?;
        let next = create_segment(&self.dir, state.active.id + 1);
        let next = state.latch("creating the next segment", next)?;
        let old = std::mem::replace(&mut state.active, next);
        state.sealed.insert(old.id, old.file);
        state.synced_len = 0;
        let mut checkpoint = state.forgotten_checkpoint();
        for (&shard, log) in &state.shards {
            if let Some(vote) = log.vote {
                checkpoint.extend(frame(&Record::Vote { shard, vote }));
            }
            checkpoint.extend(frame(&Record::Committed {
                shard,
                committed: log.committed,
            }));
            if let Some(upto) = log.last_purged {
                checkpoint.extend(frame(&Record::Purge { shard, upto }));
            }
        }
        state.write(&checkpoint)
    }
}

#[cfg(test)]
mod tests;
