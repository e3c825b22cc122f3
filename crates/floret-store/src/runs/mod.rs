//! A producer's messages at rest, stored in runs: the messages of one
//! produce call under one key, not one key each.
//!
//! sled 0.34 keeps at most 16 entries in a leaf and copies a leaf on every
//! insert, so one key per message made every enqueue split leaves every few
//! inserts and left a backlog of millions of messages as millions of small
//! allocations in its cache. A run is one value:
//!
//! - `count`: u32 little-endian, the messages in the run (at least one);
//! - `count` u32 little-endian ends, each message's end offset in the data;
//! - the data: each message at rest (`resting.rs`: headers, commit time
//!   and the payload inline or as a pointer into the raft log), one after
//!   the other.
//!
//! so reading the i-th message is two offset reads and a slice. The usual
//! run, whose payloads all lie in one segment of the raft log, is stored
//! packed instead (`packed.rs`: about 7 bytes a message instead of 24),
//! and reads back as the same plain encodings. A run's key
//! is the key of its first message ([`crate::keys::message`]); a run holds
//! consecutive sequences. A message is removed (acked, dropped, dead
//! lettered) when it lies below its producer's head, or when its bit is set
//! in the run's removal marks, a small value under [`crate::keys::removed`]
//! (`removed.rs`); the run and its marks are deleted once every message of
//! the run is removed. A run never changes once written, so an ack moves
//! the head or rewrites a few bytes of marks, not the run.
//!
//! IMPLEMENTATION CAVEATS
//! - A run whose messages are all acked but one keeps the whole run on disk
//!   until that one goes.
//! - A reader outside the state machine reads the producer's head, the run
//!   and then its marks, not all at one instant (the run and marks do come
//!   together from the run's held hint, `hints.rs`): if an apply moves the
//!   head or deletes the run (its last message acked) between the reads, the
//!   reader takes the run's acked messages for live until its next read. The dispatcher only
//!   reads a message it holds as ready, so this shows at worst as one
//!   delivery of a message removed at that instant, the same as a read
//!   just before the removal.
//! - Snapshots carry the runs with every payload inline and no format
//!   version of their own: every node of a cluster must run the same data
//!   format.

use std::borrow::Cow;

use crate::keys;
use crate::resting::{self, RestingError};
use crate::shard_tree::ShardTree;

mod hints;
mod packed;
mod removed;

pub(crate) use hints::{RunHints, StoredRun, last_at_or_before};
pub(crate) use removed::{Removal, Removed};

/// Most bytes a run's messages count against their producer (each its
/// size stored inline, [`crate::resting::accounted_len`]): a produce call
/// larger than this is stored as several runs. The split must not depend
/// on the form a replica stores (a payload inline or in its log), or
/// replicas would hold different keys for the same messages. sled splits
/// its leaves by entry count (16), not size, so the leaves of large runs
/// are large: 32 KiB runs of inline payloads held about 85 MiB for a
/// backlog of 1,000,000 messages whatever the cache size (see
/// `examples/backlog_footprint.rs`). 16 KiB keeps a produce call of 100
/// messages of 128 bytes in one run; packed, such a run is about 700 bytes.
pub(crate) const MAX_RUN_BYTES: u64 = 16 * 1024;

/// Most messages a run holds, so that reading one of a packed run decodes
/// a bounded number of entries before it.
pub(crate) const MAX_RUN_MESSAGES: usize = 256;

