//! The log's segment files: their names, creating one (and syncing the
//! directory so it survives a crash), the records the log holds and the
//! frame each is written as,
//! appending whole frames to the active segment, and padding it to the
//! end of its page before a sync.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::Vote;
use serde::{Deserialize, Serialize};

use super::{EncodedEntry, FRAME_HEADER, PAGE_BYTES, Segment, WalState};
use crate::records::encode;
use crate::types::{LogId, NodeId, ShardId};

/// What one frame of the log carries.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Record {
    /// Followed in its frame by the payloads, raw, of the lengths listed.
    Entry {
        shard: ShardId,
        log_id: LogId,
        entry: Vec<u8>,
        payload_lens: Vec<u32>,
    },
    Vote {
        shard: ShardId,
        vote: Vote<NodeId>,
    },
    Committed {
        shard: ShardId,
        committed: Option<LogId>,
    },
    Truncate {
        shard: ShardId,
        since: u64,
    },
    Purge {
        shard: ShardId,
        upto: LogId,
    },
    /// The shard's replica here was retired: every frame of the shard
    /// before this position (its entries, vote, commit mark and purge
    /// point) no longer counts. Written where it happened, and again in
    /// every checkpoint while a segment from before it remains
    /// (`forgetting.rs`).
    Forget {
        shard: ShardId,
        before: FramePosition,
    },
    /// Fills the rest of a page before a sync ([`super::Wal::sync`]), so
    /// that the frames after it start on a page of their own. Its payload
    /// is zeros; recovery skips it.
    Padding,
}

/// Where a frame starts: its segment, and its offset in that segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(super) struct FramePosition {
    pub(super) segment: u64,
    pub(super) offset: u64,
}

pub(super) fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("wal-{id:020}.log"))
}

pub(super) fn frame(record: &Record) -> Vec<u8> {
    frame_with_payloads(record, &[]).0
}

/// The frame of one entry of `shard`, and where its payloads start in it.
pub(super) fn entry_frame(shard: ShardId, log_id: LogId, entry: EncodedEntry) -> (Vec<u8>, u32) {
    let record = Record::Entry {
        shard,
        log_id,
        entry: entry.meta,
        payload_lens: entry.payloads.iter().map(|p| p.len() as u32).collect(),
    };
    frame_with_payloads(&record, &entry.payloads)
}

/// `record` followed by `payloads` in one checksummed frame; the offset
/// of the first payload from the frame's start.
fn frame_with_payloads(record: &Record, payloads: &[Vec<u8>]) -> (Vec<u8>, u32) {
    let head = encode(record);
    let body_len = head.len() + payloads.iter().map(Vec::len).sum::<usize>();
    let mut frame = Vec::with_capacity(FRAME_HEADER + body_len);
    frame.extend_from_slice(&(body_len as u32).to_le_bytes());
    frame.extend_from_slice(&[0; 4]);
    frame.extend_from_slice(&head);
    for payload in payloads {
        frame.extend_from_slice(payload);
    }
    let crc = crc32fast::hash(&frame[FRAME_HEADER..]);
    frame[4..FRAME_HEADER].copy_from_slice(&crc.to_le_bytes());
    (frame, (FRAME_HEADER + head.len()) as u32)
}

/// The padding frame that takes a segment of `len` bytes to the end of
/// its page (or of the next one, when the rest of this page is too short
/// for a frame), or None when it ends on a page boundary already.
pub(super) fn padding_to_page_end(len: u64) -> Option<Vec<u8>> {
    let rest = (PAGE_BYTES - len % PAGE_BYTES) % PAGE_BYTES;
    if rest == 0 {
        return None;
    }
    let empty_padding_bytes = frame(&Record::Padding).len() as u64;
    let padded = if rest >= empty_padding_bytes {
        rest
    } else {
        rest + PAGE_BYTES
    };
    let zeros = vec![0; (padded - empty_padding_bytes) as usize];
    Some(frame_with_payloads(&Record::Padding, &[zeros]).0)
}

pub(super) fn create_segment(dir: &Path, id: u64) -> io::Result<Segment> {
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create_new(true)
        .open(segment_path(dir, id))?;
    File::open(dir)?.sync_all()?;
    Ok(Segment {
        id,
        file: Arc::new(file),
        len: 0,
    })
}

impl WalState {
    pub(super) fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some(reason) => Err(io::Error::other(format!(
                "the raft log stopped after an I/O failure ({reason}); restart the node"
            ))),
            None => Ok(()),
        }
    }

    /// Stops the log when `result` failed: after a failed write or sync,
    /// what is on disk is unknown, so no later call may succeed. The first
    /// failure's reason is kept.
    pub(super) fn latch<T>(&mut self, what: &str, result: io::Result<T>) -> io::Result<T> {
        if let Err(error) = &result {
            self.failed
                .get_or_insert_with(|| format!("{what} failed: {error}"));
        }
        result
    }

    /// Appends whole frames; a failed write is cut back off so the file never
    /// holds a partial frame while the node runs, and the log stops.
    pub(super) fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.write_to_segment(bytes)?;
        self.written_since_open += bytes.len() as u64;
        Ok(())
    }

    /// Pads the active segment to the end of its page, so that the next
    /// sync does not write this page again. The padding is not counted in
    /// `written_since_open`, which measures what writers log.
    pub(super) fn pad_to_page_end(&mut self) -> io::Result<()> {
        match padding_to_page_end(self.active.len) {
            Some(padding) => self.write_to_segment(&padding),
            None => Ok(()),
        }
    }

    fn write_to_segment(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.check()?;
        if let Err(error) = (&*self.active.file).write_all(bytes) {
            let cut = self.active.file.set_len(self.active.len);
            let what = match cut {
                Ok(()) => "write".to_owned(),
                Err(cut_error) => format!("write (cutting the partial frame failed: {cut_error})"),
            };
            return self.latch(&what, Err(error));
        }
        self.active.len += bytes.len() as u64;
        Ok(())
    }

    /// The file of `segment`, if it was not deleted.
    pub(super) fn file(&self, segment: u64) -> Option<Arc<File>> {
        if segment == self.active.id {
            Some(self.active.file.clone())
        } else {
            self.sealed.get(&segment).cloned()
        }
    }

    /// The file of a segment that holds a live entry, which is never deleted.
    pub(super) fn file_of_live_entry(&self, segment: u64) -> Arc<File> {
        self.file(segment)
            .expect("a segment with live entries is never deleted")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_ends_exactly_on_a_page_boundary() {
        assert_eq!(padding_to_page_end(0), None);
        assert_eq!(padding_to_page_end(2 * PAGE_BYTES), None);
        for len in [
            1,
            100,
            PAGE_BYTES - 9,
            PAGE_BYTES - 8,
            PAGE_BYTES - 1,
            PAGE_BYTES + 5,
        ] {
            let padding = padding_to_page_end(len).expect("a partial page is padded");
            let end = len + padding.len() as u64;
            assert_eq!(
                end % PAGE_BYTES,
                0,
                "padding after {len} bytes ends at {end}"
            );
            assert!(end - len <= 2 * PAGE_BYTES);
        }
    }
}
