//! Reading the log back: entries for openraft, and the payloads stored
//! messages point at.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::RangeBounds;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::{EncodedEntry, FRAME_HEADER, Location, PayloadSection, Record, Wal};
use crate::types::{LogId, ShardId};

impl Wal {
    /// Encoded entries of `shard` in `range`, in index order.
    pub fn read(
        &self,
        shard: ShardId,
        range: impl RangeBounds<u64>,
    ) -> io::Result<Vec<EncodedEntry>> {
        let (locations, files) = {
            let state = self.lock();
            let Some(log) = state.shards.get(&shard) else {
                return Ok(Vec::new());
            };
            let locations: Vec<Location> = log
                .entries
                .range(range)
                .filter(|&(index, _)| log.is_visible(index))
                .map(|(_, location)| location)
                .collect();
            let files: HashMap<u64, Arc<File>> = locations
                .iter()
                .map(|l| (l.segment, state.file_of_live_entry(l.segment)))
                .collect();
            (locations, files)
        };
        locations
            .into_iter()
            .map(|location| {
                let mut bytes = vec![0; location.len as usize];
                files[&location.segment].read_exact_at(&mut bytes, location.offset)?;
                let (record, mut payloads) =
                    postcard::take_from_bytes::<Record>(&bytes[FRAME_HEADER..])
                        .map_err(io::Error::other)?;
                let Record::Entry {
                    entry,
                    payload_lens,
                    ..
                } = record
                else {
                    return Err(io::Error::other(format!(
                        "expected an entry at {location:?}, found {record:?}"
                    )));
                };
                let mut split = Vec::with_capacity(payload_lens.len());
                for len in payload_lens {
                    let Some((payload, rest)) = payloads.split_at_checked(len as usize) else {
                        return Err(io::Error::other(format!(
                            "the entry at {location:?} lists more payload bytes than its frame holds"
                        )));
                    };
                    split.push(payload.to_vec());
                    payloads = rest;
                }
                Ok(EncodedEntry {
                    meta: entry,
                    payloads: split,
                })
            })
            .collect()
    }

    /// Where the payloads of `shard`'s entry `log_id` lie, if the log holds
    /// that entry and it is durable (a stored message may point only at
    /// bytes a crash cannot take back). For the apply that asks: the
    /// segment stays until the shard's next [`Wal::set_pins`].
    pub fn payload_section(&self, shard: ShardId, log_id: LogId) -> Option<PayloadSection> {
        let mut state = self.lock();
        let location = state.shards.get(&shard)?.entries.location_of(log_id)?;
        let durable = location.segment != state.active.id
            || location.offset + u64::from(location.len) <= state.synced_len;
        if !durable {
            return None;
        }
        state.pins.in_apply(shard, location.segment);
        Some(PayloadSection {
            segment: location.segment,
            offset: location.offset + u64::from(location.payloads_at),
        })
    }

    /// The `len` bytes at `offset` of `segment`: a payload a stored message points at.
    pub fn read_payload(&self, segment: u64, offset: u64, len: u32) -> io::Result<Vec<u8>> {
        let file = self.lock().file(segment).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("raft log segment {segment} holds a stored payload but is gone"),
            )
        })?;
        let mut payload = vec![0; len as usize];
        file.read_exact_at(&mut payload, offset)?;
        Ok(payload)
    }
}