/// A stored value that is not a well-formed run or set of marks: the data
/// dir is damaged or not floret's.
#[derive(Debug, thiserror::Error)]
#[error("corrupt message run: {0}")]
pub struct RunError(pub(crate) &'static str);

/// Encodes messages (each already in its stored encoding) as one run:
/// packed when they allow it, plain otherwise.
pub(crate) fn encode<M: AsRef<[u8]>>(messages: &[M]) -> Vec<u8> {
    packed::pack(messages).unwrap_or_else(|| encode_plain(messages))
}

/// Encodes messages as a plain run: a count, the end offsets, the data.
fn encode_plain<M: AsRef<[u8]>>(messages: &[M]) -> Vec<u8> {
    let data_len: usize = messages.iter().map(|m| m.as_ref().len()).sum();
    let mut run = Vec::with_capacity(4 + 4 * messages.len() + data_len);
    run.extend_from_slice(&(messages.len() as u32).to_le_bytes());
    let mut end = 0u32;
    for message in messages {
        end += message.as_ref().len() as u32;
        run.extend_from_slice(&end.to_le_bytes());
    }
    for message in messages {
        run.extend_from_slice(message.as_ref());
    }
    run
}

/// Splits a produce call's messages, given the bytes each counts against
/// its producer, into runs of at most [`MAX_RUN_BYTES`] and
/// [`MAX_RUN_MESSAGES`] (a single larger message is a run of its own): the
/// index range of each run.
pub(crate) fn split(accounted: &[u64]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (index, &len) in accounted.iter().enumerate() {
        let full = bytes + len > MAX_RUN_BYTES || index - start == MAX_RUN_MESSAGES;
        if index > start && full {
            runs.push(start..index);
            (start, bytes) = (index, 0);
        }
        bytes += len;
    }
    if start < accounted.len() {
        runs.push(start..accounted.len());
    }
    runs
}

/// A run read from its stored bytes.
#[derive(Debug, Clone)]
pub(crate) struct Run<B> {
    bytes: B,
    count: usize,
    /// What a packed run's messages share; None for a plain run.
    packed: Option<packed::Shared>,
}

impl<B: AsRef<[u8]>> Run<B> {
    /// Checks the framing of a stored run.
    pub(crate) fn parse(bytes: B) -> Result<Self, RunError> {
        let raw = bytes.as_ref();
        let first_word = raw
            .first_chunk::<4>()
            .map(|word| u32::from_le_bytes(*word))
            .ok_or(RunError("shorter than its header"))?;
        if first_word & packed::PACKED != 0 {
            let count = (first_word & !packed::PACKED) as usize;
            if count == 0 {
                return Err(RunError("a packed run of no messages"));
            }
            let shared = packed::parse(raw, count)?;
            return Ok(Self {
                bytes,
                count,
                packed: Some(shared),
            });
        }
        let count = first_word as usize;
        let data_start = 4 + 4 * count;
        if count == 0 || raw.len() < data_start {
            return Err(RunError("message count does not fit the value"));
        }
        let run = Self {
            bytes,
            count,
            packed: None,
        };
        if run.end(count - 1) != run.bytes.as_ref().len() - data_start {
            return Err(RunError("offsets do not cover the data"));
        }
        Ok(run)
    }

    /// The same run held through `wrap`, which must keep the bytes as they
    /// are: they were checked once, and are not checked again.
    pub(crate) fn rewrapped<C: AsRef<[u8]>>(self, wrap: impl FnOnce(B) -> C) -> Run<C> {
        Run {
            bytes: wrap(self.bytes),
            count: self.count,
            packed: self.packed,
        }
    }

    /// The stored bytes, borrowed.
    pub(crate) fn as_bytes(&self) -> &B {
        &self.bytes
    }

    /// The stored bytes.
    pub(crate) fn into_bytes(self) -> B {
        self.bytes
    }

    /// Messages in the run, removed ones included.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// The stored encoding of message `index` (rebuilt, for a packed run);
    /// None past the run's end, an error when the offsets are damaged.
    pub(crate) fn message(&self, index: usize) -> Result<Option<Cow<'_, [u8]>>, RunError> {
        if index >= self.count {
            return Ok(None);
        }
        if let Some(shared) = &self.packed {
            return packed::message(self.bytes.as_ref(), shared, index).map(Some);
        }
        let start = if index == 0 { 0 } else { self.end(index - 1) };
        let data = &self.bytes.as_ref()[4 + 4 * self.count..];
        data.get(start..self.end(index))
            .map(|message| Some(Cow::Borrowed(message)))
            .ok_or(RunError("offsets out of order"))
    }

    /// The stored encoding of message `index`, which the caller found in
    /// the run (a live index from its marks): a missing one is corruption.
    pub(crate) fn message_within(&self, index: usize) -> Result<Cow<'_, [u8]>, RunError> {
        self.message(index)?
            .ok_or(RunError("a message index past the run"))
    }

    /// What message `index` counts against its producer's limits
    /// ([`resting::accounted_len`] of its stored encoding), for a packed run
    /// without rebuilding that encoding.
    pub(crate) fn accounted_len(&self, index: usize) -> Result<u64, RestingError> {
        if index >= self.count {
            return Err(RunError("a message index past the run").into());
        }
        match &self.packed {
            Some(shared) => {
                let payload_len = packed::payload_len(self.bytes.as_ref(), shared, index)?;
                Ok(resting::accounted_len_without_headers(
                    payload_len,
                    shared.enqueued_at_ms(),
                ))
            }
            None => resting::accounted_len(&self.message_within(index)?),
        }
    }

    fn end(&self, index: usize) -> usize {
        let at = 4 + 4 * index;
        let end: [u8; 4] = self.bytes.as_ref()[at..at + 4]
            .try_into()
            .expect("four bytes");
        u32::from_le_bytes(end) as usize
    }
}

