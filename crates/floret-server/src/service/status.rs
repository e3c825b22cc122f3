//! How a refused or failed request becomes a gRPC status: the one place
//! where a [`RequestError`] meets `tonic::Status`, retry hint included, and
//! its twin in a `ProduceMany` answer, a `Refusal`.

use floret_proto::v1;
use tonic::{Code, Status};

use super::convert;
use crate::deliver::DispatcherStopped;
use crate::error::RequestError;
use crate::request::InvalidRequest;

/// Metadata key carrying how long a client should wait before retrying, in ms.
pub const RETRY_AFTER_MS: &str = "floret-retry-after-ms";

impl From<RequestError> for Status {
    fn from(error: RequestError) -> Self {
        let mut status = Status::new(code_of(&error), error.to_string());
        if let Some(millis) = retry_hint_ms(&error) {
            status.metadata_mut().insert(RETRY_AFTER_MS, millis.into());
        }
        status
    }
}

impl From<RequestError> for v1::Refusal {
    /// A produce of a `ProduceMany` that failed: the status a `Produce`
    /// call would have carried.
    fn from(error: RequestError) -> Self {
        Self {
            code: code_of(&error) as i32,
            retry_after_ms: retry_hint_ms(&error).unwrap_or_default(),
            message: error.to_string(),
        }
    }
}

fn code_of(error: &RequestError) -> Code {
    match error {
        RequestError::Invalid(_) => Code::InvalidArgument,
        RequestError::Stale(_) => Code::FailedPrecondition,
        RequestError::Exhausted { .. } => Code::ResourceExhausted,
        RequestError::NoLeader { .. }
        | RequestError::LeaderUnreachable { .. }
        | RequestError::Unavailable { .. } => Code::Unavailable,
        RequestError::Relayed { grpc_code, .. } => Code::from_i32(*grpc_code),
        RequestError::NotSettled { code, .. } => convert::settle_code(*code),
        RequestError::Denied(_) => Code::PermissionDenied,
        RequestError::Internal(_) => Code::Internal,
    }
}

/// The retry hint in whole milliseconds, at least 1.
fn retry_hint_ms(error: &RequestError) -> Option<u64> {
    let retry_after = error.retry_after()?;
    Some(retry_after.as_millis().clamp(1, u128::from(u32::MAX)) as u64)
}

impl From<InvalidRequest> for Status {
    fn from(invalid: InvalidRequest) -> Self {
        RequestError::from(invalid).into()
    }
}

impl From<DispatcherStopped> for Status {
    fn from(stopped: DispatcherStopped) -> Self {
        RequestError::from(stopped).into()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::error::{NO_LEADER_RETRY_AFTER, QUEUE_FULL_RETRY_AFTER};
    use crate::produce::proposer::ProposeError;

    fn retry_after_ms(status: &Status) -> Option<&str> {
        status
            .metadata()
            .get(RETRY_AFTER_MS)
            .map(|value| value.to_str().expect("ascii"))
    }

    #[test]
    fn a_bad_request_is_invalid_argument_without_a_retry_hint() {
        let status = Status::from(InvalidRequest::ZeroCredits);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "credits must be > 0");
        assert_eq!(retry_after_ms(&status), None);
    }

    #[test]
    fn refusals_that_pass_with_time_carry_their_retry_hint() {
        let full = Status::from(RequestError::Exhausted {
            message: "full".into(),
            retry_after: Duration::from_millis(250),
        });
        assert_eq!(full.code(), Code::ResourceExhausted);
        assert_eq!(retry_after_ms(&full), Some("250"));
        let no_leader = Status::from(RequestError::NoLeader {
            shard: 3,
            leader: Some(2),
        });
        assert_eq!(no_leader.code(), Code::Unavailable);
        assert!(no_leader.message().contains("node 2 may lead it"));
        let hint = NO_LEADER_RETRY_AFTER.as_millis().to_string();
        assert_eq!(retry_after_ms(&no_leader), Some(hint.as_str()));
    }

    #[test]
    fn a_producer_with_a_full_line_is_throttled_not_told_the_node_is_down() {
        let full = Status::from(RequestError::from(ProposeError::ProducerQueueFull {
            shard: 2,
            producer: "flooder".into(),
            calls: 1024,
            bytes: 131_072,
        }));
        assert_eq!(full.code(), Code::ResourceExhausted);
        assert!(
            full.message()
                .contains("\"flooder\" has 1024 produce calls")
        );
        let hint = QUEUE_FULL_RETRY_AFTER.as_millis().to_string();
        assert_eq!(retry_after_ms(&full), Some(hint.as_str()));
    }

    #[test]
    fn a_leaders_own_refusal_is_relayed_with_its_code_and_hint() {
        let relayed = Status::from(RequestError::Relayed {
            grpc_code: Code::ResourceExhausted as i32,
            message: "over rate".into(),
            retry_after: Some(Duration::from_millis(40)),
        });
        assert_eq!(relayed.code(), Code::ResourceExhausted);
        assert_eq!(relayed.message(), "over rate");
        assert_eq!(retry_after_ms(&relayed), Some("40"));
        let stale = Status::from(RequestError::Stale("old".into()));
        assert_eq!(stale.code(), Code::FailedPrecondition);
    }
}
