//! The node's gRPC services and the conversions at their edge.

pub mod admin;
mod connections;
pub(crate) mod convert;
mod credit_split;
pub(crate) mod fan_in;
pub mod floret;
mod own_dispatcher;
pub mod peer;
pub mod peer_identity;
pub mod request_id;
pub mod server;
pub mod status;

/// Wall-clock time in milliseconds since the Unix epoch: the commit time the
/// leader stamps on messages, and the reference for message ages.
pub(crate) fn now_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
