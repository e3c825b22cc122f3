//! Conversions between the dispatcher's domain values and `floret.v1` and
//! `floret.peer.v1` messages.

use floret_proto::peer::v1::{PeerConsumeResponse, QueueBacklog, peer_consume_response};
use floret_proto::v1;
use tonic::Code;

use crate::deliver::{
    BacklogReport, ConsumerEvent, Delivered, SettleCode, SettleOutcome, SettledBy, StreamKey,
    StreamOwner, TenantBacklog, TenantShare,
};

/// A delivery as the consumer receives it.
pub fn delivery(delivered: Delivered) -> v1::Delivery {
    let Delivered { ticket, message } = delivered;
    let delivery_id = ticket.to_string();
    let id = ticket.id;
    v1::Delivery {
        delivery_id,
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
        ConsumerEvent::Backlog(report) => {
            peer_consume_response::Response::Backlog(backlog_to_wire(report))
        }
    };
    PeerConsumeResponse {
        response: Some(response),
    }
}

/// A backlog report on the wire.
pub fn backlog_to_wire(report: BacklogReport) -> QueueBacklog {
    QueueBacklog {
        backlogged_weight: report.weight,
        tenants: report
            .tenants
            .into_iter()
            .map(|tenant| floret_proto::peer::v1::TenantBacklog {
                tenant: tenant.tenant,
                producer_weight: tenant.producer_weight,
                weight: tenant.weight,
            })
            .collect(),
    }
}

/// A backlog report as a peer sent it.
pub fn backlog_from_wire(backlog: QueueBacklog) -> BacklogReport {
    BacklogReport {
        weight: backlog.backlogged_weight,
        tenants: backlog
            .tenants
            .into_iter()
            .map(|tenant| TenantBacklog {
                tenant: tenant.tenant,
                producer_weight: tenant.producer_weight,
                weight: tenant.weight,
            })
            .collect(),
    }
}

/// Tenant shares on the wire, for a peer's stream.
pub fn tenant_shares_to_wire(shares: &[TenantShare]) -> v1::ConsumeRequest {
    v1::ConsumeRequest {
        request: Some(v1::consume_request::Request::TenantShares(
            v1::TenantShares {
                shares: shares
                    .iter()
                    .map(|share| v1::TenantShare {
                        tenant: share.tenant.clone(),
                        parts_per_million: share.share,
                    })
                    .collect(),
            },
        )),
    }
}

/// Tenant shares as a merging node sent them.
pub fn tenant_shares_from_wire(shares: v1::TenantShares) -> Vec<TenantShare> {
    shares
        .shares
        .into_iter()
        .map(|share| TenantShare {
            tenant: share.tenant,
            share: share.parts_per_million,
        })
        .collect()
}

/// The gRPC status code of a settle outcome.
pub fn settle_code(code: SettleCode) -> Code {
    match code {
        SettleCode::Ok => Code::Ok,
        SettleCode::InvalidArgument => Code::InvalidArgument,
        SettleCode::NotFound => Code::NotFound,
        SettleCode::PermissionDenied => Code::PermissionDenied,
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
        Code::PermissionDenied => SettleCode::PermissionDenied,
        Code::FailedPrecondition => SettleCode::FailedPrecondition,
        _ => SettleCode::Unavailable,
    }
}

/// Who settles, for a peer's `Settle`.
pub fn settled_by_to_wire(by: &SettledBy) -> floret_proto::peer::v1::SettledBy {
    match by {
        SettledBy::Stream(owner) => floret_proto::peer::v1::SettledBy {
            tenant: owner.tenant.to_string(),
            stream: owner.stream.to_bytes().to_vec(),
        },
        SettledBy::Tenant(tenant) => floret_proto::peer::v1::SettledBy {
            tenant: tenant.to_string(),
            stream: Vec::new(),
        },
    }
}

/// Who settles, as a peer sent it: a stream when it names one, else a
/// tenant. (A node of an older version sends neither: a tenant named "",
/// which holds nothing, so its settles are refused and the messages come
/// back when their leases lapse.)
pub fn settled_by_from_wire(by: Option<floret_proto::peer::v1::SettledBy>) -> SettledBy {
    let by = by.unwrap_or_default();
    let tenant: std::sync::Arc<str> = by.tenant.into();
    match StreamKey::from_bytes(&by.stream) {
        Some(stream) => SettledBy::Stream(StreamOwner { tenant, stream }),
        None => SettledBy::Tenant(tenant),
    }
}

/// The metadata of a peer's `Consume` call that names the consumer's stream
/// and tenant: `{stream key, 32 hex digits}/{tenant}`.
pub const STREAM_OWNER_METADATA: &str = "floret-stream-owner";

/// `owner` as the value of [`STREAM_OWNER_METADATA`].
pub fn stream_owner_metadata(
    owner: &StreamOwner,
) -> tonic::metadata::MetadataValue<tonic::metadata::Ascii> {
    format!("{}/{}", owner.stream, owner.tenant)
        .parse()
        .expect("a stream key and a tenant name are ASCII")
}

/// The consumer's stream and tenant a peer named in [`STREAM_OWNER_METADATA`].
pub fn stream_owner_from_metadata(
    metadata: &tonic::metadata::MetadataMap,
) -> Result<StreamOwner, tonic::Status> {
    let missing = || {
        tonic::Status::invalid_argument(format!(
            "a peer's consume stream needs `{STREAM_OWNER_METADATA}: {{stream key}}/{{tenant}}` metadata"
        ))
    };
    let value = metadata
        .get(STREAM_OWNER_METADATA)
        .and_then(|value| value.to_str().ok())
        .ok_or_else(missing)?;
    let (stream, tenant) = value.split_once('/').ok_or_else(missing)?;
    let stream = stream.parse().map_err(|_| missing())?;
    Ok(StreamOwner {
        tenant: tenant.into(),
        stream,
    })
}
