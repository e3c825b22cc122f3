//! The raft side of the peer service, below its handlers: which raft
//! group a call is for, one append of an append stream handed to its
//! group (checked against the stream's caller), taking a shard over from
//! its leader, and the small helpers the raft handlers share. The
//! handlers themselves are `peer.rs`'s.

use floret_cluster::{Shards, decode, encode};
use floret_proto::peer::v1::{self, raft_answer::Outcome};
use floret_store::{NodeId, ShardId, TypeConfig};
use openraft::error::RaftError;
use openraft::raft::AppendEntriesRequest;
use tonic::Status;

use super::peer_identity::check_sender;
use crate::error::RequestError;
use crate::raft_inputs;
use crate::request::InvalidRequest;

/// The longest a node waits to catch up before it calls the election a
/// stopping leader handed it.
const MAX_TAKE_OVER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The raft group of `shard` (or the membership group) on this node.
pub(super) fn raft_of(shards: &Shards, shard: ShardId) -> Result<floret_store::Raft, Status> {
    shards.raft(shard).ok_or_else(|| {
        Status::from(RequestError::unavailable(format!(
            "node {} holds no replica of shard {shard}",
            shards.node_id()
        )))
    })
}

/// Hands one append-entries call to its shard's group; a call that reaches
/// no group is refused with the reason a unary call would have failed with.
/// `caller` is the member the stream's certificate names, if identified.
pub(super) async fn append(
    shards: &Shards,
    caller: Option<NodeId>,
    shard: ShardId,
    payload: &[u8],
) -> Outcome {
    let handed = raft_of(shards, shard).and_then(|raft| {
        let request: AppendEntriesRequest<TypeConfig> = decode(payload).map_err(undecodable)?;
        check_sender(caller, request.vote.leader_id.node_id)?;
        raft_inputs::check_append(&request).map_err(InvalidRequest::from)?;
        Ok((raft.clone(), request))
    });
    match handed {
        Ok((raft, request)) => {
            shards.heard_from_leader(shard);
            let result: Result<_, RaftError<NodeId>> = raft.append_entries(request).await;
            Outcome::Payload(encode(&result))
        }
        Err(status) => Outcome::Refused(status.message().to_owned()),
    }
}

pub(super) fn answer_bytes(answer: &v1::RaftAnswer) -> usize {
    match &answer.outcome {
        Some(Outcome::Payload(payload)) => payload.len(),
        Some(Outcome::Refused(why)) => why.len(),
        None => 0,
    }
}

pub(super) fn undecodable(error: postcard::Error) -> Status {
    Status::from(InvalidRequest::Undecodable {
        what: "raft message",
        reason: error.to_string(),
    })
}

/// Takes `request`'s shard over from its leader, the node `caller` (the
/// member the call's certificate names, if identified) must be: elects
/// this replica once its log holds the leader's last entry, within the
/// wait asked for (at most [`MAX_TAKE_OVER_WAIT`]). Answers the leader
/// the shard settled on (0: none in time).
pub(super) async fn take_over(
    shards: &Shards,
    caller: Option<NodeId>,
    request: v1::TakeLeadershipRequest,
) -> Result<v1::TakeLeadershipResponse, Status> {
    let v1::TakeLeadershipRequest {
        shard_id,
        node_id,
        leader_last_log_index,
        wait_ms,
    } = request;
    check_sender(caller, node_id)?;
    let leader = raft_of(shards, shard_id)?.metrics().borrow().current_leader;
    if leader != Some(node_id) {
        return Err(Status::failed_precondition(format!(
            "node {node_id} does not lead shard {shard_id} as far as node {} knows (leader: {leader:?})",
            shards.node_id()
        )));
    }
    let elect_within = std::time::Duration::from_millis(wait_ms).min(MAX_TAKE_OVER_WAIT);
    let leader = crate::leadership::rebalance::elect_once_caught_up(
        shards,
        shard_id,
        leader_last_log_index,
        elect_within,
    )
    .await;
    Ok(v1::TakeLeadershipResponse {
        leader_id: leader.unwrap_or(0),
    })
}
