//! What the pumps split a sink's caps by: each node's demand for a queue
//! (its backlogged weight, what it sent over its last poll, and whether
//! its parts held it back), this node's as its pumps record it, and the
//! other nodes', asked over the peer port (`Peer.SinkWeight`).
//!
//! A node's pump rolls its demand over at each of its polls; the other
//! nodes get the last rolled one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floret_cluster::Shards;
use floret_proto::peer::v1::{SinkWeightRequest, SinkWeightResponse};

use super::rate_split::HELD_BACK_USE;

/// How long a node's answer is waited for; no answer counts as silent.
pub const ANSWER_WAIT: Duration = Duration::from_millis(200);

/// One node's demand on a queue's sink, over its last poll.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PumpDemand {
    /// The sum of the weights of the queue's backlogged producers there.
    pub weight: u64,
    /// Messages a second it sent.
    pub sent_per_second: f64,
    /// Whether its part of the rate cap held a batch back.
    pub rate_held_back: bool,
    /// Whether its part of max_in_flight held a batch back.
    pub batches_held_back: bool,
}

impl PumpDemand {
    /// As a peer answered it.
    pub fn from_wire(answer: &SinkWeightResponse) -> Self {
        Self {
            weight: answer.weight,
            sent_per_second: answer.sent_per_second,
            rate_held_back: answer.rate_held_back,
            batches_held_back: answer.batches_held_back,
        }
    }

    /// As this node answers it.
    pub fn to_wire(self) -> SinkWeightResponse {
        SinkWeightResponse {
            weight: self.weight,
            sent_per_second: self.sent_per_second,
            rate_held_back: self.rate_held_back,
            batches_held_back: self.batches_held_back,
        }
    }
}

/// A pump's record since its last poll, and what it rolled over then.
#[derive(Debug, Clone, Copy, Default)]
struct PumpRecord {
    weight: u64,
    sent: u64,
    rate_held_back: bool,
    batches_held_back: bool,
    rolled_at: Option<Instant>,
    last: PumpDemand,
}

/// Per queue, what this node's pump records; cheap to clone.
#[derive(Clone, Default)]
pub struct LocalSinkWeights {
    pumps: Arc<Mutex<HashMap<String, PumpRecord>>>,
}

impl LocalSinkWeights {
    /// The demand this node's pump of `queue` rolled over last, with its
    /// current weight (nothing without a pump).
    pub fn demand(&self, queue: &str) -> PumpDemand {
        self.with(queue, |record| PumpDemand {
            weight: record.weight,
            ..record.last
        })
        .unwrap_or_default()
    }

    pub(super) fn set_weight(&self, queue: &str, weight: u64) {
        self.record(queue, |record| record.weight = weight);
    }

    pub(super) fn sent(&self, queue: &str, messages: usize) {
        self.record(queue, |record| record.sent += messages as u64);
    }

    pub(super) fn rate_held_back(&self, queue: &str) {
        self.record(queue, |record| record.rate_held_back = true);
    }

    pub(super) fn batches_held_back(&self, queue: &str) {
        self.record(queue, |record| record.batches_held_back = true);
    }

    /// Ends the pump's poll at `now`, in which its part of the rate was
    /// `rate_part` (None: no cap): what it recorded since the last one
    /// becomes its demand, and it starts recording afresh. A batch that
    /// waited for tokens counts as the part holding the pump back only if
    /// it sent at least [`HELD_BACK_USE`] of that part.
    pub(super) fn roll(&self, queue: &str, now: Instant, rate_part: Option<f64>) -> PumpDemand {
        self.record(queue, |record| {
            let seconds = record
                .rolled_at
                .map_or(0.0, |at| now.saturating_duration_since(at).as_secs_f64());
            let sent_per_second = if seconds > 0.0 {
                record.sent as f64 / seconds
            } else {
                0.0
            };
            let used_its_part =
                rate_part.is_some_and(|part| sent_per_second >= HELD_BACK_USE * part);
            record.last = PumpDemand {
                weight: record.weight,
                sent_per_second,
                rate_held_back: record.rate_held_back && used_its_part,
                batches_held_back: record.batches_held_back,
            };
            record.sent = 0;
            record.rate_held_back = false;
            record.batches_held_back = false;
            record.rolled_at = Some(now);
            record.last
        })
    }

    pub(super) fn forget(&self, queue: &str) {
        self.pumps.lock().expect("never poisoned").remove(queue);
    }

    fn with<T>(&self, queue: &str, read: impl FnOnce(&PumpRecord) -> T) -> Option<T> {
        self.pumps
            .lock()
            .expect("never poisoned")
            .get(queue)
            .map(read)
    }

    fn record<T>(&self, queue: &str, change: impl FnOnce(&mut PumpRecord) -> T) -> T {
        let mut pumps = self.pumps.lock().expect("never poisoned");
        match pumps.get_mut(queue) {
            Some(record) => change(record),
            None => change(pumps.entry(queue.to_owned()).or_default()),
        }
    }
}

/// Every other member's id and demand for `queue`; None for one that did
/// not answer within [`ANSWER_WAIT`].
pub async fn others(shards: &Shards, queue: &str) -> Vec<(u64, Option<PumpDemand>)> {
    let peers = shards.peers();
    let asks = peers.others().map(|node| {
        let client = peers.peer_client(node);
        let request = SinkWeightRequest {
            queue: queue.to_owned(),
        };
        async move {
            let demand = async {
                let mut client = client?;
                let answer = tokio::time::timeout(ANSWER_WAIT, client.sink_weight(request))
                    .await
                    .ok()?
                    .ok()?;
                Some(PumpDemand::from_wire(answer.get_ref()))
            };
            (node, demand.await)
        }
    });
    futures::future::join_all(asks).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roll_turns_what_the_pump_recorded_into_its_demand_and_starts_afresh() {
        let weights = LocalSinkWeights::default();
        let start = Instant::now();
        weights.set_weight("q", 3);
        weights.roll("q", start, Some(400.0));
        weights.sent("q", 40);
        weights.sent("q", 60);
        weights.rate_held_back("q");
        let demand = weights.roll("q", start + Duration::from_millis(250), Some(400.0));
        assert_eq!(demand.weight, 3);
        assert!((demand.sent_per_second - 400.0).abs() < 1e-6);
        assert!(demand.rate_held_back && !demand.batches_held_back);
        assert_eq!(weights.demand("q"), demand);
        let next = weights.roll("q", start + Duration::from_millis(500), Some(400.0));
        assert_eq!(next.sent_per_second, 0.0);
        assert!(!next.rate_held_back);
    }

    #[test]
    fn a_wait_for_tokens_with_most_of_the_part_unused_is_not_held_back() {
        let weights = LocalSinkWeights::default();
        let start = Instant::now();
        weights.roll("q", start, Some(400.0));
        weights.sent("q", 20);
        weights.rate_held_back("q");
        let demand = weights.roll("q", start + Duration::from_millis(250), Some(400.0));
        assert!(!demand.rate_held_back, "{demand:?}");
    }
}
