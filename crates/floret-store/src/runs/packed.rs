//! Packed runs: the usual run, whose messages all point into one segment
//! of this node's raft log, share one commit time and carry no headers,
//! stored as the few bytes that differ from one message to the next.
//!
//! In the plain form each message of such a run takes about 24 bytes (its
//! whole [`RestingMessage`] encoding and an end offset); packed, about 7.
//! sled materialises whole leaves of these values in memory while it
//! inserts and reads them, and counts them against its cache only later
//! (see BENCHMARKS.md, "Memory at 10,000,000 messages"), so the size of a
//! run is what a large backlog costs in memory.
//!
//! Layout, after the first word (`count | PACKED`, little-endian u32):
//! - the segment, the commit time (zigzag) and the first payload's offset,
//!   as varints;
//! - per message: the gap from the previous payload's end to this one's
//!   offset (varint), the payload's length (varint), its crc32 (4 bytes,
//!   little-endian).
//!
//! [`message`] rebuilds a message's plain encoding byte for byte, and
//! [`pack`] packs only messages whose plain encoding it rebuilds exactly,
//! so everything above the run (accounting, digests, snapshots) sees the
//! same bytes whichever form a replica stored.
//!
//! IMPLEMENTATION CAVEATS
//! - Reading message `i` decodes the `i` entries before it; a run holds at
//!   most [`super::MAX_RUN_MESSAGES`].

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::RunError;
use crate::resting::{LoggedPayload, RestingMessage, RestingPayload, encode_resting};

/// Set in a run's first word when the run is packed. A plain run's first
/// word is its message count, which never reaches it.
pub(super) const PACKED: u32 = 1 << 31;

/// What every message of a packed run shares, read from its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shared {
    segment: u64,
    enqueued_at_ms: i64,
    first_offset: u64,
    /// Where the per-message entries start in the stored value.
    entries_start: usize,
}

/// The packed form of `messages` (plain encodings of messages at rest), or
/// None when they do not all point into one segment with one commit time
/// and no headers.
pub(super) fn pack<M: AsRef<[u8]>>(messages: &[M]) -> Option<Vec<u8>> {
    let count = u32::try_from(messages.len())
        .ok()
        .filter(|&n| n > 0 && n < PACKED)?;
    let mut packed = Vec::with_capacity(24 + 8 * messages.len());
    packed.extend_from_slice(&(count | PACKED).to_le_bytes());
    let mut shared: Option<(u64, i64)> = None;
    let mut previous_end = None;
    let mut rebuilt = [0u8; 64];
    for plain in messages {
        let plain = plain.as_ref();
        let message: RestingMessage<'_> = postcard::from_bytes(plain).ok()?;
        let RestingPayload::Logged(logged) = message.payload else {
            return None;
        };
        if !message.headers.is_empty() {
            return None;
        }
        match shared {
            None => {
                shared = Some((logged.segment, message.enqueued_at_ms));
                put_varint(&mut packed, logged.segment);
                put_varint(&mut packed, zigzag(message.enqueued_at_ms));
                put_varint(&mut packed, logged.offset);
            }
            Some(run) if run == (logged.segment, message.enqueued_at_ms) => {}
            Some(_) => return None,
        }
        let canonical = postcard::to_slice(&message, &mut rebuilt).ok()?;
        if &canonical[..] != plain {
            return None;
        }
        let gap = logged
            .offset
            .checked_sub(previous_end.unwrap_or(logged.offset))?;
        put_varint(&mut packed, gap);
        put_varint(&mut packed, u64::from(logged.len));
        packed.extend_from_slice(&logged.crc.to_le_bytes());
        previous_end = Some(logged.offset.checked_add(u64::from(logged.len))?);
    }
    Some(packed)
}

/// Checks a packed run of `count` messages (`bytes` from its first word on)
/// whole: its header and every entry, each payload's end within u64.
pub(super) fn parse(bytes: &[u8], count: usize) -> Result<Shared, RunError> {
    let header = &bytes[4..];
    let (segment, rest) = take_varint(header)?;
    let (enqueued_at, rest) = take_varint(rest)?;
    let (first_offset, mut rest) = take_varint(rest)?;
    let shared = Shared {
        segment,
        enqueued_at_ms: unzigzag(enqueued_at),
        first_offset,
        entries_start: bytes.len() - rest.len(),
    };
    let mut end = first_offset;
    for _ in 0..count {
        let entry;
        (entry, rest) = take_entry(rest)?;
        end = entry.end_after(end)?;
    }
    if !rest.is_empty() {
        return Err(RunError("bytes past a packed run's last message"));
    }
    Ok(shared)
}

