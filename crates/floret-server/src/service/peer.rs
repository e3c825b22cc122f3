//! The `floret.peer.v1.Peer` service, served on the peer port only: what
//! the other nodes of the cluster ask of this one. Raft RPCs for the shards
//! it holds (appends of every shard arrive on one stream per peer, each
//! handled as its own task and answered as soon as it is done), which
//! shards it has initialised (for bootstrap), settles of deliveries whose
//! leases are here, produces and operations to commit in shards it leads
//! (the calling side is [`crate::router::ShardRouter`]), the hand-back of a
//! shard's leadership to its preferred replica (decided in
//! [`crate::leadership::hand_back`]; openraft 0.9 has no leadership
//! transfer), and this node's own dispatcher (`own_dispatcher.rs`) and
//! figures (`admin/own.rs`) for the node that merges every node's.
//!
//! Under mutual TLS the caller is a member identified by its certificate
//! (`peer_identity.rs`), and a raft message (vote, append, snapshot) or a
//! hand-back request naming another node as its sender is refused.
//!
//! IMPLEMENTATION CAVEATS
//! - A member is trusted with everything else: a compromised member's
//!   certificate can still propose, settle and forward produces.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use floret_cluster::{Shards, batched, decode, encode};
use floret_proto::peer::v1::{self, peer_server::Peer};
use floret_store::{NodeId, ShardId, TypeConfig};
use futures::{Stream, StreamExt};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{InstallSnapshotRequest, VoteRequest, VoteResponse};
use tokio::sync::{mpsc, watch};
use tonic::Streaming;
use tonic::{Request, Response, Status};

use super::admin::AdminService;
use super::floret::produce_response;
use super::peer_identity::{self, check_sender};
use super::{convert, fan_in, now_unix_ms, own_dispatcher};
use crate::deliver::SettleKind;
use crate::error::RequestError;
use crate::leadership::hand_back::HandBack;
use crate::produce::ProducePipeline;
use crate::produce::proposer::Proposers;
use crate::raft_inputs::{self, SnapshotChunks};
use crate::request::InvalidRequest;
use crate::sink::LocalSinkWeights;
use floret_store::may_block;
use raft::{answer_bytes, append, raft_of, take_over, undecodable};

mod raft;

/// Serves the other nodes.
pub struct PeerService {
    shards: Arc<Shards>,
    proposers: Proposers,
    hand_back: HandBack,
    this_node: ThisNode,
    /// What each shard has received of a snapshot being sent to it.
    snapshot_chunks: Mutex<SnapshotChunks>,
    /// Becomes true when the node stops: open append streams end then, so
    /// the server's drain does not wait for peers to close them.
    stopping: watch::Receiver<bool>,
}

/// What the other nodes use of this node's client-facing parts.
pub struct ThisNode {
    /// The produce path, for produces other nodes forward here.
    pub produce: Arc<ProducePipeline>,
    /// This node's dispatcher and settler, for the other nodes' consumers.
    pub sources: fan_in::Sources,
    /// This node's own figures.
    pub admin: Arc<AdminService>,
    /// The backlogged weights of this node's sink pumps.
    pub sink_weights: LocalSinkWeights,
}

impl PeerService {
    /// The peer side of this node; it takes snapshots up to
    /// `max_snapshot_bytes`.
    pub fn new(
        shards: Arc<Shards>,
        proposers: Proposers,
        hand_back: HandBack,
        this_node: ThisNode,
        max_snapshot_bytes: u64,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        Self {
            shards,
            proposers,
            hand_back,
            this_node,
            snapshot_chunks: Mutex::new(SnapshotChunks::new(max_snapshot_bytes)),
            stopping,
        }
    }

    /// Resolves when the node starts to stop (or is gone).
    fn node_stops(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stopping = self.stopping.clone();
        async move {
            let _node_gone = stopping.wait_for(|stopping| *stopping).await;
        }
    }

    fn raft(&self, shard: ShardId) -> Result<floret_store::Raft, Status> {
        raft_of(&self.shards, shard)
    }
}

