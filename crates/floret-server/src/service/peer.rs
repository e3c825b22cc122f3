//! The `floret.peer.v1.Peer` service: what the other nodes of the cluster
//! ask of this one. Raft RPCs for the shards it holds (appends of every
//! shard arrive on one stream per peer, each handled as its own task and
//! answered as soon as it is done), which shards it has
//! initialised (for bootstrap), settles of deliveries whose leases are here,
//! operations to commit in shards it leads (see [`crate::commit`]), and the hand-back of a shard's leadership to its preferred replica.
//!
//! Hand-back (openraft 0.9 has no leadership transfer): the leader checks
//! that the preferred replica is alive in the gossip view (not suspected:
//! a flapping node would take the leadership and lose it again), a voter
//! and caught up, then pauses the
//! shard's proposer, stops dispatching the shard (acks could not commit
//! while paused, so its deliveries would only come back as duplicates) and
//! turns its heartbeats off for a while; once the
//! followers' leader lease lapses the preferred replica calls an election
//! (see [`crate::rebalance`]), and wins it because its log is complete and
//! the other followers' own election timers run longer than the lease.
//!
//! IMPLEMENTATION CAVEATS
//! - Callers are trusted: no authentication between nodes yet.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::{Shards, batched, decode, encode};
use floret_proto::peer::v1::raft_answer::Outcome;
use floret_proto::peer::v1::{self, peer_server::Peer};
use floret_store::{NodeId, ShardId, TypeConfig};
use futures::{Stream, StreamExt};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest, VoteResponse};
use tokio::sync::{mpsc, watch};
use tonic::Streaming;
use tonic::{Request, Response, Status};

use super::convert;
use crate::deliver::{DispatcherHandle, SettleKind};
use crate::proposer::Proposers;
use crate::settle::Settler;

/// Entries a preferred replica may lag behind and still be handed the leadership.
const HAND_BACK_MAX_LAG: u64 = 64;

/// Serves the other nodes.
pub struct PeerService {
    shards: Arc<Shards>,
    settler: Settler,
    proposers: Proposers,
    dispatcher: DispatcherHandle,
    /// Becomes true when the node stops: open append streams end then, so
    /// the server's drain does not wait for peers to close them.
    stopping: watch::Receiver<bool>,
}

