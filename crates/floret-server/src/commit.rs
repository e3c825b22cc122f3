//! Commits one operation in any shard from any node: through this node's
//! proposer when it leads the shard, else through the leader's
//! `Peer.Propose`. Admin calls (policies, dead letters) go this way; the data
//! plane forwards whole requests instead.
//!
//! IMPLEMENTATION CAVEATS
//! - The leader is this node's view of the shard; a call that reaches a node
//!   which just lost the leadership answers UNAVAILABLE with a retry hint.

use std::sync::Arc;
use std::time::Duration;

use floret_cluster::{Shards, decode, encode};
use floret_proto::peer::v1::RaftMessage;
use floret_store::{Op, OpReply, ShardId};
use tonic::Status;

use crate::proposer::Proposers;
use crate::service::status;

/// How long committing through another node may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Commits operations wherever their shard is led.
#[derive(Clone)]
pub struct Committer {
    shards: Arc<Shards>,
    proposers: Proposers,
}

impl Committer {
    /// A committer over this node's shards and proposers.
    pub fn new(shards: Arc<Shards>, proposers: Proposers) -> Self {
        Self { shards, proposers }
    }

    /// Commits `op` in `shard` and returns what applying it answered.
    pub async fn commit(&self, shard: ShardId, op: Op) -> Result<OpReply, Status> {
        if self.shards.leads(shard)
            && let Some(proposer) = self.proposers.get(shard)
        {
            return proposer.propose(op).await.map_err(status::from_propose);
        }
        let node = self.shards.route(shard);
        if node == self.shards.node_id() {
            return Err(status::no_leader(shard, None));
        }
        let Some(mut client) = self.shards.peers().peer_client(node) else {
            return Err(status::no_leader(shard, Some(node)));
        };
        let request = RaftMessage {
            shard_id: shard,
            payload: encode(&op),
        };
        let answer = match tokio::time::timeout(FORWARD_TIMEOUT, client.propose(request)).await {
            Ok(Ok(answer)) => answer.into_inner(),
            Ok(Err(remote)) => return Err(status::relayed(remote, shard, node)),
            Err(_) => {
                return Err(status::leader_unreachable(
                    shard,
                    node,
                    &Status::deadline_exceeded(format!("no answer within {FORWARD_TIMEOUT:?}")),
                ));
            }
        };
        decode(&answer.payload).map_err(|error| {
            Status::internal(format!(
                "node {node} answered a proposal in shard {shard} with an undecodable reply: {error}"
            ))
        })
    }
}
