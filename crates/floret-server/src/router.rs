//! The shard router: "lead it here, or call the leader with a deadline and
//! relay its answer", for every path that needs a shard's leader. Produces
//! forwarded whole, operations committed from the Admin service
//! ([`ShardRouter::commit`]) and settles sent to the node holding their
//! leases all go through it, with one deadline ([`FORWARD_TIMEOUT`]) and one
//! rule for what a failed call means.
//!
//! This is the calling side of the node-to-node API; the receiving side is
//! `service/peer.rs`.
//!
//! A node removed from the cluster may still be running (and taking client
//! calls) a moment after it left; its peers then refuse its calls
//! (PERMISSION_DENIED, under mutual TLS). Such a refusal, on a node whose
//! member list says it is leaving or gone, becomes UNAVAILABLE with a retry
//! hint: the client tries another node, and a forwarded produce is not
//! reported to it as its own lack of permission.
//!
//! IMPLEMENTATION CAVEATS
//! - The leader is this node's view of the shard; a call that reaches a node
//!   which just lost the leadership is answered UNAVAILABLE with a retry hint.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::{Shards, decode, encode};
use floret_proto::peer::v1::peer_client::PeerClient;
use floret_proto::peer::v1::{PeerSettleRequest, PeerSettleResponse, RaftMessage};
use floret_proto::v1;
use floret_store::{NodeId, Op, OpReply, ShardId};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::error::{NO_LEADER_RETRY_AFTER, RequestError};
use crate::produce::ProduceAnswer;
use crate::produce::proposer::{Proposers, ShardProposer};
use crate::service::request_id;
use crate::service::status::RETRY_AFTER_MS;

/// How long a call to another node may take (a leader's own commit timeout is shorter).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a call about a shard goes.
pub enum Route {
    /// This node leads the shard: its proposer.
    Here(ShardProposer),
    /// The node this node believes leads it.
    Leader(NodeId),
}

/// Why a call to another node failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeCallError {
    /// The node is not a member: there is no channel to it.
    NotMember,
    /// The node answered with a refusal of its own.
    Refused {
        /// Its gRPC status code, as a number.
        grpc_code: i32,
        /// Its message.
        message: String,
        /// Its retry hint.
        retry_after: Option<Duration>,
    },
    /// No answer: transport failure or [`FORWARD_TIMEOUT`]; the outcome is unknown.
    NoAnswer {
        /// What the call failed with.
        why: String,
    },
}

impl NodeCallError {
    /// What went wrong, in words.
    pub fn why(&self) -> &str {
        match self {
            Self::NotMember => "it is not a member",
            Self::Refused { message, .. } => message,
            Self::NoAnswer { why } => why,
        }
    }
}

/// Routes calls about shards to their leaders.
#[derive(Clone)]
pub struct ShardRouter {
    shards: Arc<Shards>,
    proposers: Proposers,
}

impl ShardRouter {
    /// A router over this node's shards and proposers.
    pub fn new(shards: Arc<Shards>, proposers: Proposers) -> Self {
        Self { shards, proposers }
    }

    /// Where a call about `shard` goes; NoLeader when this node believes it
    /// leads the shard but cannot propose to it.
    pub fn route(&self, shard: ShardId) -> Result<Route, RequestError> {
        if self.shards.leads(shard)
            && let Some(proposer) = self.proposers.get(shard)
        {
            return Ok(Route::Here(proposer.clone()));
        }
        let node = self.shards.route(shard);
        if node == self.shards.node_id() {
            return Err(RequestError::NoLeader {
                shard,
                leader: None,
            });
        }
        Ok(Route::Leader(node))
    }

