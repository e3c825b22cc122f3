//! Forgetting a shard: when this node's replica of a shard is retired,
//! the log drops the shard's entries, vote, commit mark and purge point at
//! once, so a fresh replica of the shard can start here later from
//! nothing, and its old entries stop holding segments.
//!
//! A `Forget` record marks the position: replay drops every frame of the
//! shard before it. Older segments may outlive the one that holds the
//! record (a segment goes once nothing needs it, not in order), so every
//! checkpoint repeats the record, before the shard's own checkpoint
//! records, for as long as any segment from before the position remains.

use std::collections::HashMap;

use super::segment::{FramePosition, frame};
use super::{Record, ShardLog, Wal, WalState};
use crate::types::ShardId;

/// Where each forgotten shard was forgotten (the latest time).
pub(super) type Forgotten = HashMap<ShardId, FramePosition>;

impl Wal {
    /// Drops everything the log holds of `shard` and makes that durable.
    /// The shard's raft group must be stopped: an append or purge of it
    /// racing this would outlive it.
    pub fn forget(&self, shard: ShardId) -> std::io::Result<()> {
        {
            let mut guard = self.lock();
            let state = &mut *guard;
            let before = FramePosition {
                segment: state.active.id,
                offset: state.active.len,
            };
            state.write(&frame(&Record::Forget { shard, before }))?;
            forget_before(&mut state.shards, &mut state.forgotten, shard, before);
            state.pins.set(shard, Default::default());
        }
        self.sync()
    }
}

/// Drops `shard`'s frames before `before` from `shards`, and remembers
/// the position so that checkpoints repeat it.
pub(super) fn forget_before(
    shards: &mut HashMap<ShardId, ShardLog>,
    forgotten: &mut Forgotten,
    shard: ShardId,
    before: FramePosition,
) {
    if let Some(log) = shards.get_mut(&shard) {
        log.entries.retain(|location| {
            FramePosition {
                segment: location.segment,
                offset: location.offset,
            } >= before
        });
        log.vote = None;
        log.committed = None;
        log.last_purged = None;
        log.purge_asked = None;
        if log.entries.is_empty() {
            shards.remove(&shard);
        }
    }
    let latest = forgotten.entry(shard).or_insert(before);
    *latest = (*latest).max(before);
}

impl WalState {
    /// The `Forget` records a new segment's checkpoint starts with: one
    /// for every shard forgotten while a segment from before that remains.
    pub(super) fn forgotten_checkpoint(&mut self) -> Vec<u8> {
        let oldest = self
            .sealed
            .keys()
            .next()
            .copied()
            .unwrap_or(self.active.id)
            .min(self.active.id);
        self.forgotten.retain(|_, before| before.segment >= oldest);
        let mut records = Vec::new();
        for (&shard, &before) in &self.forgotten {
            records.extend(frame(&Record::Forget { shard, before }));
        }
        records
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, Vote};

    use super::*;
    use crate::types::LogId;
    use crate::wal::EncodedEntry;
    use crate::wal::segment::segment_path;

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    fn append(wal: &Wal, shard: ShardId, indexes: std::ops::Range<u64>) {
        let entries = indexes
            .map(|index| {
                let entry = EncodedEntry {
                    meta: vec![index as u8; 100],
                    payloads: Vec::new(),
                };
                (log_id(index), entry)
            })
            .collect();
        wal.append(shard, entries).unwrap();
    }

    #[test]
    fn a_forgotten_shard_comes_back_empty_and_a_later_one_keeps_its_entries() {
        let dir = tempfile::tempdir().unwrap();
        {
            let wal = Wal::open(dir.path()).unwrap();
            append(&wal, 0, 1..5);
            wal.save_vote(0, &Vote::new_committed(2, 1)).unwrap();
            wal.save_committed(0, Some(log_id(4))).unwrap();
            append(&wal, 1, 1..3);
            wal.forget(0).unwrap();
            assert_eq!(wal.log_state(0), (None, None));
            assert_eq!(wal.vote(0), None);
            append(&wal, 0, 7..9);
            wal.save_vote(0, &Vote::new(5, 3)).unwrap();
            wal.sync().unwrap();
        }
        let wal = Wal::open(dir.path()).unwrap();
        assert_eq!(wal.log_state(0), (None, Some(log_id(8))));
        assert_eq!(wal.read(0, 1..7).unwrap().len(), 0);
        assert_eq!(wal.vote(0), Some(Vote::new(5, 3)));
        assert_eq!(wal.committed(0), None);
        assert_eq!(wal.log_state(1), (None, Some(log_id(2))));
    }

    #[test]
    fn forgotten_entries_stay_gone_when_an_older_segment_outlives_the_forget_record() {
        let dir = tempfile::tempdir().unwrap();
        {
            let wal = Wal::open_with_segment_bytes(dir.path(), 300).unwrap();
            wal.set_pins(1, [(1, 1)].into());
            let capture = wal.capture_pins();
            wal.pins_synced(capture);
            append(&wal, 0, 1..4);
            wal.forget(0).unwrap();
            append(&wal, 2, 1..4);
            append(&wal, 2, 4..7);
            wal.purge(2, log_id(6)).unwrap();
            assert!(
                !segment_path(dir.path(), 2).exists(),
                "the segment holding the forget record is deleted"
            );
            assert!(
                segment_path(dir.path(), 1).exists(),
                "the segment stored messages point into outlives it"
            );
        }
        let wal = Wal::open_with_segment_bytes(dir.path(), 300).unwrap();
        assert_eq!(wal.log_state(0), (None, None), "old entries came back");
        assert_eq!(wal.vote(0), None);
    }
}
