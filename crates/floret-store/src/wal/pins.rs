//! Which log segments still hold payloads of stored messages.
//!
//! A message's payload stays where the raft log wrote it (see
//! [`crate::resting::LoggedPayload`]), so a segment may go only once every
//! shard has purged its entries *and* no stored run points into it. After
//! each apply a shard's state machine hands the log its count of runs per
//! segment ([`Pins::set`]). sled writes to disk when it likes, so after a
//! crash the runs on disk are those of the last completed state-machine
//! sync or of any moment since. Deletion therefore trusts a segment to be
//! free only if it was free when that sync began ([`Pins::capture`],
//! [`Pins::synced`]) and is free now. A run added since that sync cannot
//! be missed: it points into the segment that holds its own entry, and a
//! purge releases an entry only after a sync that follows its apply. An
//! apply in progress has not counted its runs yet, and a quiet shard's
//! entries may be copied forward out of their segment meanwhile, so every
//! segment an apply looked payloads up in stays until that shard's next
//! [`Pins::set`] ([`Pins::in_apply`]).
//!
//! IMPLEMENTATION CAVEATS
//! - A segment that a few old messages pin stays whole until they go:
//!   nothing copies them forward yet.

use std::collections::{BTreeMap, HashMap};

use crate::types::ShardId;

/// Runs pointing into each segment, by segment id.
pub type SegmentRuns = BTreeMap<u64, u64>;

/// The counts of every shard at the moment a state-machine sync began.
#[derive(Debug)]
pub struct PinCapture {
    generation: u64,
    totals: SegmentRuns,
}

/// The runs per segment of every shard of a node.
#[derive(Debug, Default)]
pub(crate) struct Pins {
    current: HashMap<ShardId, SegmentRuns>,
    /// Segments each shard's apply in progress took payload sections from.
    applying: HashMap<ShardId, Vec<u64>>,
    /// Totals as of the start of the last completed sync.
    durable: SegmentRuns,
    /// Generation of the capture `durable` came from.
    durable_generation: u64,
    captures: u64,
}

impl Pins {
    /// Counts read from disk at open: they are durable by definition.
    pub(crate) fn loaded(per_shard: HashMap<ShardId, SegmentRuns>) -> Self {
        let mut pins = Self {
            current: per_shard,
            ..Self::default()
        };
        pins.durable = pins.totals();
        pins
    }

    /// `shard`'s counts as its last apply left them.
    pub(crate) fn of(&self, shard: ShardId) -> SegmentRuns {
        self.current.get(&shard).cloned().unwrap_or_default()
    }

    /// Replaces `shard`'s counts (segments with no run left are absent),
    /// once its apply has written them: the apply is over.
    pub(crate) fn set(&mut self, shard: ShardId, runs: SegmentRuns) {
        self.current.insert(shard, runs);
        self.applying.remove(&shard);
    }

    /// `shard`'s apply in progress may store runs pointing into `segment`.
    pub(crate) fn in_apply(&mut self, shard: ShardId, segment: u64) {
        let segments = self.applying.entry(shard).or_default();
        if !segments.contains(&segment) {
            segments.push(segment);
        }
    }

    /// The counts now, taken before a sync writes the state machines out.
    pub(crate) fn capture(&mut self) -> PinCapture {
        self.captures += 1;
        PinCapture {
            generation: self.captures,
            totals: self.totals(),
        }
    }

    /// The sync that began with `capture` completed; a sync that began
    /// before the one last recorded changes nothing.
    pub(crate) fn synced(&mut self, capture: PinCapture) {
        if capture.generation > self.durable_generation {
            self.durable_generation = capture.generation;
            self.durable = capture.totals;
        }
    }

    /// Whether any run, in memory or as of the last sync, points into `segment`.
    pub(crate) fn is_pinned(&self, segment: u64) -> bool {
        self.durable.get(&segment).is_some_and(|&runs| runs > 0)
            || self
                .applying
                .values()
                .any(|segments| segments.contains(&segment))
            || self
                .current
                .values()
                .any(|runs| runs.get(&segment).is_some_and(|&runs| runs > 0))
    }

    fn totals(&self) -> SegmentRuns {
        let mut totals = SegmentRuns::new();
        for runs in self.current.values() {
            for (&segment, &count) in runs {
                *totals.entry(segment).or_default() += count;
            }
        }
        totals.retain(|_, count| *count > 0);
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(pairs: &[(u64, u64)]) -> SegmentRuns {
        pairs.iter().copied().collect()
    }

    #[test]
    fn segment_freed_in_memory_stays_pinned_until_a_sync_has_seen_it_free() {
        let mut pins = Pins::loaded(HashMap::from([(0, runs(&[(3, 1)]))]));
        assert!(pins.is_pinned(3));
        pins.set(0, SegmentRuns::new());
        assert!(
            pins.is_pinned(3),
            "the disk may still hold the run: a crash would bring it back"
        );
        let capture = pins.capture();
        pins.synced(capture);
        assert!(!pins.is_pinned(3));
    }

    #[test]
    fn run_added_after_a_capture_pins_its_segment_at_once() {
        let mut pins = Pins::default();
        let capture = pins.capture();
        pins.set(1, runs(&[(5, 2)]));
        pins.synced(capture);
        assert!(pins.is_pinned(5));
    }

    #[test]
    fn sync_that_began_earlier_never_replaces_a_later_one() {
        let mut pins = Pins::default();
        pins.set(0, runs(&[(2, 1)]));
        let early = pins.capture();
        pins.set(0, SegmentRuns::new());
        let late = pins.capture();
        pins.synced(late);
        assert!(!pins.is_pinned(2));
        pins.synced(early);
        assert!(
            !pins.is_pinned(2),
            "the later sync already made the run's removal durable"
        );
    }

    #[test]
    fn segment_an_apply_took_payloads_from_stays_until_it_counts_its_runs() {
        let mut pins = Pins::default();
        pins.in_apply(2, 4);
        let capture = pins.capture();
        pins.synced(capture);
        assert!(pins.is_pinned(4), "the apply's runs are not counted yet");
        pins.set(2, SegmentRuns::new());
        assert!(!pins.is_pinned(4));
    }

    #[test]
    fn any_shard_pinning_a_segment_keeps_it() {
        let mut pins = Pins::default();
        pins.set(0, runs(&[(7, 1)]));
        pins.set(1, runs(&[(7, 1)]));
        let capture = pins.capture();
        pins.synced(capture);
        pins.set(0, SegmentRuns::new());
        let capture = pins.capture();
        pins.synced(capture);
        assert!(pins.is_pinned(7));
        pins.set(1, SegmentRuns::new());
        let capture = pins.capture();
        pins.synced(capture);
        assert!(!pins.is_pinned(7));
    }
}
