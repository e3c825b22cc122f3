//! Values stored in a shard's state-machine tree, and their encoding.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::types::{DeadLetterReason, LogId, NodeId};

/// Durable counters of one producer: all the state machine keeps besides its messages.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerRecord {
    /// No stored message has a sequence below this (a lower bound: acks may leave holes above it).
    pub head: u64,
    /// Sequence the next message will get.
    pub tail: u64,
    /// Messages stored.
    pub messages: u64,
    /// Payload bytes stored.
    pub bytes: u64,
    /// Messages deleted by acks since the producer first appeared.
    pub acked: u64,
    /// Last idempotency sequence applied, with the sequences its batch got.
    pub last_batch: Option<ProducedBatch>,
}

/// The outcome of a producer's last idempotent batch, kept to answer its retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducedBatch {
    /// The producer's own sequence for that batch.
    pub producer_sequence: u64,
    /// First sequence the batch got.
    pub first_sequence: u64,
    /// Number of messages in the batch.
    pub count: u64,
}

/// One message as readers get it, and as dead letters keep it (runs keep
/// it at rest, see `resting.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMessage {
    /// Opaque bytes, as one byte string.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// String headers.
    pub headers: BTreeMap<String, String>,
    /// Commit time chosen by the leader, milliseconds since the Unix epoch.
    pub enqueued_at_ms: i64,
}

/// A message taken out of its producer's queue undelivered and kept aside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterRecord {
    /// The producer it came from.
    pub producer: String,
    /// Its sequence there.
    pub sequence: u64,
    /// Why it left.
    pub reason: DeadLetterReason,
    /// Deliveries it had (0 when it never was delivered).
    pub attempts: u32,
    /// When it left, ms since the Unix epoch.
    pub dead_lettered_at_ms: i64,
    /// The [`StoredMessage`] as it was stored, still encoded.
    #[serde(with = "serde_bytes")]
    pub message: Vec<u8>,
}

/// What the state machine has applied: stored under [`crate::keys::APPLIED`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedState {
    /// Last log id applied.
    pub last_applied: Option<LogId>,
    /// Last membership applied.
    pub membership: openraft::StoredMembership<NodeId, openraft::BasicNode>,
}

/// A value that cannot be decoded: the data dir is damaged or not floret's.
#[derive(Debug, thiserror::Error)]
#[error("corrupt {what}: {source}")]
pub struct DecodeError {
    /// Which record failed.
    pub what: &'static str,
    /// The decoder's complaint.
    #[source]
    pub source: postcard::Error,
}

/// Encodes a record (postcard: compact and deterministic).
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("in-memory postcard encoding cannot fail")
}

/// Decodes a record, naming it in the error.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, DecodeError> {
    postcard::from_bytes(bytes).map_err(|source| DecodeError { what, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_encoding_differs_from_what_older_data_dirs_hold() {
        /// How payloads were encoded before they were byte strings: a
        /// sequence of u8, which postcard writes with the same bytes.
        #[derive(Serialize)]
        struct ByteByByte {
            payload: Vec<u8>,
            headers: BTreeMap<String, String>,
            enqueued_at_ms: i64,
        }
        let payload: Vec<u8> = (0..=255).collect();
        let older = ByteByByte {
            payload: payload.clone(),
            headers: BTreeMap::new(),
            enqueued_at_ms: 7,
        };
        let stored = StoredMessage {
            payload,
            headers: BTreeMap::new(),
            enqueued_at_ms: 7,
        };
        assert_eq!(encode(&older), encode(&stored));
    }
}
