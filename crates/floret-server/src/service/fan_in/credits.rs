//! How a merged consumer's credits are split over its sources: one credit
//! kept at every live source with nothing backlogged, the rest split by
//! backlogged weight ([`CreditSplit`](crate::service::credit_split::CreditSplit)),
//! none at dead sources.

use floret_cluster::Liveness;
use tonic::Status;

use super::CreditChange;
use super::merge::Merge;

impl Merge {
    /// Whether each source is connected and not declared dead by the view,
    /// and its weight for this queue: its backlogged weight in the view
    /// (with the cross-node split off: 1 if it has any backlog, so
    /// backlogged nodes share equally), or 1 without a view; 0 when not
    /// live. When no live source has any, every live one weighs 1.
    pub(super) fn weights(&self) -> (Vec<bool>, Vec<u64>) {
        let view = self.view.as_ref().map(|view| view.borrow().clone());
        let live: Vec<bool> = (0..self.nodes.len())
            .map(|source| {
                self.connected[source]
                    && view.as_ref().is_none_or(|view| {
                        view.get(&self.nodes[source])
                            .is_none_or(|node| node.liveness != Liveness::Dead)
                    })
            })
            .collect();
        let backlogged = |source: usize| {
            let Some(view) = &view else {
                return 1;
            };
            let weight = view
                .get(&self.nodes[source])
                .and_then(|node| node.report.queues.get(&self.queue))
                .map_or(0, |load| load.backlogged_weight);
            if self.cross_node_split {
                weight
            } else {
                weight.min(1)
            }
        };
        let mut weights: Vec<u64> = (0..self.nodes.len())
            .map(|source| if live[source] { backlogged(source) } else { 0 })
            .collect();
        if weights.iter().all(|&w| w == 0) {
            for (source, weight) in weights.iter_mut().enumerate() {
                *weight = u64::from(live[source]);
            }
        }
        (live, weights)
    }

    /// Keeps one credit at every live source with nothing backlogged (taking
    /// back the rest) so a message arriving there goes out at once, refilled
    /// only while the consumer has credit to spare (a source the view still
    /// calls idle while it delivers would otherwise be refilled without
    /// end), and none at dead ones; trims a backlogged source holding more
    /// than twice its weighted share of the consumer's window (its report may
    /// be stale); and splits the
    /// consumer's credits not promised to backlogged sources between them by
    /// weight. The idle sources' single credits are an accepted overcommit:
    /// they are not counted as promised, so a consumer with fewer credits
    /// than nodes still gets the backlog.
    pub(super) fn rebalance(&mut self) -> Result<(), Status> {
        let (live, weights) = self.weights();
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
        if unpromised > 0 {
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
                let _peer_stream_gone =
                    self.peer_credits[source - 1].send((self.generations[source], change));
            }
        }
        Ok(())
    }
}

/// `window * weight / total`, rounded up, without overflowing: weights come
/// from the gossip view, and any node may report any number.
fn weighted_share(window: u64, weight: u64, total: u64) -> u64 {
    let share = (u128::from(window) * u128::from(weight)).div_ceil(u128::from(total.max(1)));
    share.min(u128::from(window)) as u64
}

#[cfg(test)]
mod tests {
    use super::weighted_share;

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
