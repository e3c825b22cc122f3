//! Recovery: replaying a segment's records into the shards' in-memory logs,
//! telling a torn write at the very end (cut off) from damage anywhere else
//! (the log refuses to open).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::Path;

use super::forgetting::{Forgotten, forget_before};
use super::{CorruptLog, FRAME_HEADER, Location, MAX_FRAME_BYTES, Record, ShardLog};
use crate::types::ShardId;

/// Applies one segment's records to `shards` (and the retired replicas'
/// marks to `forgotten`); returns the length of its valid prefix.
pub(super) fn replay_segment(
    path: &Path,
    id: u64,
    is_last: bool,
    shards: &mut HashMap<ShardId, ShardLog>,
    forgotten: &mut Forgotten,
) -> io::Result<u64> {
    let bytes = fs::read(path)?;
    let mut offset = 0usize;
    while offset < bytes.len() {
        let corrupt = |reason: String, at_tail: bool| -> io::Result<u64> {
            if is_last && at_tail {
                tracing::warn!(path = %path.display(), offset, %reason, "cutting a torn write off the raft log");
                Ok(offset as u64)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    CorruptLog {
                        path: path.to_path_buf(),
                        offset: offset as u64,
                        reason,
                    },
                ))
            }
        };
        let Some(header) = bytes.get(offset..offset + FRAME_HEADER) else {
            return corrupt("frame header cut short".into(), true);
        };
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        let Some(body) = bytes.get(offset + FRAME_HEADER..offset + FRAME_HEADER + len) else {
            return corrupt(
                format!("frame of {len} bytes cut short"),
                len <= MAX_FRAME_BYTES,
            );
        };
        // Only the very last frame can be a torn write; a bad frame with
        // frames after it is damage, and cutting there would drop synced data.
        let is_last_frame = offset + FRAME_HEADER + len == bytes.len();
        if crc32fast::hash(body) != crc {
            return corrupt("checksum mismatch".into(), is_last_frame);
        }
        let (record, payloads) = match postcard::take_from_bytes::<Record>(body) {
            Ok(decoded) => decoded,
            Err(error) => return corrupt(error.to_string(), is_last_frame),
        };
        let frame_len = (FRAME_HEADER + len) as u32;
        match record {
            Record::Entry {
                shard,
                log_id,
                payload_lens,
                ..
            } => {
                let listed: u64 = payload_lens.iter().map(|&len| u64::from(len)).sum();
                if listed != payloads.len() as u64 {
                    return corrupt(
                        format!(
                            "entry lists {listed} payload bytes, its frame holds {}",
                            payloads.len()
                        ),
                        is_last_frame,
                    );
                }
                let log = shards.entry(shard).or_default();
                log.entries.insert(
                    log_id,
                    Location {
                        segment: id,
                        offset: offset as u64,
                        len: frame_len,
                        payloads_at: (FRAME_HEADER + len - payloads.len()) as u32,
                    },
                );
            }
            Record::Vote { shard, vote } => shards.entry(shard).or_default().vote = Some(vote),
            Record::Committed { shard, committed } => {
                shards.entry(shard).or_default().committed = committed
            }
            Record::Truncate { shard, since } => {
                shards.entry(shard).or_default().entries.truncate(since);
            }
            Record::Purge { shard, upto } => {
                let log = shards.entry(shard).or_default();
                log.entries.purge(upto.index);
                log.last_purged = Some(upto);
            }
            Record::Forget { shard, before } => forget_before(shards, forgotten, shard, before),
            Record::Padding => {}
        }
        offset += FRAME_HEADER + len;
    }
    Ok(bytes.len() as u64)
}