    /// Calls `node` with `call` over its channel, within [`FORWARD_TIMEOUT`].
    pub async fn call_node<T, F, Fut>(&self, node: NodeId, call: F) -> Result<T, NodeCallError>
    where
        F: FnOnce(Channel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let Some(channel) = self.shards.peers().channel(node) else {
            return Err(NodeCallError::NotMember);
        };
        match tokio::time::timeout(FORWARD_TIMEOUT, call(channel)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(remote)) if remote.code() == Code::PermissionDenied && self.has_left() => {
                Err(NodeCallError::Refused {
                    grpc_code: Code::Unavailable as i32,
                    message: format!(
                        "node {} has been removed from the cluster and its peers no longer take its calls; send to a member",
                        self.shards.node_id()
                    ),
                    retry_after: Some(NO_LEADER_RETRY_AFTER),
                })
            }
            Ok(Err(remote)) => Err(classify(remote)),
            Err(_) => Err(NodeCallError::NoAnswer {
                why: format!("no answer within {FORWARD_TIMEOUT:?}"),
            }),
        }
    }

    /// Whether this node is leaving the cluster, or has left it, as its
    /// replica of the membership group says.
    fn has_left(&self) -> bool {
        let me = self.shards.node_id();
        self.shards
            .members_view()
            .member(me)
            .is_none_or(|member| member.leaving)
    }

    /// Calls `node`, believed to lead `shard`, and relays its answer: its own
    /// refusals pass through with their retry hint; no answer is
    /// LeaderUnreachable (the outcome is unknown).
    pub async fn call_leader<T, F, Fut>(
        &self,
        shard: ShardId,
        node: NodeId,
        call: F,
    ) -> Result<T, RequestError>
    where
        F: FnOnce(Channel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.call_node(node, call)
            .await
            .map_err(|error| match error {
                NodeCallError::NotMember => RequestError::NoLeader {
                    shard,
                    leader: Some(node),
                },
                NodeCallError::Refused {
                    grpc_code,
                    message,
                    retry_after,
                } => RequestError::Relayed {
                    grpc_code,
                    message,
                    retry_after,
                },
                NodeCallError::NoAnswer { why } => {
                    RequestError::LeaderUnreachable { shard, node, why }
                }
            })
    }

    /// Sends a produce to `node`, believed to lead `shard`, marked as
    /// forwarded, and returns its answer.
    pub async fn forward_produce(
        &self,
        shard: ShardId,
        node: NodeId,
        request: v1::ProduceRequest,
        max_request_bytes: usize,
    ) -> Result<ProduceAnswer, RequestError> {
        let mut request = tonic::Request::new(request);
        request_id::pass_on(request.metadata_mut());
        let answer = self
            .call_leader(shard, node, |channel| async move {
                PeerClient::new(channel)
                    .max_encoding_message_size(max_request_bytes)
                    .forward_produce(request)
                    .await
            })
            .await?
            .into_inner();
        Ok(ProduceAnswer {
            sequences: answer.sequences,
            duplicate: answer.duplicate,
            leader_address: answer.leader_address,
        })
    }

    /// Settles deliveries on `node`, the leader of their shards, where their leases are.
    pub async fn settle_on(
        &self,
        node: NodeId,
        request: PeerSettleRequest,
    ) -> Result<PeerSettleResponse, NodeCallError> {
        let mut request = tonic::Request::new(request);
        request_id::pass_on(request.metadata_mut());
        let answer = self
            .call_node(node, |channel| async move {
                PeerClient::new(channel).settle(request).await
            })
            .await?;
        Ok(answer.into_inner())
    }

    /// Commits `op` in `shard` wherever it is led and returns what applying it answered.
    pub async fn commit(&self, shard: ShardId, op: Op) -> Result<OpReply, RequestError> {
        let node = match self.route(shard)? {
            Route::Here(proposer) => return Ok(proposer.propose(op).await?),
            Route::Leader(node) => node,
        };
        let request = RaftMessage {
            shard_id: shard,
            payload: encode(&op),
        };
        let answer = self
            .call_leader(shard, node, |channel| async move {
                PeerClient::new(channel).propose(request).await
            })
            .await?
            .into_inner();
        decode(&answer.payload).map_err(|error| {
            RequestError::Internal(format!(
                "node {node} answered a proposal in shard {shard} with an undecodable reply: {error}"
            ))
        })
    }
}

/// A status another node answered: transport failures (no retry hint of
/// floret's own) mean no answer; anything else is the node's refusal.
fn classify(remote: Status) -> NodeCallError {
    let retry_after = remote
        .metadata()
        .get(RETRY_AFTER_MS)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .map(Duration::from_millis);
    let transport_failure = matches!(
        remote.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    ) && retry_after.is_none();
    if transport_failure {
        return NodeCallError::NoAnswer {
            why: remote.message().to_owned(),
        };
    }
    NodeCallError::Refused {
        grpc_code: remote.code() as i32,
        message: remote.message().to_owned(),
        retry_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_connection_is_no_answer_and_a_leaders_refusal_is_relayed() {
        let broken = classify(Status::unavailable("connection reset"));
        assert_eq!(
            broken,
            NodeCallError::NoAnswer {
                why: "connection reset".into()
            }
        );
        let mut busy = Status::unavailable("shard 2 is handing its leadership over");
        busy.metadata_mut().insert(RETRY_AFTER_MS, 200.into());
        let NodeCallError::Refused { retry_after, .. } = classify(busy) else {
            panic!("a status with floret's retry hint is the leader's own answer");
        };
        assert_eq!(retry_after, Some(Duration::from_millis(200)));
        let invalid = classify(Status::invalid_argument("queue name too long"));
        assert!(
            matches!(invalid, NodeCallError::Refused { grpc_code, .. } if grpc_code == Code::InvalidArgument as i32)
        );
    }
}
