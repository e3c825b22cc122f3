//! A message as a run holds it at rest: its headers and commit time, and
//! its payload either inline or as a pointer into this node's raft log.
//!
//! The raft log already wrote every payload once, durably, before the
//! entry committed (see `wal/mod.rs`). When the state machine applies an
//! entry whose frame is durable in the log, it stores a [`LoggedPayload`]
//! (segment, offset, length, checksum) instead of a second copy, so sled
//! holds only small values and a payload is written once per replica. Each
//! replica applies from its own log, so each points at its own copy.
//! A payload whose entry is not (yet) durable in this node's log, a
//! replayed dead letter and anything installed from a snapshot are stored
//! inline. Both forms count the same bytes against a producer's limits
//! ([`accounted_len`]): the size of the message stored inline, so that
//! replicas stay equal whichever form each chose.
//!
//! The outside world never sees the pointer: readers get a
//! [`StoredMessage`], snapshots and dead letters carry payloads inline, and
//! replica digests hash each payload's length and checksum.
//!
//! IMPLEMENTATION CAVEATS
//! - Reading a logged payload is one `pread` of the log segment per message.

use std::collections::BTreeMap;
use std::io;

use serde::{Deserialize, Serialize};

use crate::records::{StoredMessage, encode};
use crate::runs::{self, Run, RunError};
use crate::wal::Wal;

/// Where a payload lies in this node's raft log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedPayload {
    /// The log segment.
    pub segment: u64,
    /// Its offset in the segment.
    pub offset: u64,
    /// Its length.
    pub len: u32,
    /// crc32 of the payload, checked on every read.
    pub crc: u32,
}

/// A payload at rest, borrowed when encoding or decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RestingPayload<'a> {
    /// The bytes themselves.
    Inline(#[serde(with = "serde_bytes", borrow)] &'a [u8]),
    /// A pointer into this node's raft log.
    Logged(LoggedPayload),
}

impl RestingPayload<'_> {
    fn len(&self) -> u32 {
        match self {
            Self::Inline(bytes) => bytes.len() as u32,
            Self::Logged(logged) => logged.len,
        }
    }
}

/// A message at rest, as a run stores it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RestingMessage<'a> {
    /// Its payload.
    #[serde(borrow)]
    pub payload: RestingPayload<'a>,
    /// String headers.
    pub headers: std::borrow::Cow<'a, BTreeMap<String, String>>,
    /// Commit time chosen by the leader, milliseconds since the Unix epoch.
    pub enqueued_at_ms: i64,
}

