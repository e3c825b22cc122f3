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
    let mut furthest = log.and_then(ShardLog::furthest_next_index);
    let mut follows_previous = false;
    for (log_id, _) in entries {
        let index = log_id.index;
        if let Some(next) = furthest {
            let fits = if follows_previous {
                index == next
            } else {
                index <= next
            };
            if !fits {
                return Some(format!(
                    "shard {shard}: appending entry {index} where the next entry is {next} would leave a hole in the raft log"
                ));
            }
        }
        furthest = Some(index + 1);
        follows_previous = true;
    }
    None
}
