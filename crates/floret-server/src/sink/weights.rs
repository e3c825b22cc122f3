//! The backlogged weights the pumps split a sink's rate by: this node's
//! own, as its pumps learn them from the dispatcher, and the other nodes',
//! asked over the peer port (`Peer.SinkWeight`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use floret_cluster::Shards;
use floret_proto::peer::v1::SinkWeightRequest;

use super::in_flight_split::NodeWeight;

/// How long a node's answer is waited for; no answer counts as silent.
pub const ANSWER_WAIT: Duration = Duration::from_millis(200);

/// Per queue, the backlogged weight this node's pump has; cheap to clone.
#[derive(Clone, Default)]
pub struct LocalSinkWeights {
    weights: Arc<Mutex<HashMap<String, u64>>>,
}

impl LocalSinkWeights {
    /// The weight this node's pump of `queue` has (0 without a pump).
    pub fn get(&self, queue: &str) -> u64 {
        self.weights
            .lock()
            .expect("never poisoned")
            .get(queue)
            .copied()
            .unwrap_or(0)
    }

    pub(super) fn set(&self, queue: &str, weight: u64) {
        self.weights
            .lock()
            .expect("never poisoned")
            .insert(queue.to_owned(), weight);
    }

    pub(super) fn forget(&self, queue: &str) {
        self.weights.lock().expect("never poisoned").remove(queue);
    }
}

/// Every other member's id and weight for `queue`; None for one that did
/// not answer within [`ANSWER_WAIT`].
pub async fn others(shards: &Shards, queue: &str) -> Vec<NodeWeight> {
    let peers = shards.peers();
    let asks = peers.others().map(|node| {
        let client = peers.peer_client(node);
        let request = SinkWeightRequest {
            queue: queue.to_owned(),
        };
        async move {
            let weight = async {
                let mut client = client?;
                let answer = tokio::time::timeout(ANSWER_WAIT, client.sink_weight(request))
                    .await
                    .ok()?
                    .ok()?;
                Some(answer.into_inner().weight)
            };
            (node, weight.await)
        }
    });
    futures::future::join_all(asks).await
}
