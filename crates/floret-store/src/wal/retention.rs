//! Which segments go: a purge drops a shard's entries, copies a quiet
//! shard's few entries forward, and deletes every sealed segment that no
//! shard's entries and no stored message need any more (`pins.rs`).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;

use super::pins::{PinCapture, Pins, SegmentRuns};
use super::segment::{frame, segment_path};
use super::{CARRY_FORWARD_BYTES, Location, Record, Wal, WalState};
use crate::types::{LogId, ShardId};

impl Wal {
    /// Whether `shard`'s log holds an entry after `index`.
    pub fn holds_entries_after(&self, shard: ShardId, index: u64) -> bool {
        self.lock()
            .shards
            .get(&shard)
            .is_some_and(|log| log.entries.holds_after(index))
    }

    /// Hides `shard`'s entries up to `upto` at once, as openraft expects of
    /// a purge. They stay in the log, and come back after a restart, until
    /// [`Wal::purge`] drops them once the state machines are durable.
    pub fn hide_purged(&self, shard: ShardId, upto: LogId) {
        let mut state = self.lock();
        let log = state.shards.entry(shard).or_default();
        log.purge_asked = log.purge_asked.max(Some(upto));
    }

    /// Drops `shard`'s entries up to `upto` and deletes segments nobody needs any more.
    pub fn purge(&self, shard: ShardId, upto: LogId) -> io::Result<()> {
        let mut state = self.lock();
        state.write(&frame(&Record::Purge { shard, upto }))?;
        let log = state.shards.entry(shard).or_default();
        log.entries.purge(upto.index);
        log.last_purged = Some(upto);
        Self::carry_forward_small_shards(&mut state)?;
        let oldest_needed = state
            .shards
            .values()
            .filter_map(|log| log.entries.first().map(|l| l.segment))
            .min()
            .unwrap_or(state.active.id);
        let obsolete: Vec<u64> = state
            .sealed
            .range(..oldest_needed)
            .map(|(&id, _)| id)
            .filter(|&id| !state.pins.is_pinned(id))
            .collect();
        if !obsolete.is_empty() {
            // The purge record must be durable before the entries it drops
            // vanish; padded first, as every sync is (`Wal::sync`).
            state.pad_to_page_end()?;
            let synced = state.active.file.sync_data();
            state.latch("fdatasync before deleting segments", synced)?;
            for id in obsolete {
                // A segment left behind is harmless (replayed, then dropped
                // by the durable purge record); it is tried again next purge.
                match fs::remove_file(segment_path(&self.dir, id)) {
                    Ok(()) => {
                        state.sealed.remove(&id);
                    }
                    Err(error) => {
                        tracing::warn!(segment = id, %error, "cannot delete an obsolete raft log segment; trying again at the next purge")
                    }
                }
            }
            let folder_synced = File::open(&self.dir).and_then(|folder| folder.sync_all());
            state.latch("fsync of the log folder", folder_synced)?;
        }
        Ok(())
    }

    /// Copies the live entries of every shard that holds little in sealed
    /// segments (a shard with little traffic never snapshots, so it never
    /// purges) into the active segment, so that its first entries do not
    /// keep every later segment. Frames are copied as they are: an entry's
    /// copy replays after the original and replaces it, and the original's
    /// segment is deleted only after a sync.
    fn carry_forward_small_shards(state: &mut WalState) -> io::Result<()> {
        let active = state.active.id;
        let small: Vec<ShardId> = state
            .shards
            .iter()
            .filter(|(_, log)| {
                log.entries.first().is_some_and(|l| l.segment < active)
                    && log
                        .entries
                        .locations()
                        .map(|(_, l)| u64::from(l.len))
                        .sum::<u64>()
                        <= CARRY_FORWARD_BYTES
            })
            .map(|(&shard, _)| shard)
            .collect();
        for shard in small {
            let locations: Vec<(u64, Location)> =
                state.shards[&shard].entries.locations().collect();
            let mut buffer = Vec::new();
            let mut moved = Vec::with_capacity(locations.len());
            for (index, location) in locations {
                let mut bytes = vec![0; location.len as usize];
                state
                    .file_of_live_entry(location.segment)
                    .read_exact_at(&mut bytes, location.offset)?;
                moved.push((
                    index,
                    Location {
                        segment: active,
                        offset: state.active.len + buffer.len() as u64,
                        ..location
                    },
                ));
                buffer.extend_from_slice(&bytes);
            }
            state.write(&buffer)?;
            let log = state.shards.get_mut(&shard).expect("listed above");
            for (index, location) in moved {
                log.entries.relocate(index, location);
            }
        }
        Ok(())
    }

    /// Records how many of `shard`'s stored runs point into each segment.
    pub fn set_pins(&self, shard: ShardId, runs: SegmentRuns) {
        self.lock().pins.set(shard, runs);
    }

    /// `shard`'s runs per segment as its last apply left them.
    pub fn pins_of(&self, shard: ShardId) -> SegmentRuns {
        self.lock().pins.of(shard)
    }

    /// Takes the counts read from disk at open, for every shard.
    pub fn load_pins(&self, per_shard: HashMap<ShardId, SegmentRuns>) {
        self.lock().pins = Pins::loaded(per_shard);
    }

    /// The counts as a state-machine sync begins.
    pub fn capture_pins(&self) -> PinCapture {
        self.lock().pins.capture()
    }

    /// The sync that began with `capture` made the state machines durable.
    pub fn pins_synced(&self, capture: PinCapture) {
        self.lock().pins.synced(capture);
    }
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use crate::types::LogId;
    use crate::wal::{EncodedEntry, PAGE_BYTES, Wal};

    #[test]
    fn purge_that_deletes_segments_syncs_a_padded_page_like_any_sync() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open_with_segment_bytes(dir.path(), 300).unwrap();
        let log_id = |index| LogId::new(CommittedLeaderId::new(1, 1), index);
        for index in 1..10 {
            let entry = EncodedEntry {
                meta: vec![0; 100],
                payloads: Vec::new(),
            };
            wal.append(0, vec![(log_id(index), entry)]).unwrap();
        }
        let segments_before = wal.segments_on_disk().0;
        wal.purge(0, log_id(8)).unwrap();
        assert!(
            wal.segments_on_disk().0 < segments_before,
            "no segment deleted"
        );
        assert_eq!(wal.lock().active.len % PAGE_BYTES, 0);
    }
}
