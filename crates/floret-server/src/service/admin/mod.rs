//! The `floret.v1.Admin` service: cluster status (`cluster_status.rs`),
//! queue statistics (`queue_stats.rs`), replica digests, policies and
//! dead letters (`policies.rs`), sinks (`sinks.rs`), and changes of
//! members (`members.rs`).
//!
//! Queue statistics combine the durable per-producer counters of every shard
//! (read from the state machines, off the async runtime) with the
//! dispatcher's in-memory delivery counters.
//!
//! Cluster status asks every peer for its own view (over the peer port,
//! `own.rs` answers there) and merges them: each shard as its leader sees it, with every replica's applied
//! index and lag, and every node's reachability and gossip verdict. Queue
//! statistics do the same: each producer as the leader of its shard reports
//! it (durable counters, deliveries and dwell times in the recent window,
//! DRR weight and deficit), and Jain's index is computed over the merged
//! producers.
//!
//! IMPLEMENTATION CAVEATS
//! - Statistics list every producer with stored state; there is no paging yet.
//! - A shard without a reachable leader is reported from the replica that
//!   applied the most acks, without delivery figures.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::Shards;
use floret_proto::peer::v1::peer_client::PeerClient;
use floret_proto::v1;
use floret_store::NodeId;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::auth::{Caller, audit_admin_action};
use crate::deliver::DispatcherHandle;
use crate::error::RequestError;
use crate::faults::NodeFault;
use crate::load_view::GossipStatus;
use crate::request;
use crate::router::ShardRouter;

mod cluster_status;
mod members;
mod own;
mod policies;
mod queue_stats;
mod sinks;

pub(crate) use cluster_status::membership;
use queue_stats::merge_queue_stats;

/// Serves inspection of one node.
pub struct AdminService {
    shards: Arc<Shards>,
    dispatcher: DispatcherHandle,
    router: ShardRouter,
    address: String,
    /// This node's gossip (none on a one-node cluster).
    gossip: Option<GossipStatus>,
    fault: NodeFault,
    /// Whether producers fall into tenants: without token keys every
    /// producer is the anonymous tenant's, and a tenant's policy would
    /// weigh nothing.
    tenants: bool,
}

impl AdminService {
    /// A service over the node's shards and dispatcher; `address` is what
    /// clients dial, `fault` why the node stopped serving, if it did;
    /// `tenants` whether producers fall into tenants (token keys are set).
    pub fn new(
        shards: Arc<Shards>,
        dispatcher: DispatcherHandle,
        router: ShardRouter,
        address: String,
        gossip: Option<GossipStatus>,
        fault: NodeFault,
        tenants: bool,
    ) -> Self {
        Self {
            shards,
            dispatcher,
            router,
            address,
            gossip,
            fault,
            tenants,
        }
    }
}

#[tonic::async_trait]
impl v1::admin_server::Admin for AdminService {
    async fn cluster_status(
        &self,
        request: Request<v1::ClusterStatusRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        admin_only(&request, "ClusterStatus")?;
        let views = self.node_views().await;
        Ok(Response::new(self.merge(views)))
    }

    async fn queue_stats(
        &self,
        request: Request<v1::QueueStatsRequest>,
    ) -> Result<Response<v1::QueueStatsResponse>, Status> {
        let caller = Caller::of(&request);
        if request.get_ref().queue.is_empty() {
            admin_only(&request, "QueueStats of every queue")?;
        }
        let request = request.into_inner();
        let wanted = (!request.queue.is_empty())
            .then(|| request::queue_name(&request.queue))
            .transpose()?;
        if let Some(queue) = &wanted {
            caller.require_any(queue).map_err(|denied| {
                denied.audit(&caller, "QueueStats");
                Status::from(denied)
            })?;
        }
        let own_only = |mut stats: v1::QueueStatsResponse| {
            if !caller.is_admin() {
                for queue in &mut stats.queues {
                    queue
                        .producers
                        .retain(|producer| caller.owns_producer(&producer.producer_id));
                }
            }
            stats
        };
        let local = self.local_stats(wanted).await?;
        if self.shards.peers().others().next().is_none() {
            return Ok(Response::new(own_only(local)));
        }
        let queue = request.queue;
        let mut answers: Vec<v1::QueueStatsResponse> = self
            .ask_peers(|mut client| {
                let queue = queue.clone();
                async move {
                    client
                        .node_queue_stats(v1::QueueStatsRequest { queue })
                        .await
                }
            })
            .await
            .into_values()
            .filter_map(Result::ok)
            .collect();
        answers.push(local);
        Ok(Response::new(own_only(merge_queue_stats(answers))))
    }

