//! One shard's index of its live log entries: where each entry's frame is,
//! in 24 bytes an entry, and the leader of each run of entries, kept once
//! a run. A node holds one location per entry not yet purged (up to
//! `raft.snapshot_every_entries` a shard); with the leader in every
//! location it took 48 bytes, twice the index's memory under a large
//! backlog.
//!
//! Indexes in the index need not be consecutive (recovery replays what the
//! files hold); the log refuses appends that would leave a gap (`holes.rs`).

use std::collections::BTreeMap;
use std::ops::RangeBounds;

use openraft::CommittedLeaderId;

use crate::types::{LogId, NodeId};

/// Where one entry's frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Location {
    pub(super) segment: u64,
    pub(super) offset: u64,
    pub(super) len: u32,
    /// Where the payloads start, from the frame's start.
    pub(super) payloads_at: u32,
}

/// The live entries of one shard.
#[derive(Debug, Default)]
pub(super) struct EntryIndex {
    locations: BTreeMap<u64, Location>,
    /// The leader of the entries from each key on, up to the next key.
    /// The first key is at or before the first entry's index.
    leaders: BTreeMap<u64, CommittedLeaderId<NodeId>>,
}

impl EntryIndex {
    /// Records entry `log_id` at `location`, dropping the entries from its
    /// index on (an entry that conflicts, and those after it).
    pub(super) fn insert(&mut self, log_id: LogId, location: Location) {
        let index = log_id.index;
        self.truncate(index);
        if self.leader_at(index) != Some(log_id.leader_id) {
            self.leaders.insert(index, log_id.leader_id);
        }
        self.locations.insert(index, location);
    }

    /// Moves entry `index` (which the index holds) to a copy of its frame.
    pub(super) fn relocate(&mut self, index: u64, location: Location) {
        if let Some(held) = self.locations.get_mut(&index) {
            *held = location;
        }
    }

    /// Drops the entries from `since` on.
    pub(super) fn truncate(&mut self, since: u64) {
        let _removed = self.locations.split_off(&since);
        let _removed = self.leaders.split_off(&since);
    }

    /// Drops the entries up to `upto`, inclusive.
    pub(super) fn purge(&mut self, upto: u64) {
        self.locations = self.locations.split_off(&(upto + 1));
        self.forget_leaders_before_first();
    }

