//! A shard's log stays without holes: which appends would leave one.
//! Recovery replays what the files hold and does not look for holes.

use super::{EncodedEntry, ShardLog};
use crate::types::{LogId, ShardId};

impl ShardLog {
    /// The furthest index a new entry may have: right after the last entry
    /// or the last purged one, whichever is later; `None` while the log has
    /// neither.
    pub(super) fn furthest_next_index(&self) -> Option<u64> {
        let last_entry = self.entries.last_index();
        let last_purged = self.purged().map(|purged| purged.index);
        last_entry.max(last_purged).map(|index| index + 1)
    }
}

/// Why appending `entries` to `log` of `shard` would leave a hole in it, if
/// it would: the first entry may replace entries the log holds but not
/// start past its end, and each one after it must follow the one before.
pub(super) fn hole_in_append(
    shard: ShardId,
    log: Option<&ShardLog>,
    entries: &[(LogId, EncodedEntry)],
) -> Option<String> {
    let hole = |index: u64, next: u64| {
        format!(
            "shard {shard}: appending entry {index} where the next entry is {next} would leave a hole in the raft log"
        )
    };
    let first = entries.first()?.0.index;
    if let Some(next) = log.and_then(ShardLog::furthest_next_index)
        && first > next
    {
        return Some(hole(first, next));
    }
    entries
        .windows(2)
        .map(|pair| (pair[1].0.index, pair[0].0.index + 1))
        .find(|(index, next)| index != next)
        .map(|(index, next)| hole(index, next))
}
