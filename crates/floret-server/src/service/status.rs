//! How internal failures become gRPC statuses.

use tonic::Status;

use crate::dispatcher::DispatcherStopped;
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

/// The node is stopping.
pub fn from_stopped(error: DispatcherStopped) -> Status {
    Status::unavailable(error.to_string())
}
