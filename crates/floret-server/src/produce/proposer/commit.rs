//! One entry's way through raft: propose it within the commit timeout,
//! then answer each of its operations, handing each folded caller its own
//! messages' sequences, or fail them all with why.

use std::time::Duration;

use floret_store::{Command, NodeId, OpReply, Raft, ShardId};
use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::OwnedSemaphorePermit;

use super::{Proposal, ProposeError, Reply};

/// Hands `result` to the callers of one operation: each folded caller
/// gets its own messages' sequences.
fn answer(mut callers: Vec<(Reply, u64)>, result: OpReply) {
    if callers.len() == 1 {
        let (reply, _) = callers.remove(0);
        let _caller_gone = reply.send(Ok(result));
        return;
    }
    let OpReply::Enqueued {
        first_sequence,
        duplicate,
        ..
    } = result
    else {
        for (reply, _) in callers {
            let _caller_gone = reply.send(Ok(result.clone()));
        }
        return;
    };
    let mut next_sequence = first_sequence;
    for (reply, count) in callers {
        let own = OpReply::Enqueued {
            first_sequence: next_sequence,
            count,
            duplicate,
        };
        next_sequence += count;
        let _caller_gone = reply.send(Ok(own));
    }
}

/// Proposes one entry and answers each of its operations.
pub(super) async fn commit(
    shard: ShardId,
    raft: Raft,
    entry: Vec<Proposal>,
    commit_timeout: Duration,
    slot: OwnedSemaphorePermit,
) {
    let (ops, callers): (Vec<_>, Vec<_>) = entry.into_iter().map(|p| (p.op, p.callers)).unzip();
    let fail_all = |callers: Vec<Vec<(Reply, u64)>>, error: ProposeError| {
        for (reply, _) in callers.into_iter().flatten() {
            let _caller_gone = reply.send(Err(error.clone()));
        }
    };
    let outcome = tokio::time::timeout(commit_timeout, raft.client_write(Command { ops })).await;
    drop(slot);
    match outcome {
        Err(_) => fail_all(callers, not_committed(shard, commit_timeout)),
        Ok(Ok(response)) => {
            floret_store::failpoints::crash_if_fires("proposer-before-reply");
            for (callers, result) in callers.into_iter().zip(response.data.replies) {
                answer(callers, result);
            }
        }
        Ok(Err(error)) => fail_all(callers, propose_error(shard, error)),
    }
}

pub(super) fn not_committed(shard: ShardId, commit_timeout: Duration) -> ProposeError {
    ProposeError::Unavailable {
        shard,
        reason: format!(
            "not committed within {commit_timeout:?} (is a majority of its replicas reachable?); the outcome is unknown"
        ),
    }
}

fn propose_error(
    shard: ShardId,
    error: RaftError<NodeId, ClientWriteError<NodeId, openraft::BasicNode>>,
) -> ProposeError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
            ProposeError::NotLeader {
                shard,
                leader: forward.leader_id,
            }
        }
        other => ProposeError::Unavailable {
            shard,
            reason: other.to_string(),
        },
    }
}
