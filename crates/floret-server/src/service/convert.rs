//! Conversions between the dispatcher's domain values and `floret.v1` and
//! `floret.peer.v1` messages.

use floret_proto::peer::v1::{PeerConsumeResponse, QueueBacklog, peer_consume_response};
use floret_proto::v1;
use tonic::Code;

use crate::deliver::{ConsumerEvent, Delivered, SettleCode, SettleOutcome};

/// A delivery as the consumer receives it.
pub fn delivery(delivered: Delivered) -> v1::Delivery {
    let Delivered { id, message } = delivered;
    v1::Delivery {
        delivery_id: id.to_string(),
        queue: id.queue,
        producer_id: id.producer,
        sequence: id.sequence,
        payload: message.payload,
        headers: message.headers.into_iter().collect(),
        attempt: id.attempt,
        enqueued_at_unix_ms: message.enqueued_at_ms,
    }
}

/// One settle outcome on the wire.
pub fn settle_outcome(outcome: SettleOutcome) -> v1::SettleOutcome {
    v1::SettleOutcome {
        delivery_id: outcome.delivery_id,
        code: settle_code(outcome.code) as i32,
        message: outcome.message,
    }
}

/// What a peer's consume stream of this node's dispatcher sends for one
/// dispatcher event.
pub fn peer_consume_response(event: ConsumerEvent) -> PeerConsumeResponse {
    let response = match event {
        ConsumerEvent::Delivery(delivered) => {
            peer_consume_response::Response::Delivery(delivery(*delivered))
        }
        ConsumerEvent::Settled(outcomes) => {
            peer_consume_response::Response::Settled(v1::SettleResult {
                outcomes: outcomes.into_iter().map(settle_outcome).collect(),
            })
        }
        ConsumerEvent::Backlog(backlogged_weight) => {
            peer_consume_response::Response::Backlog(QueueBacklog { backlogged_weight })
        }
    };
    PeerConsumeResponse {
        response: Some(response),
    }
}

/// The gRPC status code of a settle outcome.
pub fn settle_code(code: SettleCode) -> Code {
    match code {
        SettleCode::Ok => Code::Ok,
        SettleCode::InvalidArgument => Code::InvalidArgument,
        SettleCode::NotFound => Code::NotFound,
        SettleCode::FailedPrecondition => Code::FailedPrecondition,
        SettleCode::Unavailable => Code::Unavailable,
    }
}

/// A settle outcome's code as a peer sent it; a code no node sends is
/// taken as UNAVAILABLE (the message is delivered again if not settled).
pub fn settle_code_from_wire(code: i32) -> SettleCode {
    match Code::from_i32(code) {
        Code::Ok => SettleCode::Ok,
        Code::InvalidArgument => SettleCode::InvalidArgument,
        Code::NotFound => SettleCode::NotFound,
        Code::FailedPrecondition => SettleCode::FailedPrecondition,
        _ => SettleCode::Unavailable,
    }
}
