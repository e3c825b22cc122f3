//! Checks a queue history after a full drain, the way Jepsen's total-queue
//! checker does, plus the orders floret promises. Deterministic: the same
//! history gives the same report.
//!
//! - **lost**: acknowledged, never delivered. A violation.
//! - **unexpected**: delivered, never attempted (or refused for sure). A violation.
//! - **corrupted**: a payload failing its checksum, or one sequence carrying
//!   two different attempts. A violation.
//! - **order**: among the acknowledged attempts of a producer, a later
//!   attempt has a lower sequence than an earlier one (by its
//!   acknowledgement or its first delivery), so the queue does not hold
//!   them in the order they were produced. A violation. The order in which
//!   first deliveries *arrive* is not checked: a delivery lost in transit
//!   when a leader dies comes again after later ones, which at-least-once
//!   delivery allows.
//! - **duplicated**: deliveries beyond a message's first (allowed: delivery
//!   is at least once), and of those, deliveries after a successful ack.
//! - **recovered**: outcome unknown to the producer, delivered anyway (allowed).
//!
//! Fairness: Jain's index over each producer's first deliveries per
//! one-second window, counting the producers that had acknowledged messages
//! (delivered later: a lost one is reported as lost, not as unfairness)
//! waiting at both ends of the window; reported as the median over windows
//! with at least two such producers, and again over the fault-free windows
//! (none of a round, from its start until [`RECOVERY_US`] after it healed
//! and every shard was led by its preferred replica again, falls in them). A fault-free window
//! whose index is below [`MIN_FAULT_FREE_JAIN`] is a violation: fairness
//! must hold whenever nothing is broken.
//!
//! Unavailability: for each fault marked as a leader loss, the longest any
//! producer went without an acknowledgement across it.

use std::collections::{BTreeMap, HashMap};

use floret_sched::jain_index;
use serde::Serialize;

use crate::history::{Event, MessageId, Outcome, Payload, Record};

/// Window for the fairness figure.
const FAIRNESS_WINDOW_US: u64 = 1_000_000;
/// Time after a heal that still counts as the fault's: leaderships return,
/// leases lapse and redeliveries go out.
pub const RECOVERY_US: u64 = 5_000_000;
/// Lowest Jain's index a fault-free window may have.
pub const MIN_FAULT_FREE_JAIN: f64 = 0.9;

/// What the checker found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    /// Produce attempts.
    pub attempted: u64,
    /// Attempts acknowledged.
    pub acknowledged: u64,
    /// Attempts refused for sure.
    pub failed: u64,
    /// Attempts whose outcome the producer did not learn.
    pub unknown: u64,
    /// Distinct attempts delivered at least once.
    pub delivered: u64,
    /// Deliveries, redeliveries included.
    pub deliveries: u64,
    /// Acknowledged, never delivered.
    pub lost: Vec<MessageId>,
    /// Delivered but never attempted, or refused for sure.
    pub unexpected: Vec<String>,
    /// Damaged payloads and sequences carrying two attempts.
    pub corrupted: Vec<String>,
    /// Order violations.
    pub order_violations: Vec<String>,
    /// Deliveries beyond the first of each message.
    pub duplicated: u64,
    /// Of those, deliveries after the message was acked by a consumer.
    pub delivered_after_ack: u64,
    /// Unknown outcome, delivered.
    pub recovered: u64,
    /// Median Jain's index over the windows with at least two backlogged
    /// producers, and how many windows that was.
    pub fairness: Option<(f64, usize)>,
    /// The same over the fault-free windows only.
    pub fault_free_fairness: Option<(f64, usize)>,
    /// Fault-free windows below [`MIN_FAULT_FREE_JAIN`]: `at <s>: <index>`.
    pub unfair_windows: Vec<String>,
    /// For each leader loss, the longest gap between two acknowledgements
    /// of one producer that spans it, in milliseconds.
    pub unavailability_ms: Vec<u64>,
    /// How long each produce call took, client retries included, whatever
    /// its outcome (a call that timed out counts), in milliseconds.
    #[serde(skip)]
    pub produce_ms: Vec<u64>,
    /// For each restart of a killed node, the longest gap between two
    /// acknowledgements of one producer from the restart until the round
    /// healed (leaderships back on their preferred replicas), in
    /// milliseconds: the stall the hand-backs caused.
    pub hand_back_ms: Vec<u64>,
    /// The 99th percentile of `produce_ms`.
    pub produce_p99_ms: Option<u64>,
    /// The longest of `produce_ms`.
    pub produce_max_ms: Option<u64>,
}