    /// Keeps only the entries `keep` says to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Location) -> bool) {
        self.locations.retain(|_, location| keep(location));
        self.forget_leaders_before_first();
    }

    fn forget_leaders_before_first(&mut self) {
        let Some(&first) = self.locations.keys().next() else {
            self.leaders.clear();
            return;
        };
        let leader = self.leader_at(first);
        self.leaders = self.leaders.split_off(&first);
        if let Some(leader) = leader {
            self.leaders.insert(first, leader);
        }
    }

    fn leader_at(&self, index: u64) -> Option<CommittedLeaderId<NodeId>> {
        self.leaders
            .range(..=index)
            .next_back()
            .map(|(_, leader)| *leader)
    }

    /// The log id of entry `index`, if the index holds it.
    pub(super) fn log_id(&self, index: u64) -> Option<LogId> {
        self.locations.get(&index)?;
        Some(LogId::new(self.leader_at(index)?, index))
    }

    /// Where entry `index` is.
    pub(super) fn get(&self, index: u64) -> Option<Location> {
        self.locations.get(&index).copied()
    }

    /// Where entry `log_id` is, if the index holds that very entry (not
    /// another leader's at the same index).
    pub(super) fn location_of(&self, log_id: LogId) -> Option<Location> {
        let location = self.get(log_id.index)?;
        (self.leader_at(log_id.index) == Some(log_id.leader_id)).then_some(location)
    }

    /// The last entry's log id.
    pub(super) fn last_log_id(&self) -> Option<LogId> {
        self.log_id(self.last_index()?)
    }

    /// The last entry's index.
    pub(super) fn last_index(&self) -> Option<u64> {
        self.locations.keys().next_back().copied()
    }

    /// The first entry's location.
    pub(super) fn first(&self) -> Option<Location> {
        self.locations.values().next().copied()
    }

    /// Whether the index holds an entry after `index`.
    pub(super) fn holds_after(&self, index: u64) -> bool {
        self.locations.range(index + 1..).next().is_some()
    }

    /// The entries in `range`, in index order.
    pub(super) fn range(
        &self,
        range: impl RangeBounds<u64>,
    ) -> impl Iterator<Item = (u64, Location)> + '_ {
        self.locations
            .range(range)
            .map(|(&index, &location)| (index, location))
    }

    /// Every entry's location, in index order.
    pub(super) fn locations(&self) -> impl Iterator<Item = (u64, Location)> + '_ {
        self.range(..)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.locations.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn location(offset: u64) -> Location {
        Location {
            segment: 1,
            offset,
            len: 10,
            payloads_at: 8,
        }
    }

    /// Fills `index` with entries `indexes` of `term`.
    fn fill(index: &mut EntryIndex, term: u64, indexes: std::ops::Range<u64>) {
        for i in indexes {
            index.insert(at(term, i), location(i * 100));
        }
    }

    #[test]
    fn leader_kept_once_a_run_still_names_every_entry() {
        let mut index = EntryIndex::default();
        fill(&mut index, 1, 1..5);
        fill(&mut index, 2, 5..8);
        assert_eq!(index.leaders.len(), 2);
        assert_eq!(index.log_id(4), Some(at(1, 4)));
        assert_eq!(index.log_id(5), Some(at(2, 5)));
        assert_eq!(index.log_id(8), None);
    }

    #[test]
    fn conflicting_entry_takes_its_leader_and_drops_what_followed() {
        let mut index = EntryIndex::default();
        fill(&mut index, 1, 1..5);
        fill(&mut index, 2, 5..8);
        index.insert(at(3, 4), location(999));
        assert_eq!(index.last_index(), Some(4));
        assert_eq!(index.log_id(3), Some(at(1, 3)));
        assert_eq!(index.log_id(4), Some(at(3, 4)));
        fill(&mut index, 3, 5..6);
        assert_eq!(index.log_id(5), Some(at(3, 5)));
        assert_eq!(index.leaders.len(), 2);
    }

    #[test]
    fn purge_and_truncate_keep_the_leader_of_what_remains() {
        let mut index = EntryIndex::default();
        fill(&mut index, 1, 1..5);
        fill(&mut index, 2, 5..8);
        index.purge(5);
        assert_eq!(index.log_id(6), Some(at(2, 6)));
        assert_eq!(index.leaders.len(), 1);
        index.truncate(7);
        assert_eq!(index.last_index(), Some(6));
        index.purge(6);
        assert!(index.is_empty());
        assert!(index.leaders.is_empty());
        fill(&mut index, 4, 9..10);
        assert_eq!(index.log_id(9), Some(at(4, 9)));
    }

    #[test]
    fn location_of_another_leaders_entry_at_the_index_is_none() {
        let mut index = EntryIndex::default();
        fill(&mut index, 1, 1..3);
        assert_eq!(index.location_of(at(1, 2)), Some(location(200)));
        assert_eq!(index.location_of(at(2, 2)), None);
        assert_eq!(index.location_of(at(1, 3)), None);
        assert_eq!(index.last_log_id(), Some(at(1, 2)));
    }

    #[test]
    fn relocated_entry_keeps_its_log_id() {
        let mut index = EntryIndex::default();
        fill(&mut index, 1, 1..3);
        index.relocate(2, location(5_000));
        assert_eq!(index.get(2), Some(location(5_000)));
        assert_eq!(index.log_id(2), Some(at(1, 2)));
        index.retain(|location| location.offset >= 5_000);
        assert_eq!(index.log_id(2), Some(at(1, 2)));
        assert_eq!(index.get(1), None);
    }
}