/// Reads message `sequence` out of `stored`, the last run at or before it,
/// of a producer whose head is at `head`, unless it is removed: below the
/// head, or marked (the held marks the lookup gave, else read from `tree`).
pub(crate) fn live_message<'r>(
    tree: &ShardTree,
    stored: &'r StoredRun,
    sequence: u64,
    head: u64,
) -> Result<Option<Cow<'r, [u8]>>, RunStoreError> {
    let run = &stored.run;
    let first = keys::message_sequence(&stored.key).ok_or(RunError("a run key too short"))?;
    if sequence < head || sequence < first {
        return Ok(None);
    }
    let index = (sequence - first) as usize;
    let Some(message) = run.message(index)? else {
        return Ok(None);
    };
    let marks = match &stored.marks {
        Some(held) => held.clone(),
        None => tree.get(keys::removed(&stored.key))?,
    };
    let removed = Removed::stored(marks.as_deref(), run.len())?;
    Ok((!removed.contains(index)).then_some(message))
}

/// The first stored run with a key at or after `from` that begins with `prefix`.
pub(crate) fn first_from(
    tree: &ShardTree,
    from: &[u8],
    prefix: &[u8],
) -> Result<Option<(sled::IVec, Run<sled::IVec>)>, RunStoreError> {
    let Some((key, value)) = tree.range_from(from).next().transpose()? else {
        return Ok(None);
    };
    if !key.starts_with(prefix) {
        return Ok(None);
    }
    Ok(Some((key, Run::parse(value)?)))
}

/// What stops a run from being read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunStoreError {
    #[error(transparent)]
    Sled(#[from] sled::Error),
    #[error(transparent)]
    Corrupt(#[from] RunError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_of_a_run_reads_back_whole() {
        let messages: Vec<Vec<u8>> = vec![b"a".to_vec(), Vec::new(), b"ccc".to_vec()];
        let run = Run::parse(encode(&messages)).unwrap();
        assert_eq!(run.len(), 3);
        for (index, message) in messages.iter().enumerate() {
            assert_eq!(
                run.message(index).unwrap().as_deref(),
                Some(message.as_slice())
            );
        }
        assert_eq!(run.message(3).unwrap(), None);
        assert_eq!(&*run.message_within(2).unwrap(), b"ccc");
        assert!(
            run.message_within(3).is_err(),
            "an index the marks call live but the run lacks is corruption"
        );
    }

    #[test]
    fn damaged_run_is_refused_not_misread() {
        let mut run = encode(&[b"abc".to_vec()]);
        run.pop();
        assert!(Run::parse(run).is_err());
        assert!(Run::parse(0u32.to_le_bytes().to_vec()).is_err());
        assert!(Run::parse(1_000u32.to_le_bytes().to_vec()).is_err());
        assert!(Run::parse(Vec::new()).is_err());
        let mut crossed = encode(&[b"ab".to_vec(), b"c".to_vec()]);
        crossed[4..8].copy_from_slice(&5u32.to_le_bytes());
        let crossed = Run::parse(crossed).unwrap();
        assert!(crossed.message(1).is_err());
    }

    #[test]
    fn large_produce_is_split_into_runs_below_the_cap() {
        let third = MAX_RUN_BYTES / 3;
        assert_eq!(split(&[third; 7]), vec![0..3, 3..6, 6..7]);
        assert_eq!(split(&[MAX_RUN_BYTES * 2, 1]), vec![0..1, 1..2]);
        assert!(split(&[]).is_empty());
        let many_small = vec![1; MAX_RUN_MESSAGES * 2 + 1];
        assert_eq!(
            split(&many_small),
            vec![
                0..MAX_RUN_MESSAGES,
                MAX_RUN_MESSAGES..MAX_RUN_MESSAGES * 2,
                MAX_RUN_MESSAGES * 2..MAX_RUN_MESSAGES * 2 + 1
            ]
        );
    }
}