impl Report {
    /// Every violation, one line each (empty when the history is valid).
    pub fn violations(&self) -> Vec<String> {
        let mut found = Vec::new();
        let mut list = |what: &str, items: Vec<String>| {
            if !items.is_empty() {
                let shown: Vec<&str> = items.iter().take(10).map(String::as_str).collect();
                found.push(format!("{} {what}: {}", items.len(), shown.join(", ")));
            }
        };
        list("lost", self.lost.iter().map(ToString::to_string).collect());
        list("unexpected", self.unexpected.clone());
        list("corrupted", self.corrupted.clone());
        list("order violations", self.order_violations.clone());
        list(
            &format!("fault-free windows with Jain's index below {MIN_FAULT_FREE_JAIN}"),
            self.unfair_windows.clone(),
        );
        found
    }

    /// True when nothing was lost, unexpected, corrupted or out of order,
    /// and every fault-free window was fair.
    pub fn is_valid(&self) -> bool {
        self.violations().is_empty()
    }
}

/// What became of one attempt.
#[derive(Default)]
struct Attempt {
    invoked_at: Option<u64>,
    outcome: Option<Outcome>,
    completed_at: Option<u64>,
    first_delivered_at: Option<u64>,
    sequence: Option<u64>,
    deliveries: u64,
    settled_at: Option<u64>,
}

/// Checks `history` (in recording order) after a full drain.
pub fn check(history: &[Record]) -> Report {
    let mut report = Report::default();
    let mut attempts: BTreeMap<MessageId, Attempt> = BTreeMap::new();
    let mut by_sequence: HashMap<(String, u64), MessageId> = HashMap::new();
    for record in history {
        match &record.event {
            Event::Invoked(id) => {
                attempts.entry(*id).or_default().invoked_at = Some(record.at_us);
            }
            Event::Completed { id, outcome } => {
                let attempt = attempts.entry(*id).or_default();
                attempt.outcome = Some(outcome.clone());
                attempt.completed_at = Some(record.at_us);
                if let Outcome::Acknowledged { sequence } = outcome {
                    attempt.sequence = Some(*sequence);
                }
            }
            Event::Delivered {
                producer_id,
                sequence,
                payload,
                ..
            } => {
                report.deliveries += 1;
                let id = match payload {
                    Payload::Intact(id) => *id,
                    Payload::Corrupt(why) => {
                        report
                            .corrupted
                            .push(format!("{producer_id}/{sequence}: {why}"));
                        continue;
                    }
                };
                if crate::history::producer_name(id.producer) != *producer_id {
                    report.corrupted.push(format!(
                        "{producer_id}/{sequence} carries {id} of another producer"
                    ));
                    continue;
                }
                match by_sequence.get(&(producer_id.clone(), *sequence)) {
                    Some(other) if *other != id => report.corrupted.push(format!(
                        "{producer_id}/{sequence} delivered as both {other} and {id}"
                    )),
                    Some(_) => {}
                    None => {
                        by_sequence.insert((producer_id.clone(), *sequence), id);
                    }
                }
                let attempt = attempts.entry(id).or_default();
                attempt.deliveries += 1;
                if attempt.deliveries > 1 {
                    report.duplicated += 1;
                    if attempt.settled_at.is_some() {
                        report.delivered_after_ack += 1;
                    }
                    continue;
                }
                attempt.first_delivered_at = Some(record.at_us);
                match attempt.sequence {
                    Some(acked) if acked != *sequence => report.corrupted.push(format!(
                        "{id} acknowledged as sequence {acked}, delivered as {sequence}"
                    )),
                    _ => attempt.sequence = Some(*sequence),
                }
            }
            Event::Settled { id } => {
                attempts.entry(*id).or_default().settled_at = Some(record.at_us);
            }
            Event::Fault { .. } | Event::Restarted { .. } | Event::Healed => {}
        }
    }
    let mut last_acked_sequence: HashMap<u32, (u64, u64)> = HashMap::new();
    for (id, attempt) in &attempts {
        let delivered = attempt.deliveries > 0;
        if attempt.invoked_at.is_some() {
            report.attempted += 1;
        } else if delivered {
            report
                .unexpected
                .push(format!("{id} was delivered, never sent"));
        }
        if delivered {
            report.delivered += 1;
        }
        if let (Some(invoked), Some(completed)) = (attempt.invoked_at, attempt.completed_at) {
            report
                .produce_ms
                .push(completed.saturating_sub(invoked) / 1_000);
        }
        match &attempt.outcome {
            Some(Outcome::Acknowledged { sequence }) => {
                report.acknowledged += 1;
                if !delivered {
                    report.lost.push(*id);
                }
                if let Some(&(counter, previous)) = last_acked_sequence.get(&id.producer)
                    && previous >= *sequence
                {
                    report.order_violations.push(format!(
                        "{id} acknowledged as sequence {sequence}, after #{counter} got {previous}"
                    ));
                }
                last_acked_sequence.insert(id.producer, (id.counter, *sequence));
            }
            Some(Outcome::Failed { error }) => {
                report.failed += 1;
                if delivered {
                    report
                        .unexpected
                        .push(format!("{id} was refused ({error}) and delivered"));
                }
            }
            Some(Outcome::Unknown { .. }) | None if attempt.invoked_at.is_some() => {
                report.unknown += 1;
                if delivered {
                    report.recovered += 1;
                }
            }
            _ => {}
        }
    }
    let windows = fairness_windows(&attempts);
    report.fairness = median(windows.iter().map(|&(_, index)| index).collect());
    let faults = fault_spans(history);
    let fault_free: Vec<(u64, f64)> = windows
        .into_iter()
        .filter(|&(start, _)| {
            let stop = start + FAIRNESS_WINDOW_US;
            faults.iter().all(|&(from, to)| stop <= from || start >= to)
        })
        .collect();
    report.fault_free_fairness = median(fault_free.iter().map(|&(_, index)| index).collect());
    report.unfair_windows = fault_free
        .iter()
        .filter(|&&(_, index)| index < MIN_FAULT_FREE_JAIN)
        .map(|&(start, index)| format!("at {:.0} s: {index:.3}", start as f64 / 1e6))
        .collect();
    report.unavailability_ms = unavailability(history);
    report.hand_back_ms = hand_back_stalls(history);
    report.produce_ms.sort_unstable();
    report.produce_p99_ms = percentile(&report.produce_ms, 0.99);
    report.produce_max_ms = report.produce_ms.last().copied();
    report
}

