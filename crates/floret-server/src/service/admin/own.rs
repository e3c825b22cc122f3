//! What this node alone answers about itself, for the other nodes: the
//! peer port's `NodeQueueStats`, `LedDeadLetters` and `ReplicaPolicy`
//! (`service/peer.rs`) call these (and `NodeStatus` calls
//! [`AdminService::local_view`]); the Admin calls on the client port gather
//! them from every node.

use floret_proto::v1;
use tonic::Status;

use super::AdminService;
use super::policies::dead_letter_listing;
use crate::policy::PolicyOwner;
use crate::request;

impl AdminService {
    /// This node's own queue figures.
    pub(crate) async fn own_queue_stats(
        &self,
        request: v1::QueueStatsRequest,
    ) -> Result<v1::QueueStatsResponse, Status> {
        let wanted = (!request.queue.is_empty())
            .then(|| request::queue_name(&request.queue))
            .transpose()?;
        self.local_stats(wanted).await
    }

    /// Dead letters of the shards this node leads.
    pub(crate) fn own_dead_letters(
        &self,
        request: &v1::ListDeadLettersRequest,
    ) -> Result<v1::ListDeadLettersResponse, Status> {
        let (queue, limit) = dead_letter_listing(request)?;
        Ok(v1::ListDeadLettersResponse {
            dead_letters: self.led_dead_letters(&queue, limit)?,
        })
    }

    /// A policy as this node's replica of its shard holds it; UNAVAILABLE
    /// when this node holds no replica of that shard.
    pub(crate) fn own_replica_policy(
        &self,
        request: &v1::GetPolicyRequest,
    ) -> Result<v1::GetPolicyResponse, Status> {
        let queue = request::queue_name(&request.queue)?;
        let owner = PolicyOwner::of(&request.producer_id, &request.tenant)?;
        let shard = self.policy_shard(&queue, &owner);
        self.policy_from_own_replica(&queue, &owner, shard)
    }
}
