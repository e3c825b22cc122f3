//! The history of one chaos run: every produce attempt with its outcome,
//! every delivery and every consumer ack, each with the time it happened,
//! and the faults injected. Also the payload format that lets the checker
//! tell which attempt a delivered message came from and whether it arrived
//! intact.
//!
//! A payload is `[producer: u32 le][counter: u64 le][filler][crc32 of all
//! before: u32 le]`: the producer's index and the attempt's counter (unique
//! per producer, never reused for a retry), so a delivery names exactly one
//! attempt.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

/// One produce attempt: producer index and its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct MessageId {
    /// Index of the producer (its id is [`producer_name`]).
    pub producer: u32,
    /// The producer's counter for this attempt.
    pub counter: u64,
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", producer_name(self.producer), self.counter)
    }
}

/// The producer id floret sees for producer index `producer`.
pub fn producer_name(producer: u32) -> String {
    format!("chaos-{producer}")
}

/// What the content of a delivered payload says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Payload {
    /// Intact: the attempt it came from.
    Intact(MessageId),
    /// Not a payload the workload wrote, or damaged.
    Corrupt(String),
}

/// Bytes before the checksum that are not filler.
const PAYLOAD_HEADER: usize = 4 + 8;

/// The payload of attempt `id`, `size` bytes long (at least 16).
pub fn encode_payload(id: MessageId, size: usize) -> Vec<u8> {
    let size = size.max(PAYLOAD_HEADER + 4);
    let mut bytes = Vec::with_capacity(size);
    bytes.extend(id.producer.to_le_bytes());
    bytes.extend(id.counter.to_le_bytes());
    let filler = (id.counter as u8)
        .wrapping_mul(31)
        .wrapping_add(id.producer as u8);
    bytes.resize(size - 4, filler);
    let checksum = crc32fast::hash(&bytes);
    bytes.extend(checksum.to_le_bytes());
    bytes
}

/// Reads a payload written by [`encode_payload`].
pub fn decode_payload(bytes: &[u8]) -> Payload {
    if bytes.len() < PAYLOAD_HEADER + 4 {
        return Payload::Corrupt(format!("{} bytes is too short", bytes.len()));
    }
    let (body, checksum) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes(checksum.try_into().expect("4 bytes"));
    if crc32fast::hash(body) != stored {
        return Payload::Corrupt("checksum mismatch".into());
    }
    let producer = u32::from_le_bytes(body[..4].try_into().expect("4 bytes"));
    let counter = u64::from_le_bytes(body[4..12].try_into().expect("8 bytes"));
    Payload::Intact(MessageId { producer, counter })
}

/// How a produce attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Outcome {
    /// Acknowledged with this per-producer sequence.
    Acknowledged {
        /// Sequence floret assigned.
        sequence: u64,
    },
    /// Refused in a way that means nothing was stored (a bad request, a
    /// limit): it must never be delivered.
    Failed {
        /// The status.
        error: String,
    },
    /// Broke off or failed in a way that leaves the outcome open (UNAVAILABLE,
    /// a timeout, a dropped connection): it may or may not be delivered.
    Unknown {
        /// The status.
        error: String,
    },
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Event {
    /// A produce attempt was sent.
    Invoked(MessageId),
    /// A produce attempt ended.
    Completed {
        /// The attempt.
        id: MessageId,
        /// How.
        outcome: Outcome,
    },
    /// A consumer received a delivery.
    Delivered {
        /// Which consumer task.
        consumer: u32,
        /// Which of its consume streams (a reopened stream is a new session).
        session: u64,
        /// `producer_id` of the delivery.
        producer_id: String,
        /// Sequence of the delivery.
        sequence: u64,
        /// Attempt number floret gave it.
        attempt: u32,
        /// What the payload says.
        payload: Payload,
    },
    /// A consumer's ack of a delivery succeeded (floret removed the message).
    Settled {
        /// The attempt whose delivery was acked.
        id: MessageId,
    },
    /// A fault was injected, or a step of one.
    Fault {
        /// Schedule step, e.g. `kill leader of shard 0 (node 2)`.
        what: String,
        /// Whether this starts a leader loss (counted for unavailability).
        leader_loss: bool,
    },
    /// A killed node serves again: the shards it is the preferred replica
    /// of are handed back to it from here until [`Event::Healed`].
    Restarted {
        /// The node.
        node: u64,
    },
    /// The round's fault is healed and every shard is led by its
    /// preferred replica again.
    Healed,
}

/// An event and when it happened, in microseconds since the run began.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// Microseconds since the run began.
    pub at_us: u64,
    /// What happened.
    pub event: Event,
}

/// Collects events from every task of a run.
#[derive(Clone)]
pub struct Recorder {
    started: Instant,
    records: Arc<Mutex<Vec<Record>>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            records: Arc::default(),
        }
    }

    /// Records `event` as happening now.
    pub fn record(&self, event: Event) {
        let at_us = self.started.elapsed().as_micros() as u64;
        self.records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Record { at_us, event });
    }

    /// Runs `read` over every event so far, in the order recorded, without
    /// copying them (recording waits meanwhile).
    pub fn read<T>(&self, read: impl FnOnce(&[Record]) -> T) -> T {
        read(
            &self
                .records
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips_and_a_flipped_bit_is_caught() {
        let id = MessageId {
            producer: 7,
            counter: 123_456,
        };
        let mut bytes = encode_payload(id, 64);
        assert_eq!(bytes.len(), 64);
        assert_eq!(decode_payload(&bytes), Payload::Intact(id));
        bytes[20] ^= 0x10;
        assert!(matches!(decode_payload(&bytes), Payload::Corrupt(_)));
        assert!(matches!(decode_payload(b"short"), Payload::Corrupt(_)));
    }
}