/// A stored value that is not a message at rest, or a logged payload that
/// does not read back as it was written.
#[derive(Debug, thiserror::Error)]
pub enum RestingError {
    /// The value is not a message at rest.
    #[error("corrupt stored message: {0}")]
    Corrupt(#[from] postcard::Error),
    /// A run around it is damaged.
    #[error(transparent)]
    Run(#[from] RunError),
    /// Reading the log failed, or the payload there fails its checksum.
    #[error("reading a stored payload from the raft log: {0}")]
    Log(#[from] io::Error),
}

/// The encoding of a message at rest.
pub(crate) fn encode_resting(
    payload: RestingPayload<'_>,
    headers: &BTreeMap<String, String>,
    enqueued_at_ms: i64,
) -> Vec<u8> {
    encode(&RestingMessage {
        payload,
        headers: std::borrow::Cow::Borrowed(headers),
        enqueued_at_ms,
    })
}

/// The bytes a stored message counts against its producer's limits: its
/// size stored inline, whichever form it is in.
pub(crate) fn accounted_len(value: &[u8]) -> Result<u64, RestingError> {
    let (payload, rest) = postcard::take_from_bytes::<RestingPayload<'_>>(value)?;
    Ok(counted_inline(payload.len(), rest.len()))
}

/// The size of a message stored inline: its payload's length prefix and
/// bytes, and `rest_len` bytes of headers and commit time after them.
fn counted_inline(payload_len: u32, rest_len: usize) -> u64 {
    varint_len(payload_len) + u64::from(payload_len) + rest_len as u64
}

/// [`accounted_len`] of a message with no headers, a payload of
/// `payload_len` bytes and commit time `enqueued_at_ms`, without encoding it.
pub(crate) fn accounted_len_without_headers(payload_len: u32, enqueued_at_ms: i64) -> u64 {
    let mut buffer = [0u8; 16];
    let headers_and_time = postcard::to_slice(
        &(BTreeMap::<String, String>::new(), enqueued_at_ms),
        &mut buffer,
    )
    .expect("an empty map and an i64 fit in 16 bytes");
    counted_inline(payload_len, headers_and_time.len())
}

/// Bytes of `value` as a postcard varint.
fn varint_len(value: u32) -> u64 {
    u64::from((32 - value.leading_zeros()).max(1).div_ceil(7))
}

/// The segment a stored run's payloads lie in, if they are logged (a run
/// comes from one entry, so all its messages share one form and segment).
pub(crate) fn run_segment<B: AsRef<[u8]>>(run: &Run<B>) -> Result<Option<u64>, RestingError> {
    let first = run.message_within(0)?;
    let (payload, _) = postcard::take_from_bytes::<RestingPayload<'_>>(&first)?;
    Ok(match payload {
        RestingPayload::Logged(logged) => Some(logged.segment),
        RestingPayload::Inline(_) => None,
    })
}

/// Whether `value` is a message at rest with its payload inline, as a
/// snapshot image must hold it.
pub(crate) fn check_inline(value: &[u8]) -> Result<(), RestingError> {
    let message: RestingMessage<'_> = postcard::from_bytes(value)?;
    match message.payload {
        RestingPayload::Inline(_) => Ok(()),
        RestingPayload::Logged(_) => Err(RestingError::Run(RunError(
            "a payload that points into the sender's raft log",
        ))),
    }
}

/// The message at rest in `value`, payload read from `log` if logged.
pub(crate) fn resolve(value: &[u8], log: &Wal) -> Result<StoredMessage, RestingError> {
    let message: RestingMessage<'_> = postcard::from_bytes(value)?;
    Ok(StoredMessage {
        payload: payload_bytes(message.payload, log)?,
        headers: message.headers.into_owned(),
        enqueued_at_ms: message.enqueued_at_ms,
    })
}

/// `value` at rest with its payload inline.
pub(crate) fn inlined(value: &[u8], log: &Wal) -> Result<Vec<u8>, RestingError> {
    let message: RestingMessage<'_> = postcard::from_bytes(value)?;
    if let RestingPayload::Inline(_) = message.payload {
        return Ok(value.to_vec());
    }
    let payload = payload_bytes(message.payload, log)?;
    Ok(encode_resting(
        RestingPayload::Inline(&payload),
        &message.headers,
        message.enqueued_at_ms,
    ))
}

/// A stored run with every payload inline, as snapshots carry it.
pub(crate) fn inlined_run(run_bytes: &[u8], log: &Wal) -> Result<Vec<u8>, RestingError> {
    let run = Run::parse(run_bytes)?;
    let messages = (0..run.len())
        .map(|index| inlined(&run.message_within(index)?, log))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(runs::encode(&messages))
}

/// Feeds `hasher` what replicas agree on about a message at rest: its
/// payload's length and checksum, headers and commit time, not where the
/// payload lies.
pub(crate) fn hash_message(
    value: &[u8],
    hasher: &mut impl std::hash::Hasher,
) -> Result<(), RestingError> {
    let (payload, rest) = postcard::take_from_bytes::<RestingPayload<'_>>(value)?;
    let crc = match payload {
        RestingPayload::Inline(bytes) => crc32fast::hash(bytes),
        RestingPayload::Logged(logged) => logged.crc,
    };
    hasher.write_u32(payload.len());
    hasher.write_u32(crc);
    hasher.write(rest);
    Ok(())
}

/// The StoredMessage encoding of `value` (dead letters keep that form).
pub(crate) fn plain(value: &[u8], log: &Wal) -> Result<Vec<u8>, RestingError> {
    Ok(encode(&resolve(value, log)?))
}

fn payload_bytes(payload: RestingPayload<'_>, log: &Wal) -> Result<Vec<u8>, RestingError> {
    match payload {
        RestingPayload::Inline(bytes) => Ok(bytes.to_vec()),
        RestingPayload::Logged(logged) => {
            let bytes = log.read_payload(logged.segment, logged.offset, logged.len)?;
            if crc32fast::hash(&bytes) != logged.crc {
                return Err(RestingError::Log(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the payload at offset {} of raft log segment {} fails its checksum",
                        logged.offset, logged.segment
                    ),
                )));
            }
            Ok(bytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_and_inline_forms_count_the_bytes_of_the_plain_message() {
        let headers = BTreeMap::from([("k".to_owned(), "v".to_owned())]);
        for len in [0usize, 1, 127, 128, 16_383, 16_384, 70_000] {
            let payload = vec![7u8; len];
            let plain = encode(&StoredMessage {
                payload: payload.clone(),
                headers: headers.clone(),
                enqueued_at_ms: 1_700_000_000_000,
            });
            let inline = encode_resting(
                RestingPayload::Inline(&payload),
                &headers,
                1_700_000_000_000,
            );
            let logged = encode_resting(
                RestingPayload::Logged(LoggedPayload {
                    segment: 3,
                    offset: 1 << 40,
                    len: len as u32,
                    crc: crc32fast::hash(&payload),
                }),
                &headers,
                1_700_000_000_000,
            );
            assert_eq!(accounted_len(&inline).unwrap(), plain.len() as u64, "{len}");
            assert_eq!(accounted_len(&logged).unwrap(), plain.len() as u64, "{len}");
        }
    }

    #[test]
    fn replicas_storing_different_forms_hash_alike() {
        let headers = BTreeMap::new();
        let payload = b"the same message".to_vec();
        let inline = encode_resting(RestingPayload::Inline(&payload), &headers, 5);
        let logged = encode_resting(
            RestingPayload::Logged(LoggedPayload {
                segment: 9,
                offset: 4096,
                len: payload.len() as u32,
                crc: crc32fast::hash(&payload),
            }),
            &headers,
            5,
        );
        let digest = |value: &[u8]| {
            let mut hasher = std::hash::DefaultHasher::new();
            hash_message(value, &mut hasher).unwrap();
            std::hash::Hasher::finish(&hasher)
        };
        assert_eq!(digest(&inline), digest(&logged));
    }
}
