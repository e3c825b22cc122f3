//! How long producers waited: the latency percentiles, the longest ack
//! gap across each leader loss, and the hand-back stall after a restart.

use std::collections::{BTreeMap, BTreeSet};

use super::rounds;
use crate::history::{Event, Outcome, Record};

/// The `rank` percentile (0 to 1) of the sorted `values`; None when empty.
pub fn percentile(sorted: &[u64], rank: f64) -> Option<u64> {
    let last = sorted.len().checked_sub(1)?;
    Some(sorted[((last as f64) * rank).round() as usize])
}

/// Each producer's acknowledgement times, in order.
fn acks_by_producer(history: &[Record]) -> BTreeMap<u32, Vec<u64>> {
    let mut acks: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for record in history {
        if let Event::Completed {
            id,
            outcome: Outcome::Acknowledged { .. },
        } = &record.event
        {
            acks.entry(id.producer).or_default().push(record.at_us);
        }
    }
    acks
}

/// For each restart, the longest gap between consecutive acknowledgements
/// of one producer that begins between the restart and the next heal.
pub(super) fn hand_back_stalls(history: &[Record]) -> Vec<u64> {
    let acks = acks_by_producer(history);
    let restarts = rounds(history, |event| matches!(event, Event::Restarted { .. }));
    restarts
        .into_iter()
        .filter_map(|(from, healed)| {
            let healed = healed?;
            let longest = acks
                .values()
                .flat_map(|times| times.windows(2))
                .filter(|gap| gap[0] >= from && gap[0] < healed)
                .map(|gap| (gap[1] - gap[0]) / 1_000)
                .max()
                .unwrap_or(0);
            Some(longest)
        })
        .collect()
}

/// For each leader loss, the longest gap between acknowledgements of one
/// producer that spans it (producers with no acknowledgement on one side
/// are not counted).
pub(super) fn unavailability(history: &[Record]) -> Vec<u64> {
    let losses: Vec<u64> = history
        .iter()
        .filter(|r| {
            matches!(
                r.event,
                Event::Fault {
                    leader_loss: true,
                    ..
                }
            )
        })
        .map(|r| r.at_us)
        .collect();
    let acks = acks_by_producer(history);
    let producers: BTreeSet<u32> = acks.keys().copied().collect();
    losses
        .iter()
        .map(|&at| {
            producers
                .iter()
                .filter_map(|p| {
                    let times = &acks[p];
                    let after = times.partition_point(|&t| t < at);
                    let before = after.checked_sub(1).map(|i| times[i])?;
                    let next = times.get(after).copied()?;
                    Some((next - before) / 1_000)
                })
                .max()
                .unwrap_or(0)
        })
        .collect()
}