impl PeerService {
    /// Decodes an openraft request for the message's shard, checks that its
    /// `sender` is the caller and that it passes `check`, hands it to that
    /// shard's group with `call`, and encodes openraft's result.
    async fn relay<Req, Res, F, Fut>(
        &self,
        request: Request<v1::RaftMessage>,
        sender: impl FnOnce(&Req) -> NodeId,
        check: impl FnOnce(ShardId, &Req) -> Result<(), raft_inputs::RaftInputError>,
        call: F,
    ) -> Result<Response<v1::RaftMessage>, Status>
    where
        Req: serde::de::DeserializeOwned,
        Res: serde::Serialize,
        F: FnOnce(floret_store::Raft, Req) -> Fut,
        Fut: std::future::Future<Output = Res>,
    {
        let caller = peer_identity::caller(&request);
        let message = request.into_inner();
        let raft = self.raft(message.shard_id)?.clone();
        let decoded: Req = decode(&message.payload).map_err(undecodable)?;
        check_sender(caller, sender(&decoded))?;
        check(message.shard_id, &decoded).map_err(InvalidRequest::from)?;
        let result = call(raft, decoded).await;
        Ok(Response::new(v1::RaftMessage {
            shard_id: message.shard_id,
            payload: encode(&result),
        }))
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn vote(
        &self,
        request: Request<v1::RaftMessage>,
    ) -> Result<Response<v1::RaftMessage>, Status> {
        let shard = request.get_ref().shard_id;
        let refuse = self.shards.refuses_vote(shard);
        let check = |_, vote: &VoteRequest<NodeId>| raft_inputs::check_vote_request(vote);
        let shards = &self.shards;
        self.relay(
            request,
            |vote: &VoteRequest<NodeId>| vote.vote.leader_id.node_id,
            check,
            |raft, vote: VoteRequest<NodeId>| async move {
                let result: Result<_, RaftError<NodeId>> = if refuse {
                    Ok(VoteResponse {
                        vote: raft.metrics().borrow().vote,
                        vote_granted: false,
                        last_log_id: None,
                    })
                } else {
                    let answered = raft.vote(vote.clone()).await;
                    if let Ok(response) = &answered {
                        shards.after_vote(shard, &vote, response);
                    }
                    answered
                };
                result
            },
        )
        .await
    }

    type AppendEntriesStreamStream =
        Pin<Box<dyn Stream<Item = Result<v1::RaftAnswers, Status>> + Send>>;

    async fn append_entries_stream(
        &self,
        request: Request<Streaming<v1::RaftCalls>>,
    ) -> Result<Response<Self::AppendEntriesStreamStream>, Status> {
        let caller = peer_identity::caller(&request);
        let mut calls = request.into_inner();
        let (answers, ready) = mpsc::unbounded_channel();
        let shards = self.shards.clone();
        let node_stops = self.node_stops();
        tokio::spawn(async move {
            tokio::pin!(node_stops);
            loop {
                let batch = tokio::select! {
                    _ = &mut node_stops => break,
                    batch = calls.message() => match batch {
                        Ok(Some(batch)) => batch,
                        Ok(None) | Err(_) => break,
                    },
                };
                for call in batch.calls {
                    let answers = answers.clone();
                    let shards = shards.clone();
                    tokio::spawn(async move {
                        let outcome = append(&shards, caller, call.shard_id, &call.payload).await;
                        let _caller_gone = answers.send(v1::RaftAnswer {
                            call_id: call.call_id,
                            outcome: Some(outcome),
                        });
                    });
                }
            }
        });
        let answers = batched(ready, answer_bytes, |answers| {
            Ok(v1::RaftAnswers { answers })
        });
        Ok(Response::new(Box::pin(
            answers.take_until(self.node_stops()),
        )))
    }

    async fn install_snapshot(
        &self,
        request: Request<v1::RaftMessage>,
    ) -> Result<Response<v1::RaftMessage>, Status> {
        let admit = |shard, chunk: &InstallSnapshotRequest<TypeConfig>| {
            may_block(|| {
                self.snapshot_chunks
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .admit(shard, chunk, floret_store::check_image)
            })
        };
        self.relay(
            request,
            |chunk: &InstallSnapshotRequest<TypeConfig>| chunk.vote.leader_id.node_id,
            admit,
            |raft, chunk: InstallSnapshotRequest<TypeConfig>| async move {
                let result: Result<_, RaftError<NodeId, InstallSnapshotError>> =
                    raft.install_snapshot(chunk).await;
                result
            },
        )
        .await
    }

    async fn shard_states(
        &self,
        _request: Request<v1::ShardStatesRequest>,
    ) -> Result<Response<v1::ShardStatesResponse>, Status> {
        let initialized = self
            .shards
            .initialized()
            .await
            .map_err(|e| Status::from(RequestError::unavailable(e.to_string())))?;
        Ok(Response::new(v1::ShardStatesResponse {
            initialized,
            placement: self.shards.founding().description().to_owned(),
            members_changed: self.shards.members_changed(),
        }))
    }

    async fn settle(
        &self,
        request: Request<v1::PeerSettleRequest>,
    ) -> Result<Response<v1::PeerSettleResponse>, Status> {
        let request = request.into_inner();
        let kind = match (request.ack, request.dead_letter) {
            (true, _) => SettleKind::Ack,
            (false, false) => SettleKind::Nack,
            (false, true) => SettleKind::DeadLetter,
        };
        let outcomes = self
            .this_node
            .sources
            .settler
            .settle_here(
                kind,
                request.delivery_ids,
                &convert::settled_by_from_wire(request.settled_by),
            )
            .await
            .map_err(|e| Status::from(RequestError::unavailable(e.to_string())))?;
        Ok(Response::new(v1::PeerSettleResponse {
            outcomes: outcomes
                .into_iter()
                .map(|outcome| v1::PeerSettleOutcome {
                    delivery_id: outcome.delivery_id,
                    code: convert::settle_code(outcome.code) as i32,
                    message: outcome.message,
                })
                .collect(),
        }))
    }

    async fn propose(
        &self,
        request: Request<v1::RaftMessage>,
    ) -> Result<Response<v1::RaftMessage>, Status> {
        let message = request.into_inner();
        let shard = message.shard_id;
        let op: floret_store::Op = decode(&message.payload).map_err(|error| {
            Status::from(InvalidRequest::Undecodable {
                what: "operation",
                reason: error.to_string(),
            })
        })?;
        let proposer = match self.proposers.get(shard) {
            Some(proposer) if self.shards.leads(shard) => proposer,
            _ => {
                let leader = self.shards.leader_of(shard);
                return Err(RequestError::NoLeader { shard, leader }.into());
            }
        };
        let reply = proposer.propose(op).await.map_err(RequestError::from)?;
        Ok(Response::new(v1::RaftMessage {
            shard_id: shard,
            payload: encode(&reply),
        }))
    }

    async fn hand_back(
        &self,
        request: Request<v1::HandBackRequest>,
    ) -> Result<Response<v1::HandBackResponse>, Status> {
        let caller = peer_identity::caller(&request);
        let v1::HandBackRequest { shard_id, node_id } = request.into_inner();
        check_sender(caller, node_id)?;
        self.raft(shard_id)?;
        let answer = match self.hand_back.grant(shard_id, node_id).await {
            Ok(stepped_aside) => v1::HandBackResponse {
                accepted: true,
                wait_ms: stepped_aside.elect_within.as_millis() as u64,
                reason: String::new(),
                leader_last_log_index: stepped_aside.last_log_index,
            },
            Err(reason) => v1::HandBackResponse {
                accepted: false,
                reason,
                ..Default::default()
            },
        };
        Ok(Response::new(answer))
    }

    async fn take_leadership(
        &self,
        request: Request<v1::TakeLeadershipRequest>,
    ) -> Result<Response<v1::TakeLeadershipResponse>, Status> {
        let caller = peer_identity::caller(&request);
        take_over(&self.shards, caller, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn forward_produce(
        &self,
        request: Request<floret_proto::v1::ProduceRequest>,
    ) -> Result<Response<floret_proto::v1::ProduceResponse>, Status> {
        let now_ms = now_unix_ms();
        let batch = self.this_node.produce.parse(request.into_inner(), now_ms)?;
        let answer = self.this_node.produce.produce(batch, true, now_ms).await?;
        Ok(Response::new(produce_response(answer)))
    }

    type ConsumeStream = own_dispatcher::PeerConsumeStream;

    async fn consume(
        &self,
        request: Request<Streaming<floret_proto::v1::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        let stream = own_dispatcher::serve(&self.this_node.sources, request).await?;
        let ends_when_stopping: Self::ConsumeStream =
            Box::pin(stream.take_until(self.node_stops()));
        Ok(Response::new(ends_when_stopping))
    }

    async fn node_status(
        &self,
        _request: Request<v1::NodeStatusRequest>,
    ) -> Result<Response<floret_proto::v1::ClusterStatusResponse>, Status> {
        Ok(Response::new(self.this_node.admin.local_view()))
    }

    async fn node_queue_stats(
        &self,
        request: Request<floret_proto::v1::QueueStatsRequest>,
    ) -> Result<Response<floret_proto::v1::QueueStatsResponse>, Status> {
        self.this_node
            .admin
            .own_queue_stats(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn led_dead_letters(
        &self,
        request: Request<floret_proto::v1::ListDeadLettersRequest>,
    ) -> Result<Response<floret_proto::v1::ListDeadLettersResponse>, Status> {
        self.this_node
            .admin
            .own_dead_letters(request.get_ref())
            .map(Response::new)
    }

    async fn replica_policy(
        &self,
        request: Request<floret_proto::v1::GetPolicyRequest>,
    ) -> Result<Response<floret_proto::v1::GetPolicyResponse>, Status> {
        self.this_node
            .admin
            .own_replica_policy(request.get_ref())
            .map(Response::new)
    }

    async fn sink_weight(
        &self,
        request: Request<floret_proto::peer::v1::SinkWeightRequest>,
    ) -> Result<Response<floret_proto::peer::v1::SinkWeightResponse>, Status> {
        let demand = self.this_node.sink_weights.demand(&request.get_ref().queue);
        Ok(Response::new(demand.to_wire()))
    }

    async fn describe_cluster(
        &self,
        _request: Request<v1::DescribeClusterRequest>,
    ) -> Result<Response<v1::DescribeClusterResponse>, Status> {
        self.this_node
            .admin
            .cluster_description()
            .map(Response::new)
    }

    async fn change_members(
        &self,
        request: Request<v1::ChangeMembersRequest>,
    ) -> Result<Response<floret_proto::v1::MembershipChangeResponse>, Status> {
        let admin = &self.this_node.admin;
        admin
            .change_members_forwarded(request.into_inner())
            .await
            .map(Response::new)
    }
}