    async fn replica_digests(
        &self,
        request: Request<v1::ReplicaDigestsRequest>,
    ) -> Result<Response<v1::ReplicaDigestsResponse>, Status> {
        admin_only(&request, "ReplicaDigests")?;
        let shards = self.shards.clone();
        let replicas = tokio::task::spawn_blocking(move || replica_digests(&shards))
            .await
            .map_err(|e| {
                Status::from(RequestError::Internal(format!("digest task failed: {e}")))
            })??;
        Ok(Response::new(v1::ReplicaDigestsResponse { replicas }))
    }

    async fn set_policy(
        &self,
        request: Request<v1::SetPolicyRequest>,
    ) -> Result<Response<v1::SetPolicyResponse>, Status> {
        let caller = admin_only(&request, "SetPolicy")?;
        let request = request.into_inner();
        audit_admin_action(
            &caller,
            "SetPolicy",
            &format!(
                "queue {:?} producer {:?} tenant {:?}",
                request.queue, request.producer_id, request.tenant
            ),
        );
        self.set_policy_in_shards(request).await
    }

    async fn get_policy(
        &self,
        request: Request<v1::GetPolicyRequest>,
    ) -> Result<Response<v1::GetPolicyResponse>, Status> {
        admin_only(&request, "GetPolicy")?;
        self.get_policy_from_a_replica(request.into_inner()).await
    }

    async fn list_dead_letters(
        &self,
        request: Request<v1::ListDeadLettersRequest>,
    ) -> Result<Response<v1::ListDeadLettersResponse>, Status> {
        admin_only(&request, "ListDeadLetters")?;
        self.list_dead_letters_everywhere(request.into_inner())
            .await
    }

    async fn replay_dead_letters(
        &self,
        request: Request<v1::DeadLetterIds>,
    ) -> Result<Response<v1::DeadLettersChanged>, Status> {
        self.audited_dead_letter_change(request, true).await
    }

    async fn delete_dead_letters(
        &self,
        request: Request<v1::DeadLetterIds>,
    ) -> Result<Response<v1::DeadLettersChanged>, Status> {
        self.audited_dead_letter_change(request, false).await
    }

    async fn set_sink(
        &self,
        request: Request<v1::SetSinkRequest>,
    ) -> Result<Response<v1::SetSinkResponse>, Status> {
        let caller = admin_only(&request, "SetSink")?;
        let request = request.into_inner();
        audit_admin_action(&caller, "SetSink", &format!("queue {:?}", request.queue));
        self.set_sink_in_shards(request).await
    }

    async fn get_sink(
        &self,
        request: Request<v1::GetSinkRequest>,
    ) -> Result<Response<v1::GetSinkResponse>, Status> {
        admin_only(&request, "GetSink")?;
        self.sink_from_own_replica(request.into_inner())
    }

    async fn remove_sink(
        &self,
        request: Request<v1::RemoveSinkRequest>,
    ) -> Result<Response<v1::RemoveSinkResponse>, Status> {
        let caller = admin_only(&request, "RemoveSink")?;
        let request = request.into_inner();
        audit_admin_action(&caller, "RemoveSink", &format!("queue {:?}", request.queue));
        self.remove_sink_in_shards(request).await
    }

    async fn add_node(
        &self,
        request: Request<v1::AddNodeRequest>,
    ) -> Result<Response<v1::MembershipChangeResponse>, Status> {
        let caller = admin_only(&request, "AddNode")?;
        let request = request.into_inner();
        audit_admin_action(
            &caller,
            "AddNode",
            &format!("node {} at {:?}", request.node_id, request.peer_address),
        );
        let change = floret_proto::peer::v1::ChangeMembersRequest {
            change: Some(floret_proto::peer::v1::change_members_request::Change::Add(
                request,
            )),
        };
        self.change_members_on_leader(change)
            .await
            .map(Response::new)
    }

    async fn remove_node(
        &self,
        request: Request<v1::RemoveNodeRequest>,
    ) -> Result<Response<v1::MembershipChangeResponse>, Status> {
        let caller = admin_only(&request, "RemoveNode")?;
        let request = request.into_inner();
        audit_admin_action(&caller, "RemoveNode", &format!("node {}", request.node_id));
        let change = floret_proto::peer::v1::ChangeMembersRequest {
            change: Some(floret_proto::peer::v1::change_members_request::Change::Remove(request)),
        };
        self.change_members_on_leader(change)
            .await
            .map(Response::new)
    }