impl PeerService {
    /// The peer side of this node.
    pub fn new(
        shards: Arc<Shards>,
        settler: Settler,
        proposers: Proposers,
        dispatcher: DispatcherHandle,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        Self {
            shards,
            settler,
            proposers,
            dispatcher,
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

    fn raft(&self, shard: ShardId) -> Result<&floret_store::Raft, Status> {
        raft_of(&self.shards, shard)
    }

    /// Refuses a hand-back with a reason.
    fn refuse(reason: String) -> Response<v1::HandBackResponse> {
        Response::new(v1::HandBackResponse {
            accepted: false,
            wait_ms: 0,
            reason,
        })
    }
}

/// The raft group of `shard` on this node.
fn raft_of(shards: &Shards, shard: ShardId) -> Result<&floret_store::Raft, Status> {
    shards.group(shard).map(|group| &group.raft).ok_or_else(|| {
        Status::unavailable(format!(
            "node {} holds no replica of shard {shard}",
            shards.node_id()
        ))
    })
}

/// Hands one append-entries call to its shard's group; a call that reaches
/// no group is refused with the reason a unary call would have failed with.
async fn append(shards: &Shards, shard: ShardId, payload: &[u8]) -> Outcome {
    let handed = raft_of(shards, shard).and_then(|raft| {
        let request: AppendEntriesRequest<TypeConfig> = decode(payload).map_err(undecodable)?;
        Ok((raft.clone(), request))
    });
    match handed {
        Ok((raft, request)) => {
            let result: Result<_, RaftError<NodeId>> = raft.append_entries(request).await;
            Outcome::Payload(encode(&result))
        }
        Err(status) => Outcome::Refused(status.message().to_owned()),
    }
}

fn answer_bytes(answer: &v1::RaftAnswer) -> usize {
    match &answer.outcome {
        Some(Outcome::Payload(payload)) => payload.len(),
        Some(Outcome::Refused(why)) => why.len(),
        None => 0,
    }
}

fn undecodable(error: postcard::Error) -> Status {
    Status::invalid_argument(format!("undecodable raft message: {error}"))
}

impl PeerService {
    /// Decodes an openraft request for the message's shard, hands it to that
    /// shard's group with `call`, and encodes openraft's result.
    async fn relay<Req, Res, F, Fut>(
        &self,
        request: Request<v1::RaftMessage>,
        call: F,
    ) -> Result<Response<v1::RaftMessage>, Status>
    where
        Req: serde::de::DeserializeOwned,
        Res: serde::Serialize,
        F: FnOnce(floret_store::Raft, Req) -> Fut,
        Fut: std::future::Future<Output = Res>,
    {
        let message = request.into_inner();
        let raft = self.raft(message.shard_id)?.clone();
        let decoded: Req = decode(&message.payload).map_err(undecodable)?;
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
        let refuse = self.shards.refuses_vote(request.get_ref().shard_id);
        self.relay(request, |raft, vote: VoteRequest<NodeId>| async move {
            let result: Result<_, RaftError<NodeId>> = if refuse {
                Ok(VoteResponse {
                    vote: raft.metrics().borrow().vote,
                    vote_granted: false,
                    last_log_id: None,
                })
            } else {
                raft.vote(vote).await
            };
            result
        })
        .await
    }

    type AppendEntriesStreamStream =
        Pin<Box<dyn Stream<Item = Result<v1::RaftAnswers, Status>> + Send>>;

    async fn append_entries_stream(
        &self,
        request: Request<Streaming<v1::RaftCalls>>,
    ) -> Result<Response<Self::AppendEntriesStreamStream>, Status> {
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
                        let outcome = append(&shards, call.shard_id, &call.payload).await;
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
        self.relay(
            request,
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
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(v1::ShardStatesResponse {
            initialized,
            placement: self.shards.replicas().description().to_owned(),
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
            .settler
            .settle_here(kind, request.delivery_ids)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
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
        let op: floret_store::Op = decode(&message.payload)
            .map_err(|error| Status::invalid_argument(format!("undecodable operation: {error}")))?;
        let proposer = match self.proposers.get(shard) {
            Some(proposer) if self.shards.leads(shard) => proposer,
            _ => {
                return Err(crate::service::status::no_leader(
                    shard,
                    self.shards.leader_of(shard),
                ));
            }
        };
        let reply = proposer
            .propose(op)
            .await
            .map_err(crate::service::status::from_propose)?;
        Ok(Response::new(v1::RaftMessage {
            shard_id: shard,
            payload: encode(&reply),
        }))
    }

    async fn hand_back(
        &self,
        request: Request<v1::HandBackRequest>,
    ) -> Result<Response<v1::HandBackResponse>, Status> {
        let v1::HandBackRequest { shard_id, node_id } = request.into_inner();
        let raft = self.raft(shard_id)?;
        if self.shards.replicas().preferred_leader(shard_id) != node_id {
            return Ok(Self::refuse(format!(
                "node {node_id} is not the preferred replica of shard {shard_id}"
            )));
        }
        if let Some(liveness) = self.shards.liveness(node_id)
            && liveness != floret_cluster::Liveness::Alive
        {
            return Ok(Self::refuse(format!(
                "node {node_id} is {} in the gossip view",
                liveness.as_str()
            )));
        }
        let metrics = raft.metrics().borrow().clone();
        if metrics.current_leader != Some(self.shards.node_id()) {
            return Ok(Self::refuse(format!(
                "node {} does not lead shard {shard_id}",
                self.shards.node_id()
            )));
        }
        let last_log = metrics.last_log_index.unwrap_or(0);
        let matched = metrics
            .replication
            .as_ref()
            .and_then(|replication| replication.get(&node_id).cloned().flatten())
            .map(|log_id| log_id.index)
            .unwrap_or(0);
        if matched + HAND_BACK_MAX_LAG < last_log {
            return Ok(Self::refuse(format!(
                "node {node_id} is {} entries behind on shard {shard_id}",
                last_log - matched
            )));
        }
        let Some(proposer) = self.proposers.get(shard_id).cloned() else {
            return Ok(Self::refuse(format!(
                "shard {shard_id} has no proposer here"
            )));
        };
        let lease = self.shards.tuning().election_timeout_max;
        let step_aside = lease * 2 + Duration::from_millis(500);
        tracing::info!(
            shard = shard_id,
            to = node_id,
            "handing the shard's leadership back to its preferred replica"
        );
        proposer.pause(step_aside);
        raft.runtime_config().heartbeat(false);
        self.dispatcher.leadership(shard_id, false);
        let (raft, dispatcher, me) = (raft.clone(), self.dispatcher.clone(), self.shards.node_id());
        tokio::spawn(async move {
            tokio::time::sleep(step_aside).await;
            raft.runtime_config().heartbeat(true);
            proposer.resume();
            let still_leading = raft.metrics().borrow().current_leader == Some(me);
            if still_leading && raft.ensure_linearizable().await.is_ok() {
                tracing::info!(
                    shard = shard_id,
                    "hand-back did not happen; dispatching the shard again"
                );
                dispatcher.leadership(shard_id, true);
            }
        });
        Ok(Response::new(v1::HandBackResponse {
            accepted: true,
            wait_ms: lease.as_millis() as u64,
            reason: String::new(),
        }))
    }
}
