//! Joining a running cluster: a node started with `join` asks those members
//! (over their peer ports, with its member certificate under TLS) what its
//! data dir needs: the shard count, the replication factor, the founding
//! members, and the members now with their peer addresses. The node must
//! already be one of them (`floret cluster add-node`); it then starts like
//! any member whose data dir was wiped, and the shards' leaders move
//! replicas to it.
//!
//! IMPLEMENTATION CAVEATS
//! - The members are asked at every start of a node given `join`, so at
//!   least one of them must answer for it to start.

use std::collections::BTreeMap;
use std::time::Duration;

use floret_cluster::{MemberTls, Peers};
use floret_proto::peer::v1::{DescribeClusterRequest, DescribeClusterResponse};
use floret_store::NodeId;
use tokio::time::Instant;

use super::NodeError;
use crate::config::PeerConfig;

/// How long a joining node keeps asking before it gives up.
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one member may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between two rounds of asking.
const ASK_INTERVAL: Duration = Duration::from_millis(500);

/// What a joining node learns of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    /// The cluster's shard count.
    pub shard_count: u32,
    /// Its replication factor.
    pub replication_factor: usize,
    /// The members of its first start.
    pub founding_members: Vec<NodeId>,
    /// The members now, this node included, with their peer addresses.
    pub members: BTreeMap<NodeId, String>,
}

/// Asks `ask` (members to ask, id and peer address) until one describes the
/// cluster, and checks that it names `node_id` as a member.
pub async fn ask_to_join(
    node_id: NodeId,
    ask: &[PeerConfig],
    tls: Option<&MemberTls>,
) -> Result<Joined, NodeError> {
    // The members to ask as peers, for their channels (under TLS expecting
    // each one's member name); this node's own entry is never dialled.
    let members: BTreeMap<NodeId, String> = ask
        .iter()
        .map(|member| (member.id, member.address.clone()))
        .chain([(node_id, String::from("127.0.0.1:1"))])
        .collect();
    let dialler = Peers::new(node_id, members, tls)?;
    let deadline = Instant::now() + JOIN_TIMEOUT;
    let mut why = String::from("no member answered");
    loop {
        for member in dialler.others() {
            let Some(mut client) = dialler.peer_client(member) else {
                continue;
            };
            let answer = tokio::time::timeout(
                ASK_TIMEOUT,
                client.describe_cluster(DescribeClusterRequest {}),
            )
            .await;
            match answer {
                Ok(Ok(described)) => return joined(node_id, described.into_inner()),
                Ok(Err(status)) => why = format!("node {member}: {}", status.message()),
                Err(_) => why = format!("node {member}: no answer within {ASK_TIMEOUT:?}"),
            }
        }
        if Instant::now() >= deadline {
            return Err(NodeError::Join(format!(
                "no member described the cluster within {JOIN_TIMEOUT:?} (last: {why})"
            )));
        }
        tracing::info!(%why, "asking the members to join again");
        tokio::time::sleep(ASK_INTERVAL).await;
    }
}

/// Reads a member's description, refusing one that does not name `node_id`.
fn joined(node_id: NodeId, described: DescribeClusterResponse) -> Result<Joined, NodeError> {
    let membership = described.membership.unwrap_or_default();
    let members: BTreeMap<NodeId, String> = membership
        .members
        .into_iter()
        .map(|member| (member.node_id, member.peer_address))
        .collect();
    if !members.contains_key(&node_id) {
        return Err(NodeError::Join(format!(
            "node {node_id} is not a member of the cluster (members: {:?}): run `floret cluster add-node --id {node_id} --peer-addr HOST:PORT` first",
            members.keys().collect::<Vec<_>>()
        )));
    }
    if described.shard_count == 0 || described.founding_members.is_empty() {
        return Err(NodeError::Join(
            "the member's description names no shards or no founding members".into(),
        ));
    }
    Ok(Joined {
        shard_count: described.shard_count,
        replication_factor: described.replication_factor as usize,
        founding_members: described.founding_members,
        members,
    })
}