/// The median of `indexes` and how many there were; None when empty.
fn median(mut indexes: Vec<f64>) -> Option<(f64, usize)> {
    if indexes.is_empty() {
        return None;
    }
    indexes.sort_by(f64::total_cmp);
    Some((indexes[indexes.len() / 2], indexes.len()))
}

/// When each round's fault held, in microseconds: from its first fault
/// event until [`RECOVERY_US`] after the round healed (or the history ended).
fn fault_spans(history: &[Record]) -> Vec<(u64, u64)> {
    rounds(history, |event| matches!(event, Event::Fault { .. }))
        .into_iter()
        .map(|(from, healed)| (from, healed.map_or(u64::MAX, |at| at + RECOVERY_US)))
        .collect()
}

/// Each round that `opens` marks: the time of its first record that
/// `opens` matches, and when the round healed (None if it never did).
fn rounds(history: &[Record], opens: impl Fn(&Event) -> bool) -> Vec<(u64, Option<u64>)> {
    let mut rounds = Vec::new();
    let mut open: Option<u64> = None;
    for record in history {
        if opens(&record.event) {
            open.get_or_insert(record.at_us);
        } else if matches!(record.event, Event::Healed)
            && let Some(from) = open.take()
        {
            rounds.push((from, Some(record.at_us)));
        }
    }
    rounds.extend(open.map(|from| (from, None)));
    rounds
}

/// Each one-second window with two or more backlogged producers: its start
/// and Jain's index over their first deliveries in it.
fn fairness_windows(attempts: &BTreeMap<MessageId, Attempt>) -> Vec<(u64, f64)> {
    let mut acked_at: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut delivered_at: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut end = 0;
    for (id, attempt) in attempts {
        if let (Some(Outcome::Acknowledged { .. }), Some(invoked), Some(_)) = (
            &attempt.outcome,
            attempt.invoked_at,
            attempt.first_delivered_at,
        ) {
            acked_at.entry(id.producer).or_default().push(invoked);
        }
        if let Some(at) = attempt.first_delivered_at {
            delivered_at.entry(id.producer).or_default().push(at);
            end = end.max(at);
        }
    }
    for times in acked_at.values_mut().chain(delivered_at.values_mut()) {
        times.sort_unstable();
    }
    let count_by = |times: Option<&Vec<u64>>, t: u64| -> usize {
        times.map_or(0, |times| times.partition_point(|&at| at < t))
    };
    let waiting = |producer: u32, t: u64| {
        count_by(acked_at.get(&producer), t) > count_by(delivered_at.get(&producer), t)
    };
    let mut windows = Vec::new();
    let mut start = 0;
    while start < end {
        let stop = start + FAIRNESS_WINDOW_US;
        let shares: Vec<f64> = acked_at
            .keys()
            .filter(|&&p| waiting(p, start) && waiting(p, stop))
            .map(|&p| {
                let times = delivered_at.get(&p);
                (count_by(times, stop) - count_by(times, start)) as f64
            })
            .collect();
        if shares.len() >= 2
            && let Some(index) = jain_index(&shares)
        {
            windows.push((start, index));
        }
        start = stop;
    }
    windows
}

mod stalls;
#[cfg(test)]
mod tests;

pub use stalls::percentile;
use stalls::{hand_back_stalls, unavailability};