    async fn replace_node(
        &self,
        request: Request<v1::ReplaceNodeRequest>,
    ) -> Result<Response<v1::MembershipChangeResponse>, Status> {
        let caller = admin_only(&request, "ReplaceNode")?;
        let request = request.into_inner();
        audit_admin_action(
            &caller,
            "ReplaceNode",
            &format!(
                "node {} by node {} at {:?}",
                request.node_id, request.with_node_id, request.peer_address
            ),
        );
        let change = floret_proto::peer::v1::ChangeMembersRequest {
            change: Some(floret_proto::peer::v1::change_members_request::Change::Replace(request)),
        };
        self.change_members_on_leader(change)
            .await
            .map(Response::new)
    }
}

impl AdminService {
    /// Replays (`replay`) or deletes dead letters for an administrator,
    /// logging the action under `audit`.
    async fn audited_dead_letter_change(
        &self,
        request: Request<v1::DeadLetterIds>,
        replay: bool,
    ) -> Result<Response<v1::DeadLettersChanged>, Status> {
        let action = if replay {
            "ReplayDeadLetters"
        } else {
            "DeleteDeadLetters"
        };
        let caller = admin_only(&request, action)?;
        let request = request.into_inner();
        audit_admin_action(
            &caller,
            action,
            &format!("queue {:?}, {} ids", request.queue, request.ids.len()),
        );
        self.change_dead_letters(request, replay).await
    }
}

/// The caller of `request` if it is an administrator; PERMISSION_DENIED
/// (logged and counted) otherwise.
fn admin_only<T>(request: &Request<T>, method: &str) -> Result<Arc<Caller>, Status> {
    let caller = Caller::of(request);
    caller.require_admin(method).map_err(|denied| {
        denied.audit(&caller, method);
        Status::from(denied)
    })?;
    Ok(caller)
}

/// Applied index and state digest of every shard replica this node holds.
fn replica_digests(shards: &Shards) -> Result<Vec<v1::ReplicaDigest>, Status> {
    shards
        .groups_and_membership()
        .map(|group| {
            let read_error = |e: floret_store::StorageError| {
                Status::from(RequestError::Internal(format!(
                    "cannot read shard {}: {e}",
                    group.id
                )))
            };
            let applied = group.reader.applied_state().map_err(read_error)?;
            let (digest, keys) = group.reader.digest().map_err(read_error)?;
            Ok(v1::ReplicaDigest {
                shard_id: group.id,
                applied_index: applied.last_applied.map_or(0, |id| id.index),
                digest,
                keys,
            })
        })
        .collect()
}

/// How long the answering node waits for each peer's view.
const PEER_STATUS_TIMEOUT: Duration = Duration::from_secs(2);

impl AdminService {
    /// Every node's own view (this node's and what each peer answers), or
    /// why a peer gave none.
    pub(crate) async fn node_views(
        &self,
    ) -> BTreeMap<NodeId, Result<v1::ClusterStatusResponse, String>> {
        let mut views = self
            .ask_peers(|mut client| async move {
                client
                    .node_status(floret_proto::peer::v1::NodeStatusRequest {})
                    .await
            })
            .await;
        views.insert(self.shards.node_id(), Ok(self.local_view()));
        views
    }

    /// Asks every other node's peer port with `call` (their own view),
    /// each within [`PEER_STATUS_TIMEOUT`]: per node, the answer or why
    /// there is none.
    async fn ask_peers<T, F, Fut>(&self, call: F) -> BTreeMap<NodeId, Result<T, String>>
    where
        F: Fn(PeerClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        let peers = self.shards.peers();
        let asks = peers.others().map(|node| {
            let client = peers.peer_client(node);
            let call = client.map(&call);
            async move {
                let Some(call) = call else {
                    return (node, Err("not a member".to_owned()));
                };
                let answer = match tokio::time::timeout(PEER_STATUS_TIMEOUT, call).await {
                    Ok(Ok(answer)) => Ok(answer.into_inner()),
                    Ok(Err(status)) => Err(status.message().to_owned()),
                    Err(_) => Err(format!("no answer within {PEER_STATUS_TIMEOUT:?}")),
                };
                (node, answer)
            }
        });
        futures::future::join_all(asks).await.into_iter().collect()
    }
}
