//! A shard's snapshot on disk: the whole state-machine tree at one log id,
//! written to `snapshots/shard-N.snap` (temp file, fsync, rename) so the
//! current snapshot survives restarts and can be sent to a lagging replica.
//!
//! An image's bytes carry a crc32 of the encoded tree ([`TreeImage::to_bytes`]),
//! so a snapshot damaged on disk or in transit is refused; and an image is
//! checked pair by pair ([`TreeImage::validate`]: known key shapes, values
//! that decode, payloads inline) before it replaces a live tree.
//!
//! IMPLEMENTATION CAVEATS
//! - Images written before the checksum existed (no magic prefix) are
//!   still read, unchecked.
//! - The snapshot is in memory while it is captured, sent or installed: a
//!   backlog of hundreds of MiB costs that much memory for a moment (about
//!   twice that on the receiving side), and a shard builds one every
//!   `snapshot_every_entries` entries whatever its size. A snapshot
//!   streamed from a point-in-time view of the tree would not.
//! - A build that finishes after an install of a later snapshot saves its
//!   older image over the installed one.

use std::collections::BTreeMap;
use std::io;

use serde::{Deserialize, Serialize};

use crate::keys;
use crate::policy::Policy;
use crate::records::{AppliedState, DeadLetterRecord, ProducerRecord, decode, encode};
use crate::resting::{self, RestingError};
use crate::runs;
use crate::sink_spec::SinkSpec;
use crate::types::NodeId;

mod capture;
mod file;
pub(crate) use capture::{EncodedImage, capture};
pub use file::SnapshotFile;

