//! The `floret.v1.Admin` calls of [`Client`]: cluster status, queue
//! statistics, replica digests, policies, dead letters, sinks and changes
//! of members.

use floret_proto::v1;

use crate::bearer::Transport;
use crate::{
    Client, ClientError, ClusterStatusResponse, DeadLetter, GetPolicyResponse, Policy,
    QueueStatsResponse, SinkSpec, is_retryable,
};

/// The admin service through the client's transport.
type AdminTransport = v1::admin_client::AdminClient<Transport>;

impl Client {
    /// Whether the node serves: gRPC health's answer for the whole node
    /// (SERVING once every shard it holds has a leader, NOT_SERVING while it
    /// starts or after a fatal storage fault).
    pub async fn serving(&self) -> Result<bool, ClientError> {
        let answer = self
            .health
            .clone()
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await?
            .into_inner();
        Ok(answer.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32)
    }

    /// Nodes, shards and leaders.
    pub async fn cluster_status(&self) -> Result<ClusterStatusResponse, ClientError> {
        Ok(self
            .admin
            .clone()
            .cluster_status(v1::ClusterStatusRequest {})
            .await?
            .into_inner())
    }

    /// Makes node `node_id`, dialled by the other nodes at `peer_address`, a
    /// member; answers with the members once the change is committed (the
    /// shards move to it after). Start the node with `--join`.
    pub async fn add_node(
        &self,
        node_id: u64,
        peer_address: &str,
    ) -> Result<v1::Membership, ClientError> {
        let request = v1::AddNodeRequest {
            node_id,
            peer_address: peer_address.to_owned(),
        };
        self.change_members(|mut admin| {
            let request = request.clone();
            async move { admin.add_node(request).await }
        })
        .await
    }

    /// Removes member `node_id`, alive or dead; answers with the members
    /// once the change is committed (its shards move to the others after).
    pub async fn remove_node(&self, node_id: u64) -> Result<v1::Membership, ClientError> {
        let request = v1::RemoveNodeRequest { node_id };
        self.change_members(|mut admin| async move { admin.remove_node(request).await })
            .await
    }

    /// Replaces member `node_id`, alive or dead, by node `with_node_id`
    /// (a new id), dialled at `peer_address`, in its seat: the new node
    /// takes exactly the old one's shards. Answers with the members once the
    /// change is committed. Start the new node with `--join`.
    pub async fn replace_node(
        &self,
        node_id: u64,
        with_node_id: u64,
        peer_address: &str,
    ) -> Result<v1::Membership, ClientError> {
        let request = v1::ReplaceNodeRequest {
            node_id,
            with_node_id,
            peer_address: peer_address.to_owned(),
        };
        self.change_members(|mut admin| {
            let request = request.clone();
            async move { admin.replace_node(request).await }
        })
        .await
    }

