//! How a merged consumer's credits are split over its sources: one credit
//! kept at every live source with nothing backlogged, the rest split by
//! the backlogged weight each source reports on its stream
//! ([`CreditSplit`](crate::service::credit_split::CreditSplit)), none at
//! sources that are closed or silent. Which sources are live and what they
//! weigh is [`source_weights`], pure.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

use super::merge::Merge;
use super::tenant_shares::TENANT_WEIGHT_UNIT;
use super::{CreditChange, SOURCE_SILENT_AFTER, SourceRequest};

/// What the merge knows of one source when it splits credits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct SourceHeard {
    /// Its stream is open.
    pub connected: bool,
    /// What its last report on that stream makes it weigh; None before its
    /// first report (or from a node that never reports).
    pub reported: Option<u64>,
    /// How long ago it was last heard from on that stream.
    pub silent_for: Duration,
    /// In this process (the local dispatcher): never silent.
    pub local: bool,
}

/// Whether each source is live (connected, and not silent after it has
/// reported) and its weight: what its report makes it weigh (with the
/// cross-node split off, 1 if it has any backlog, so backlogged nodes share
/// equally), one tenant's weight ([`TENANT_WEIGHT_UNIT`]) while it has not
/// reported, 0 when not live. When no live source has any
/// weight, every live one weighs 1.
pub(super) fn source_weights(
    sources: &[SourceHeard],
    cross_node_split: bool,
) -> (Vec<bool>, Vec<u64>) {
    let live: Vec<bool> = sources
        .iter()
        .map(|source| {
            source.connected
                && (source.local
                    || source.reported.is_none()
                    || source.silent_for < SOURCE_SILENT_AFTER)
        })
        .collect();
    let mut weights: Vec<u64> = sources
        .iter()
        .zip(&live)
        .map(|(source, &live)| match (live, source.reported) {
            (false, _) => 0,
            (true, None) if cross_node_split => TENANT_WEIGHT_UNIT,
            (true, None) => 1,
            (true, Some(weight)) if cross_node_split => weight,
            (true, Some(weight)) => weight.min(1),
        })
        .collect();
    if weights.iter().all(|&w| w == 0) {
        for (weight, &live) in weights.iter_mut().zip(&live) {
            *weight = u64::from(live);
        }
    }
    (live, weights)
}

impl Merge {
    /// What the merge knows of each source now.
    fn heard(&self, now: Instant) -> Vec<SourceHeard> {
        (0..self.nodes.len())
            .map(|source| SourceHeard {
                connected: self.connected[source],
                reported: self.reported[source],
                silent_for: now.saturating_duration_since(self.last_heard[source]),
                local: source == 0,
            })
            .collect()
    }

    /// Whether the credits may be split: every source has reported its
    /// backlog, or the merge has waited long enough for the missing ones.
    fn may_split(&self, now: Instant) -> bool {
        self.reported.iter().all(Option::is_some) || now >= self.split_from
    }