/// What stops a tree image from being taken.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Reading the tree failed.
    #[error(transparent)]
    Sled(#[from] sled::Error),
    /// A stored message could not be read back.
    #[error(transparent)]
    Message(#[from] RestingError),
}

/// Metadata of a snapshot, as openraft names it.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;

/// Every key and value of a shard's state-machine tree.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct TreeImage {
    /// (key, value) pairs in key order.
    pub pairs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl TreeImage {
    /// Encoded form, as sent to replicas: [`IMAGE_MAGIC`], the crc32 of the
    /// encoded tree (u32 le), the encoded tree.
    pub fn to_bytes(&self) -> Vec<u8> {
        let body = encode(self);
        let mut bytes = Vec::with_capacity(IMAGE_MAGIC.len() + 4 + body.len());
        bytes.extend_from_slice(IMAGE_MAGIC);
        bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        bytes.extend_from_slice(&body);
        bytes
    }

    /// Decodes what [`TreeImage::to_bytes`] produced, refusing it if its
    /// checksum does not match.
    pub fn from_bytes(bytes: &[u8]) -> io::Result<Self> {
        let invalid = |message: String| io::Error::new(io::ErrorKind::InvalidData, message);
        let Some(checked) = bytes.strip_prefix(IMAGE_MAGIC) else {
            return decode("snapshot", bytes).map_err(io::Error::other);
        };
        let (crc, body) = checked
            .split_first_chunk::<4>()
            .ok_or_else(|| invalid("snapshot image shorter than its header".into()))?;
        let expected = u32::from_le_bytes(*crc);
        let actual = crc32fast::hash(body);
        if actual != expected {
            return Err(invalid(format!(
                "snapshot image fails its checksum (crc32 {actual:08x}, recorded {expected:08x})"
            )));
        }
        decode("snapshot", body).map_err(io::Error::other)
    }

    /// Drops the pairs that belong to the sender's copy alone, which images
    /// taken by older versions carry (a redo record installed on a replica
    /// would be replayed over newer state at its next start).
    pub fn drop_node_local_keys(&mut self) {
        self.pairs.retain(|(key, _)| !keys::is_node_local(key));
    }

    /// Checks every pair before the image replaces a live tree: keys in
    /// strictly increasing order and of a known shape, every value decoding
    /// as what its key holds, every payload inline (a replica has no copy
    /// of the sender's log), removal marks only for runs in the image.
    pub fn validate(&self) -> Result<(), InvalidImage> {
        let mut previous: Option<&[u8]> = None;
        let mut run_lengths: BTreeMap<&[u8], usize> = BTreeMap::new();
        for (key, value) in &self.pairs {
            let refuse = |why: String| InvalidImage {
                key: String::from_utf8_lossy(key).into_owned(),
                why,
            };
            if previous.is_some_and(|previous| previous >= key.as_slice()) {
                return Err(refuse("keys are not in strictly increasing order".into()));
            }
            previous = Some(key);
            let tag = key.first().copied();
            let checked = match tag {
                Some(keys::MESSAGE_TAG) => check_run(key, value).map(|count| {
                    run_lengths.insert(&key[1..], count);
                }),
                Some(keys::REMOVED_TAG) => match run_lengths.get(&key[1..]) {
                    Some(&count) => runs::Removed::stored(Some(value), count)
                        .map(drop)
                        .map_err(|e| e.to_string()),
                    None => Err("removal marks of a run the image does not hold".into()),
                },
                _ => check_other(key, value),
            };
            checked.map_err(refuse)?;
        }
        Ok(())
    }
}

/// Whether the encoded image `bytes` can be installed: its checksum, its
/// decoding and every pair (the sender's own keys aside). The receiving
/// side checks a whole snapshot with it before handing the last chunk to
/// raft, whose install of a bad image would stop the shard's replica.
pub fn check_image(bytes: &[u8]) -> Result<(), String> {
    let mut image = TreeImage::from_bytes(bytes).map_err(|error| error.to_string())?;
    image.drop_node_local_keys();
    image.validate().map_err(|error| error.to_string())
}

/// First bytes of an image that carries a checksum.
pub const IMAGE_MAGIC: &[u8] = b"floretI1";

/// Why an image cannot be installed: the first bad pair.
#[derive(Debug, thiserror::Error)]
#[error("snapshot image refused at key {key:?}: {why}")]
pub struct InvalidImage {
    key: String,
    why: String,
}

/// A message run's key and value (a run of messages with inline
/// payloads); returns how many messages it holds.
fn check_run(key: &[u8], value: &[u8]) -> Result<usize, String> {
    check_message_key(key)?;
    let run = runs::Run::parse(value).map_err(|e| e.to_string())?;
    for index in 0..run.len() {
        let message = run.message_within(index).map_err(|e| e.to_string())?;
        resting::check_inline(&message).map_err(|e| e.to_string())?;
    }
    Ok(run.len())
}

/// A message key's shape after its tag: queue, producer, sequence.
fn check_message_key(key: &[u8]) -> Result<(), String> {
    let (queue_len, rest) = key
        .get(1..)
        .and_then(<[u8]>::split_first)
        .ok_or("message key without a queue")?;
    let rest = rest
        .get(usize::from(*queue_len)..)
        .ok_or("message key shorter than its queue")?;
    let (producer_len, rest) = rest
        .split_first_chunk::<2>()
        .ok_or("message key without a producer")?;
    if rest.len() != usize::from(u16::from_be_bytes(*producer_len)) + 8 {
        return Err("message key is not queue, producer and sequence".into());
    }
    Ok(())
}

/// `value` decoded as a whole as a `T` (bytes left over mean it is not one).
fn decode_whole<T: serde::de::DeserializeOwned>(what: &str, value: &[u8]) -> Result<(), String> {
    match postcard::take_from_bytes::<T>(value) {
        Ok((_, [])) => Ok(()),
        Ok((_, rest)) => Err(format!("{} bytes after the {what}", rest.len())),
        Err(error) => Err(format!("not a {what}: {error}")),
    }
}

/// Any other pair: its key's shape and its value's type.
fn check_other(key: &[u8], value: &[u8]) -> Result<(), String> {
    let queue_and_rest = || -> Result<&[u8], String> {
        let (queue_len, rest) = key
            .get(1..)
            .and_then(<[u8]>::split_first)
            .ok_or("key without a queue")?;
        rest.get(usize::from(*queue_len)..)
            .ok_or_else(|| "key shorter than its queue".into())
    };
    match key.first().copied() {
        _ if key == keys::APPLIED => decode_whole::<AppliedState>("applied state", value),
        Some(keys::PRODUCER_TAG) => {
            keys::parse_producer(key).ok_or("producer key is not queue and producer")?;
            decode_whole::<ProducerRecord>("producer record", value)
        }
        Some(keys::QUEUE_POLICY_TAG | keys::PRODUCER_POLICY_TAG) => {
            keys::parse_policy(key).ok_or("policy key is not queue (and producer)")?;
            decode_whole::<Policy>("policy", value)
        }
        Some(keys::DEAD_LETTER_TAG) => {
            if queue_and_rest()?.len() != 8 {
                return Err("dead-letter key is not queue and id".into());
            }
            decode_whole::<DeadLetterRecord>("dead letter", value)
        }
        Some(keys::NEXT_DEAD_LETTER_TAG) => {
            if !queue_and_rest()?.is_empty() {
                return Err("next dead-letter key is not a queue".into());
            }
            decode_whole::<u64>("next dead-letter id", value)
        }
        Some(keys::SINK_TAG) => {
            keys::parse_sink(key).ok_or("sink key is not a queue")?;
            decode_whole::<SinkSpec>("sink", value)
        }
        Some(keys::DELAY_TAG) => {
            check_message_key(&keys::delayed_message(key))?;
            decode_whole::<i64>("delivery time", value)
        }
        _ => Err("not a key of a shard's state".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> TreeImage {
        TreeImage { pairs }
    }

    #[test]
    fn snapshot_damaged_in_transit_is_installed() {
        let good = image(vec![(keys::next_dead_letter("q"), encode(&7u64))]);
        good.validate().unwrap();
        let mut bytes = good.to_bytes();
        assert_eq!(TreeImage::from_bytes(&bytes).unwrap().pairs, good.pairs);
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let refused = TreeImage::from_bytes(&bytes).unwrap_err();
        assert!(refused.to_string().contains("checksum"), "{refused}");
    }

    #[test]
    fn image_with_a_short_key_reaches_the_live_tree() {
        for pairs in [
            vec![(vec![keys::DEAD_LETTER_TAG, 1, b'q'], encode(&0u8))],
            vec![(vec![keys::MESSAGE_TAG], Vec::new())],
            vec![(b"zz".to_vec(), Vec::new())],
            vec![(keys::next_dead_letter("q"), b"not a number at all".to_vec())],
            vec![
                (keys::next_dead_letter("b"), encode(&1u64)),
                (keys::next_dead_letter("a"), encode(&1u64)),
            ],
            vec![(keys::removed(&keys::message("q", "p", 0)), vec![1])],
        ] {
            assert!(image(pairs.clone()).validate().is_err(), "{pairs:?} taken");
        }
    }
}