    /// Makes a change of members with `call`, again while it fails in a way
    /// [`is_retryable`] allows, within the retry policy: a change is
    /// idempotent, so one whose answer was lost may be asked again.
    async fn change_members<F, Fut>(&self, mut call: F) -> Result<v1::Membership, ClientError>
    where
        F: FnMut(AdminTransport) -> Fut,
        Fut: std::future::Future<
                Output = Result<tonic::Response<v1::MembershipChangeResponse>, tonic::Status>,
            >,
    {
        let started = std::time::Instant::now();
        let mut attempt = 0;
        loop {
            match call(self.admin.clone()).await {
                Ok(answer) => return Ok(answer.into_inner().membership.unwrap_or_default()),
                Err(status)
                    if is_retryable(&status) && started.elapsed() < self.retry.give_up_after =>
                {
                    let wait = self.retry.backoff(attempt, &status);
                    tracing::debug!(%status, ?wait, "the change of members did not answer; asking again");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(status) => return Err(status.into()),
            }
        }
    }

    /// Per-queue and per-producer statistics of the whole cluster (`queue`
    /// empty = all queues).
    pub async fn queue_stats(&self, queue: &str) -> Result<QueueStatsResponse, ClientError> {
        let request = v1::QueueStatsRequest {
            queue: queue.to_owned(),
        };
        Ok(self.admin.clone().queue_stats(request).await?.into_inner())
    }

    /// The answering node's shard replicas: applied index and state digest of each.
    pub async fn replica_digests(&self) -> Result<Vec<v1::ReplicaDigest>, ClientError> {
        Ok(self
            .admin
            .clone()
            .replica_digests(v1::ReplicaDigestsRequest {})
            .await?
            .into_inner()
            .replicas)
    }

    /// Sets `queue`'s defaults (`producer_id` empty) or one producer's
    /// override: only the fields set in `policy`, or all of them with
    /// `replace`. Returns the policy as stored.
    pub async fn set_policy(
        &self,
        queue: &str,
        producer_id: &str,
        policy: Policy,
        replace: bool,
    ) -> Result<Policy, ClientError> {
        self.set_stored_policy(v1::SetPolicyRequest {
            queue: queue.to_owned(),
            producer_id: producer_id.to_owned(),
            policy: Some(policy),
            replace,
            tenant: String::new(),
        })
        .await
    }

    /// `queue`'s defaults, a producer's override and what is in force for it.
    pub async fn get_policy(
        &self,
        queue: &str,
        producer_id: &str,
    ) -> Result<GetPolicyResponse, ClientError> {
        let request = v1::GetPolicyRequest {
            queue: queue.to_owned(),
            producer_id: producer_id.to_owned(),
            tenant: String::new(),
        };
        Ok(self.admin.clone().get_policy(request).await?.into_inner())
    }

    /// Sets `tenant`'s policy in `queue`: its weight among the queue's
    /// tenants, on every node (`policy.weight` is the only setting a
    /// tenant's policy takes). Returns the policy as stored.
    pub async fn set_tenant_policy(
        &self,
        queue: &str,
        tenant: &str,
        policy: Policy,
        replace: bool,
    ) -> Result<Policy, ClientError> {
        self.set_stored_policy(v1::SetPolicyRequest {
            queue: queue.to_owned(),
            producer_id: String::new(),
            policy: Some(policy),
            replace,
            tenant: tenant.to_owned(),
        })
        .await
    }

    /// Sends `request`; returns the policy as stored.
    async fn set_stored_policy(
        &self,
        request: v1::SetPolicyRequest,
    ) -> Result<Policy, ClientError> {
        Ok(self
            .admin
            .clone()
            .set_policy(request)
            .await?
            .into_inner()
            .stored
            .unwrap_or_default())
    }

    /// `queue`'s defaults and `tenant`'s policy in it.
    pub async fn get_tenant_policy(
        &self,
        queue: &str,
        tenant: &str,
    ) -> Result<GetPolicyResponse, ClientError> {
        let request = v1::GetPolicyRequest {
            queue: queue.to_owned(),
            producer_id: String::new(),
            tenant: tenant.to_owned(),
        };
        Ok(self.admin.clone().get_policy(request).await?.into_inner())
    }

    /// Up to `limit` of `queue`'s dead letters, oldest first.
    pub async fn dead_letters(
        &self,
        queue: &str,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, ClientError> {
        let request = v1::ListDeadLettersRequest {
            queue: queue.to_owned(),
            limit,
        };
        Ok(self
            .admin
            .clone()
            .list_dead_letters(request)
            .await?
            .into_inner()
            .dead_letters)
    }

    /// Sets where `queue`'s messages are pushed; returns the sink as stored
    /// (defaults filled in) once every shard has committed it.
    pub async fn set_sink(&self, queue: &str, sink: SinkSpec) -> Result<SinkSpec, ClientError> {
        let request = v1::SetSinkRequest {
            queue: queue.to_owned(),
            sink: Some(sink),
        };
        let stored = self.admin.clone().set_sink(request).await?.into_inner();
        Ok(stored.stored.unwrap_or_default())
    }

    /// `queue`'s sink, if it has one.
    pub async fn get_sink(&self, queue: &str) -> Result<Option<SinkSpec>, ClientError> {
        let request = v1::GetSinkRequest {
            queue: queue.to_owned(),
        };
        Ok(self
            .admin
            .clone()
            .get_sink(request)
            .await?
            .into_inner()
            .sink)
    }

    /// Stops pushing `queue`'s messages; whether it had a sink.
    pub async fn remove_sink(&self, queue: &str) -> Result<bool, ClientError> {
        let request = v1::RemoveSinkRequest {
            queue: queue.to_owned(),
        };
        Ok(self
            .admin
            .clone()
            .remove_sink(request)
            .await?
            .into_inner()
            .removed)
    }

    /// Puts dead letters back at the end of their producers' queues; returns how many.
    pub async fn replay_dead_letters(
        &self,
        queue: &str,
        ids: Vec<String>,
    ) -> Result<u64, ClientError> {
        let mut admin = self.admin.clone();
        Ok(admin
            .replay_dead_letters(dead_letter_ids(queue, ids))
            .await?
            .into_inner()
            .count)
    }

    /// Deletes dead letters; returns how many existed.
    pub async fn delete_dead_letters(
        &self,
        queue: &str,
        ids: Vec<String>,
    ) -> Result<u64, ClientError> {
        let mut admin = self.admin.clone();
        Ok(admin
            .delete_dead_letters(dead_letter_ids(queue, ids))
            .await?
            .into_inner()
            .count)
    }
}

/// Dead letters of `queue` named by their listed ids.
fn dead_letter_ids(queue: &str, ids: Vec<String>) -> v1::DeadLetterIds {
    v1::DeadLetterIds {
        queue: queue.to_owned(),
        ids,
    }
}