/// The plain encoding of message `index` of a packed run that [`parse`]
/// accepted, rebuilt.
pub(super) fn message(
    bytes: &[u8],
    shared: &Shared,
    index: usize,
) -> Result<Cow<'static, [u8]>, RunError> {
    let (entry, previous_end) = entry_at(bytes, shared, index)?;
    let offset = previous_end
        .checked_add(entry.gap)
        .ok_or(RunError("a packed run's offsets overflow"))?;
    let payload = RestingPayload::Logged(LoggedPayload {
        segment: shared.segment,
        offset,
        len: entry.len,
        crc: entry.crc,
    });
    Ok(Cow::Owned(encode_resting(
        payload,
        &BTreeMap::new(),
        shared.enqueued_at_ms,
    )))
}

/// The payload length of message `index` of a packed run that [`parse`]
/// accepted.
pub(super) fn payload_len(bytes: &[u8], shared: &Shared, index: usize) -> Result<u32, RunError> {
    Ok(entry_at(bytes, shared, index)?.0.len)
}

/// The entry of message `index` of a packed run that [`parse`] accepted,
/// with the end of the payload before it (the first's offset for message 0).
fn entry_at(bytes: &[u8], shared: &Shared, index: usize) -> Result<(Entry, u64), RunError> {
    let mut rest = &bytes[shared.entries_start..];
    let mut end = shared.first_offset;
    for _ in 0..index {
        let entry;
        (entry, rest) = take_entry(rest)?;
        end = entry.end_after(end)?;
    }
    let (entry, _) = take_entry(rest)?;
    Ok((entry, end))
}

impl Shared {
    /// The commit time every message of the run shares.
    pub(super) fn enqueued_at_ms(&self) -> i64 {
        self.enqueued_at_ms
    }
}

/// One message's entry in a packed run.
struct Entry {
    gap: u64,
    len: u32,
    crc: u32,
}

impl Entry {
    /// The end of this message's payload, given the previous one's end
    /// (or, for the first, its offset: its gap is then 0).
    fn end_after(&self, previous_end: u64) -> Result<u64, RunError> {
        previous_end
            .checked_add(self.gap)
            .and_then(|offset| offset.checked_add(u64::from(self.len)))
            .ok_or(RunError("a packed run's offsets overflow"))
    }
}

