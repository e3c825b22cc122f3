//! Adding, removing and replacing members for an administrator
//! (`Admin.AddNode`, `RemoveNode`, `ReplaceNode`): the change is made on the membership group's
//! leader, this node or the one it forwards to over the peer port
//! (`Peer.ChangeMembers`), and answered with the members after it. Also
//! what a joining node is told of the cluster (`Peer.DescribeCluster`).
//!
//! IMPLEMENTATION CAVEATS
//! - A one-node cluster (started without peers) has no peer port and
//!   takes no members.

use std::time::Duration;

use floret_cluster::{MemberChange, MemberChangeError};
use floret_proto::peer::v1::change_members_request::Change;
use floret_proto::peer::v1::{ChangeMembersRequest, DescribeClusterResponse};
use floret_proto::v1;
use tonic::Status;

use super::AdminService;
use super::membership;

/// How long a change waits for the membership group to have a leader and
/// take it.
const LEADER_WAIT: Duration = Duration::from_secs(10);
/// The pause before asking the membership group again.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Reads a forwarded or local request as the change it asks for.
fn member_change(request: ChangeMembersRequest) -> Result<MemberChange, Status> {
    match request.change {
        Some(Change::Add(add)) => Ok(MemberChange::Add {
            node: add.node_id,
            peer_address: add.peer_address,
        }),
        Some(Change::Remove(remove)) => Ok(MemberChange::Remove {
            node: remove.node_id,
        }),
        Some(Change::Replace(replace)) => Ok(MemberChange::Replace {
            node: replace.node_id,
            with: replace.with_node_id,
            peer_address: replace.peer_address,
        }),
        None => Err(Status::invalid_argument("the request names no change")),
    }
}

impl AdminService {
    /// Makes `request`'s change on the membership group's leader.
    pub(super) async fn change_members_on_leader(
        &self,
        request: ChangeMembersRequest,
    ) -> Result<v1::MembershipChangeResponse, Status> {
        if self.shards.peers().others().next().is_none()
            && self.shards.founding().members().len() == 1
        {
            return Err(Status::failed_precondition(
                "a one-node cluster (started without --peers) takes no members: start a cluster with --peers to grow it",
            ));
        }
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        loop {
            let answer = self.change_members_once(request.clone(), deadline).await;
            match answer {
                Err(status)
                    if status.code() == tonic::Code::Unavailable
                        && tokio::time::Instant::now() < deadline =>
                {
                    // The group is electing (a member just came back from
                    // a pause, say): a change is idempotent, so ask again.
                    tracing::debug!(%status, "the membership group took no change yet; asking again");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                answer => return answer,
            }
        }
    }

    /// Makes `request`'s change here if this node leads the membership
    /// group, or forwards it to the leader this node knows.
    async fn change_members_once(
        &self,
        request: ChangeMembersRequest,
        deadline: tokio::time::Instant,
    ) -> Result<v1::MembershipChangeResponse, Status> {
        let change = member_change(request.clone())?;
        self.wait_for_membership_leader(deadline).await;
        match self.change_members_here(change).await {
            Err(MemberChangeError::NotLeader {
                leader: Some(leader),
                ..
            }) => {
                let Some(mut client) = self.shards.peers().peer_client(leader) else {
                    return Err(Status::unavailable(format!(
                        "the membership group's leader, node {leader}, is not a peer of this node"
                    )));
                };
                client
                    .change_members(request)
                    .await
                    .map(tonic::Response::into_inner)
            }
            answer => answer.map_err(change_status),
        }
    }

    /// What a joining node needs (`Peer.DescribeCluster`): the shard count,
    /// the replication factor, the founding and the current members.
    pub(crate) fn cluster_description(&self) -> Result<DescribeClusterResponse, Status> {
        let view = self.shards.members_view();
        if view.epoch.is_none() {
            return Err(Status::unavailable(
                "this node's cluster is not founded yet: join once its members have started",
            ));
        }
        Ok(DescribeClusterResponse {
            shard_count: self.shards.placement().shard_count(),
            replication_factor: self.shards.replication_factor() as u32,
            founding_members: self.shards.founding().members().to_vec(),
            membership: Some(membership(view)),
        })
    }

    /// A change another node forwarded here (`Peer.ChangeMembers`), made if
    /// this node leads the membership group; never forwarded again.
    pub(crate) async fn change_members_forwarded(
        &self,
        request: ChangeMembersRequest,
    ) -> Result<v1::MembershipChangeResponse, Status> {
        let change = member_change(request)?;
        self.change_members_here(change)
            .await
            .map_err(change_status)
    }

    /// Waits, until `deadline` at most, until this node knows the
    /// membership group's leader (just after a start or a failover it may
    /// not yet).
    async fn wait_for_membership_leader(&self, deadline: tokio::time::Instant) {
        while self.shards.members_view().leader.is_none() && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Makes `change` if this node leads the membership group.
    async fn change_members_here(
        &self,
        change: MemberChange,
    ) -> Result<v1::MembershipChangeResponse, MemberChangeError> {
        let members = self.shards.change_members(change).await?;
        Ok(v1::MembershipChangeResponse {
            membership: Some(membership(members)),
        })
    }
}

/// The status a failed change of members is answered with.
fn change_status(error: MemberChangeError) -> Status {
    let message = error.to_string();
    match error {
        MemberChangeError::NotLeader { .. } | MemberChangeError::Raft(_) => {
            Status::unavailable(message)
        }
        MemberChangeError::Refused(_) => Status::failed_precondition(message),
        MemberChangeError::Invalid(_) => Status::invalid_argument(message),
    }
}
