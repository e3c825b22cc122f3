//! How internal failures become gRPC statuses.

use tonic::Status;

use crate::deliver::DispatcherStopped;
use crate::proposer::ProposeError;

/// Metadata key carrying how long a client should wait before retrying, in ms.
pub const RETRY_AFTER_MS: &str = "floret-retry-after-ms";

/// Back-off suggested while a shard has no leader here.
const NO_LEADER_RETRY_AFTER_MS: u64 = 200;

/// A proposal that did not commit: UNAVAILABLE, with a retry hint.
pub fn from_propose(error: ProposeError) -> Status {
    let mut status = Status::unavailable(error.to_string());
    status
        .metadata_mut()
        .insert(RETRY_AFTER_MS, NO_LEADER_RETRY_AFTER_MS.into());
    status
}

/// No node is known to lead `shard` (or the one asked does not): UNAVAILABLE
/// with a retry hint, nothing was stored.
pub fn no_leader(shard: u32, leader: Option<u64>) -> Status {
    let leader = leader
        .map(|node| format!("; node {node} may lead it"))
        .unwrap_or_default();
    let mut status = Status::unavailable(format!(
        "shard {shard} has no leader reachable from here yet{leader}; nothing was stored, retry"
    ));
    status
        .metadata_mut()
        .insert(RETRY_AFTER_MS, NO_LEADER_RETRY_AFTER_MS.into());
    status
}

/// The leader a produce was forwarded to did not answer: the outcome is
/// unknown, so UNAVAILABLE with a retry hint (retries with the producer's
/// idempotency sequence are safe).
pub fn leader_unreachable(shard: u32, node: u64, error: &Status) -> Status {
    let mut status = Status::unavailable(format!(
        "node {node}, the leader of shard {shard}, did not answer ({}); the outcome is unknown, retry with the same producer_sequence",
        error.message()
    ));
    status
        .metadata_mut()
        .insert(RETRY_AFTER_MS, NO_LEADER_RETRY_AFTER_MS.into());
    status
}

/// The answer of the node a produce was forwarded to, as this node gives it
/// to the client: its own statuses pass through (with their retry hint);
/// transport failures become [`leader_unreachable`].
pub fn relayed(remote: Status, shard: u32, node: u64) -> Status {
    let hint = remote.metadata().get(RETRY_AFTER_MS).cloned();
    let transport_failure = matches!(
        remote.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded
    ) && hint.is_none();
    if transport_failure {
        return leader_unreachable(shard, node, &remote);
    }
    let mut status = Status::new(remote.code(), remote.message());
    if let Some(hint) = hint {
        status.metadata_mut().insert(RETRY_AFTER_MS, hint);
    }
    status
}

/// The node is stopping.
pub fn from_stopped(error: DispatcherStopped) -> Status {
    Status::unavailable(error.to_string())
}
