//! Why a client's call was refused or failed: one enum for every request
//! path below the gRPC services (produce, commit, settle routing, policy and
//! request checks). `service/status.rs` turns it into a gRPC status in one
//! place, with the retry hint [`RequestError::retry_after`] gives.
//!
//! Each variant says who can fix it: the caller (a bad argument), time
//! (a full node, a rate, a leader being elected), or nobody (internal).

use std::time::Duration;

use floret_store::ShardId;

use crate::deliver::{DispatcherStopped, SettleCode};
use crate::produce::proposer::ProposeError;
use crate::request::InvalidRequest;

/// Back-off suggested while a shard has no leader here.
pub const NO_LEADER_RETRY_AFTER: Duration = Duration::from_millis(200);

/// Wait suggested to a producer refused for being at its limits: about the
/// time consumers take to make room.
pub const OVER_LIMIT_RETRY_AFTER: Duration = Duration::from_millis(500);

/// Wait suggested to a producer whose line of waiting produce calls is full:
/// about the time a few entries take to commit.
pub const QUEUE_FULL_RETRY_AFTER: Duration = Duration::from_millis(50);

/// A refused or failed request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The request itself is wrong; retrying it unchanged fails again.
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
    /// The request names a state that no longer holds.
    #[error("{0}")]
    Stale(String),
    /// The producer or node is over a limit for now.
    #[error("{message}")]
    Exhausted {
        /// What limit, and what to do.
        message: String,
        /// When a retry may pass.
        retry_after: Duration,
    },
    /// No node is known to lead `shard` (or the one asked does not); nothing was stored.
    #[error(
        "shard {shard} has no leader reachable from here yet{}; nothing was stored, retry",
        leader.map(|node| format!("; node {node} may lead it")).unwrap_or_default()
    )]
    NoLeader {
        /// The shard.
        shard: ShardId,
        /// A node that may lead it.
        leader: Option<u64>,
    },
    /// The leader a call was sent to did not answer: the outcome is unknown.
    #[error(
        "node {node}, the leader of shard {shard}, did not answer ({why}); the outcome is unknown, retry with the same producer_sequence"
    )]
    LeaderUnreachable {
        /// The shard.
        shard: ShardId,
        /// The leader called.
        node: u64,
        /// What the call failed with.
        why: String,
    },
    /// The leader answered with a refusal of its own, passed on as it was.
    #[error("{message}")]
    Relayed {
        /// Its gRPC status code, as a number.
        grpc_code: i32,
        /// Its message.
        message: String,
        /// Its retry hint.
        retry_after: Option<Duration>,
    },
    /// The node cannot serve it now (stopping, a proposal not committed, a
    /// shard that cannot be read); a retry may succeed.
    #[error("{message}")]
    Unavailable {
        /// Why.
        message: String,
        /// When to retry, if known.
        retry_after: Option<Duration>,
    },
    /// Some deliveries of an ack were not settled: the first one's code and why.
    #[error("{message}")]
    NotSettled {
        /// How the first unsettled delivery ended.
        code: SettleCode,
        /// Which deliveries, and why.
        message: String,
    },
    /// The caller's tenant may not do this (PERMISSION_DENIED).
    #[error("{0}")]
    Denied(String),
    /// A bug: an answer that cannot happen.
    #[error("{0}")]
    Internal(String),
}

impl RequestError {
    /// How long the client should wait before retrying, if it should.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Exhausted { retry_after, .. } => Some(*retry_after),
            Self::NoLeader { .. } | Self::LeaderUnreachable { .. } => Some(NO_LEADER_RETRY_AFTER),
            Self::Relayed { retry_after, .. } | Self::Unavailable { retry_after, .. } => {
                *retry_after
            }
            Self::Invalid(_)
            | Self::Stale(_)
            | Self::NotSettled { .. }
            | Self::Denied(_)
            | Self::Internal(_) => None,
        }
    }

    /// UNAVAILABLE with no retry hint.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::Unavailable {
            message: message.into(),
            retry_after: None,
        }
    }
}

impl From<ProposeError> for RequestError {
    /// A proposal that did not commit: try again (the client's idempotency
    /// sequence makes a retry safe). A producer whose line was full waits
    /// for it to drain.
    fn from(error: ProposeError) -> Self {
        match error {
            ProposeError::ProducerQueueFull { .. } | ProposeError::ShardQueueFull { .. } => {
                Self::Exhausted {
                    message: error.to_string(),
                    retry_after: QUEUE_FULL_RETRY_AFTER,
                }
            }
            ProposeError::NotLeader { .. }
            | ProposeError::HandingOver { .. }
            | ProposeError::Unavailable { .. } => Self::Unavailable {
                message: error.to_string(),
                retry_after: Some(NO_LEADER_RETRY_AFTER),
            },
        }
    }
}

impl From<DispatcherStopped> for RequestError {
    fn from(error: DispatcherStopped) -> Self {
        Self::unavailable(error.to_string())
    }
}