    /// Keeps one credit at every live source with nothing backlogged (taking
    /// back the rest) so a message arriving there goes out at once, refilled
    /// only while the consumer has credit to spare (a source whose report
    /// still says idle while it delivers would otherwise be refilled without
    /// end), and none at dead ones; trims a backlogged source holding more
    /// than twice its weighted share of the consumer's window (its report may
    /// be stale); and splits the
    /// consumer's credits not promised to backlogged sources between them by
    /// weight, once [`Self::may_split`]. The idle sources' single credits are an accepted overcommit:
    /// they are not counted as promised, so a consumer with fewer credits
    /// than nodes still gets the backlog.
    pub(super) fn rebalance(&mut self, now: Instant) -> Result<(), Status> {
        let (live, weights) = source_weights(&self.heard(now), self.cross_node_split);
        let total_weight = weights.iter().fold(0u64, |sum, &w| sum.saturating_add(w));
        let usable_credits = self.usable_credits();
        let consumer_has_room = usable_credits > self.waiting.len() as u64;
        let mut changes: Vec<Option<CreditChange>> = vec![None; self.nodes.len()];
        for source in 0..self.nodes.len() {
            if !self.connected[source] {
                continue;
            }
            let keep = if !live[source] {
                0
            } else if weights[source] == 0 {
                if self.outstanding[source] == 0 && !consumer_has_room {
                    continue;
                }
                1
            } else {
                let window = self.consumer_credits.max(self.initial_credits);
                let share = weighted_share(window, weights[source], total_weight);
                if self.outstanding[source] <= 2 * share + 1 {
                    continue;
                }
                share
            };
            if self.outstanding[source] > keep {
                self.outstanding[source] = keep;
                changes[source] = Some(CreditChange::Set(keep as u32));
            } else if self.outstanding[source] < keep {
                self.outstanding[source] = keep;
                changes[source] = Some(CreditChange::Add(keep as u32));
            }
        }
        let promised = (0..self.nodes.len())
            .filter(|&source| weights[source] > 0)
            .map(|source| self.outstanding[source])
            .sum::<u64>()
            + self.waiting.len() as u64;
        let unpromised = usable_credits.saturating_sub(promised);
        if unpromised > 0 && self.may_split(now) {
            let grants = self.split.split(unpromised, &weights);
            for (source, grant) in grants.into_iter().enumerate() {
                if grant == 0 {
                    continue;
                }
                self.outstanding[source] += grant;
                let grant = u32::try_from(grant).unwrap_or(u32::MAX);
                changes[source] = Some(match changes[source] {
                    Some(CreditChange::Set(base)) => CreditChange::Set(base.saturating_add(grant)),
                    Some(CreditChange::Add(base)) => CreditChange::Add(base.saturating_add(grant)),
                    None => CreditChange::Add(grant),
                });
            }
        }
        for (source, change) in changes.into_iter().enumerate() {
            let Some(change) = change else {
                continue;
            };
            if source == 0 {
                match change {
                    CreditChange::Add(credits) => {
                        self.dispatcher.credit(self.local_consumer, credits)
                    }
                    CreditChange::Set(credits) => {
                        self.dispatcher.set_credits(self.local_consumer, credits)
                    }
                }
                .map_err(Status::from)?;
            } else {
                let request = (self.generations[source], SourceRequest::Credit(change));
                let _peer_stream_gone = self.peer_credits[source - 1].send(request);
            }
        }
        Ok(())
    }
}

/// `window * weight / total`, rounded up, without overflowing: weights come
/// from the sources' reports, and any node may report any number.
fn weighted_share(window: u64, weight: u64, total: u64) -> u64 {
    let share = (u128::from(window) * u128::from(weight)).div_ceil(u128::from(total.max(1)));
    share.min(u128::from(window)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(connected: bool, reported: Option<u64>, silent_ms: u64) -> SourceHeard {
        SourceHeard {
            connected,
            reported,
            silent_for: Duration::from_millis(silent_ms),
            local: false,
        }
    }

    #[test]
    fn node_unknown_to_gossip_is_starved_of_credits() {
        let local = SourceHeard {
            local: true,
            silent_for: Duration::from_secs(60),
            ..heard(true, Some(8), 0)
        };
        let reported = heard(true, Some(4), 200);
        let never_reported = heard(true, None, 60_000);
        let (live, weights) = source_weights(&[local, reported, never_reported], true);
        assert_eq!(live, [true, true, true]);
        assert_eq!(weights, [8, 4, TENANT_WEIGHT_UNIT]);
    }

    #[test]
    fn frozen_node_keeps_credits_while_its_connection_stays_open() {
        let sources = [
            heard(true, Some(2), 0),
            heard(true, Some(5), 3_000),
            heard(false, Some(5), 0),
        ];
        let (live, weights) = source_weights(&sources, true);
        assert_eq!(live, [true, false, false]);
        assert_eq!(weights, [2, 0, 0]);
    }

    #[test]
    fn nodes_without_backlog_all_weigh_one_and_the_split_can_be_turned_off() {
        let idle = [heard(true, Some(0), 0), heard(true, Some(0), 0)];
        assert_eq!(source_weights(&idle, true).1, [1, 1]);
        let busy = [heard(true, Some(6), 0), heard(true, Some(2), 0)];
        assert_eq!(source_weights(&busy, false).1, [1, 1]);
    }

    #[test]
    fn weight_reported_near_u64_max_overflows_the_split() {
        let total = [u64::MAX, 7]
            .iter()
            .fold(0u64, |sum, &w| sum.saturating_add(w));
        assert_eq!(weighted_share(100, u64::MAX, total), 100);
        assert_eq!(weighted_share(100, 7, total), 1);
        assert_eq!(weighted_share(10, 1, 3), 4);
        assert_eq!(weighted_share(10, 0, 0), 0);
    }
}