fn take_entry(bytes: &[u8]) -> Result<(Entry, &[u8]), RunError> {
    let (gap, rest) = take_varint(bytes)?;
    let (len, rest) = take_varint(rest)?;
    let len = u32::try_from(len).map_err(|_| RunError("a packed payload length past u32"))?;
    let (crc, rest) = rest
        .split_first_chunk::<4>()
        .ok_or(RunError("a packed run ends inside an entry"))?;
    let entry = Entry {
        gap,
        len,
        crc: u32::from_le_bytes(*crc),
    };
    Ok((entry, rest))
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn take_varint(bytes: &[u8]) -> Result<(u64, &[u8]), RunError> {
    // Most gaps are 0 and fit one byte: every read of a run walks its
    // entries, so this case is worth its own branch.
    if let Some((&byte, rest)) = bytes.split_first()
        && byte < 0x80
    {
        return Ok((u64::from(byte), rest));
    }
    let mut value = 0u64;
    for (at, &byte) in bytes.iter().enumerate().take(10) {
        let bits = u64::from(byte & 0x7f);
        if at == 9 && bits > 1 {
            return Err(RunError("a packed run's varint overflows"));
        }
        value |= bits << (7 * at);
        if byte & 0x80 == 0 {
            return Ok((value, &bytes[at + 1..]));
        }
    }
    Err(RunError("a packed run ends inside a varint"))
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::super::{Run, encode};
    use super::*;

    fn logged(segment: u64, offset: u64, payload: &[u8], at: i64) -> Vec<u8> {
        encode_resting(
            RestingPayload::Logged(LoggedPayload {
                segment,
                offset,
                len: payload.len() as u32,
                crc: crc32fast::hash(payload),
            }),
            &BTreeMap::new(),
            at,
        )
    }

    /// One produce call's messages as the apply stores them: payloads one
    /// after another in one frame, a few bytes of framing between them.
    fn one_call(count: usize) -> Vec<Vec<u8>> {
        let payload = [7u8; 128];
        (0..count)
            .map(|index| {
                logged(
                    12,
                    40_000_000 + 131 * index as u64,
                    &payload,
                    1_764_000_000_123,
                )
            })
            .collect()
    }

    #[test]
    fn a_produce_calls_run_is_packed_and_reads_back_byte_for_byte() {
        let messages = one_call(100);
        let plain_size: usize = messages.iter().map(|m| m.len() + 4).sum();
        let stored = encode(&messages);
        assert!(
            stored.len() * 3 < plain_size,
            "{} bytes packed against {plain_size} plain",
            stored.len()
        );
        let run = Run::parse(stored).unwrap();
        assert_eq!(run.len(), 100);
        for (index, message) in messages.iter().enumerate() {
            assert_eq!(
                run.message_within(index).unwrap().as_ref(),
                message.as_slice()
            );
        }
        assert_eq!(run.message(100).unwrap(), None);
        assert!(run.message_within(100).is_err());
    }

    #[test]
    fn runs_that_do_not_share_a_segment_time_or_empty_headers_stay_plain() {
        let payload = b"abc";
        let mut headers = BTreeMap::new();
        headers.insert("k".to_owned(), "v".to_owned());
        let with_headers = encode_resting(
            RestingPayload::Logged(LoggedPayload {
                segment: 1,
                offset: 10,
                len: 3,
                crc: crc32fast::hash(payload),
            }),
            &headers,
            5,
        );
        let cases = [
            vec![logged(1, 10, payload, 5), logged(2, 20, payload, 5)],
            vec![logged(1, 10, payload, 5), logged(1, 20, payload, 6)],
            vec![logged(1, 20, payload, 5), logged(1, 10, payload, 5)],
            vec![logged(1, 10, payload, 5), with_headers],
            vec![encode_resting(
                RestingPayload::Inline(payload),
                &BTreeMap::new(),
                5,
            )],
        ];
        for messages in cases {
            let stored = encode(&messages);
            assert!(pack(&messages).is_none());
            let run = Run::parse(stored).unwrap();
            for (index, message) in messages.iter().enumerate() {
                assert_eq!(
                    run.message_within(index).unwrap().as_ref(),
                    message.as_slice()
                );
            }
        }
    }

    #[test]
    fn damaged_packed_run_is_refused_not_misread() {
        let stored = encode(&one_call(3));
        assert!(Run::parse(stored.clone()).is_ok());
        let mut short = stored.clone();
        short.pop();
        assert!(
            Run::parse(short).is_err(),
            "a run cut inside its last entry"
        );
        let mut long = stored.clone();
        long.push(0);
        assert!(Run::parse(long).is_err(), "bytes past the last entry");
        let mut none = stored.clone();
        none[..4].copy_from_slice(&PACKED.to_le_bytes());
        assert!(Run::parse(none).is_err(), "a packed run of no messages");
        let mut fewer = stored.clone();
        fewer[..4].copy_from_slice(&(2 | PACKED).to_le_bytes());
        assert!(Run::parse(fewer).is_err(), "a count below its entries");
        let mut endless = PACKED.to_le_bytes().to_vec();
        endless[0] = 1;
        endless.extend_from_slice(&[0xff; 11]);
        assert!(Run::parse(endless).is_err(), "a varint that never ends");
        let mut overflowing = (1 | PACKED).to_le_bytes().to_vec();
        put_varint(&mut overflowing, 1);
        put_varint(&mut overflowing, 0);
        put_varint(&mut overflowing, u64::MAX);
        put_varint(&mut overflowing, 0);
        put_varint(&mut overflowing, 10);
        overflowing.extend_from_slice(&[0; 4]);
        assert!(
            Run::parse(overflowing).is_err(),
            "a payload ending past u64"
        );
    }

    #[test]
    fn packed_messages_count_the_bytes_their_plain_encodings_count() {
        for at in [0, -1, 1_764_000_000_123, i64::MIN / 2, i64::MAX] {
            let messages: Vec<Vec<u8>> = [0usize, 1, 127, 128, 16_383, 16_384, 70_000]
                .iter()
                .scan(5u64, |offset, &len| {
                    let message = logged(3, *offset, &vec![9u8; len], at);
                    *offset += len as u64 + 2;
                    Some(message)
                })
                .collect();
            let run = Run::parse(pack(&messages).expect("packs")).unwrap();
            for (index, message) in messages.iter().enumerate() {
                assert_eq!(
                    run.accounted_len(index).unwrap(),
                    crate::resting::accounted_len(message).unwrap(),
                    "message {index} committed at {at}"
                );
            }
            assert!(
                run.accounted_len(messages.len()).is_err(),
                "an index past the run is corruption, not 0 bytes"
            );
        }
    }

    #[test]
    fn commit_times_before_the_epoch_and_large_offsets_round_trip() {
        let payload = vec![1u8; 70_000];
        for (segment, offset, at) in [(0, 0, 0), (u64::MAX / 4, 1 << 40, -1), (3, 5, i64::MIN / 2)]
        {
            let messages = vec![
                logged(segment, offset, &payload, at),
                logged(segment, offset + 70_010, b"", at),
            ];
            let run = Run::parse(pack(&messages).expect("packs")).unwrap();
            for (index, message) in messages.iter().enumerate() {
                assert_eq!(
                    run.message_within(index).unwrap().as_ref(),
                    message.as_slice()
                );
            }
        }
    }
}
