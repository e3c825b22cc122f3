//! Checks on the raft messages a peer sends, before openraft sees them.
//!
//! openraft trusts its network. A vote with a term near `u64::MAX` would be
//! stored, and the next campaign's `term + 1` would overflow, so the shard
//! could never elect again; terms above [`MAX_TERM`] are refused wherever
//! they appear. A snapshot arrives in chunks that openraft writes into an
//! in-memory buffer at the chunk's offset, so one chunk far past the end
//! would allocate that much: a chunk must start at or before the bytes
//! received so far of its snapshot (a resent chunk may repeat some), the
//! first chunk of a snapshot at 0, and no snapshot may grow past its cap.
//! An append's entries must follow its `prev_log_id` one by one: openraft
//! checks that only in debug builds, and a follower that took entries past
//! a gap would keep a log with a hole it cannot apply across (a soak left
//! a follower so, after a leader's purge raced its replication).
//! The chunks of a snapshot are kept as they arrive, and the whole image
//! is checked (checksum, every pair) before its last chunk is handed to
//! openraft: openraft's install of a bad image would stop the shard's
//! replica, while a refused chunk is only sent again.
//!
//! Pure: the peer service (`service/peer.rs`) keeps a [`SnapshotChunks`]
//! per node and asks it.
//!
//! IMPLEMENTATION CAVEATS
//! - A snapshot whose sender gave up stays recorded (one entry per shard),
//!   its bytes included, until another snapshot of that shard starts.
//! - A snapshot being received is held twice in memory: here and in
//!   openraft's buffer.

use std::collections::HashMap;

use floret_store::{NodeId, ShardId, TypeConfig};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{LogId, Vote};

/// The highest term a peer may name. An election adds one to the term;
/// no cluster holds 2^62 elections, so a higher term is forged or corrupt.
pub const MAX_TERM: u64 = 1 << 62;

/// Why a raft message from a peer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RaftInputError {
    /// A term so high that raft's arithmetic on it could overflow.
    #[error("term {term} is above the highest allowed ({MAX_TERM})")]
    TermTooHigh {
        /// The term named.
        term: u64,
    },
    /// An append whose entries do not follow its `prev_log_id` one by one.
    #[error(
        "append entry {index} does not follow the one before it (the next index is {expected})"
    )]
    EntriesNotConsecutive {
        /// The entry out of place.
        index: u64,
        /// The index it should have had.
        expected: u64,
    },
    /// A snapshot chunk that does not follow what was received.
    #[error(
        "snapshot chunk at offset {offset} of snapshot {snapshot_id}, but {received} bytes of it were received"
    )]
    ChunkOutOfPlace {
        /// The snapshot.
        snapshot_id: String,
        /// The chunk's offset.
        offset: u64,
        /// Bytes of that snapshot received so far (0 when none).
        received: u64,
    },
    /// A snapshot whose whole image cannot be installed.
    #[error("snapshot {snapshot_id} cannot be installed: {why}")]
    BadImage {
        /// The snapshot.
        snapshot_id: String,
        /// What is wrong with it.
        why: String,
    },
    /// A snapshot larger than the cap.
    #[error(
        "snapshot {snapshot_id} would hold {bytes} bytes, above raft.max_snapshot_bytes ({max})"
    )]
    SnapshotTooLarge {
        /// The snapshot.
        snapshot_id: String,
        /// Its size with this chunk.
        bytes: u64,
        /// The cap.
        max: u64,
    },
}

fn check_term(term: u64) -> Result<(), RaftInputError> {
    if term > MAX_TERM {
        return Err(RaftInputError::TermTooHigh { term });
    }
    Ok(())
}

fn check_vote(vote: &Vote<NodeId>) -> Result<(), RaftInputError> {
    check_term(vote.leader_id.term)
}

fn check_log_id(log_id: Option<&LogId<NodeId>>) -> Result<(), RaftInputError> {
    log_id.map_or(Ok(()), |id| check_term(id.leader_id.term))
}

/// A vote request's terms.
pub fn check_vote_request(request: &VoteRequest<NodeId>) -> Result<(), RaftInputError> {
    check_vote(&request.vote)?;
    check_log_id(request.last_log_id.as_ref())
}

/// An append's terms (its vote's, and every log id it names) and that its
/// entries follow its `prev_log_id` one by one.
pub fn check_append(request: &AppendEntriesRequest<TypeConfig>) -> Result<(), RaftInputError> {
    check_vote(&request.vote)?;
    check_log_id(request.prev_log_id.as_ref())?;
    check_log_id(request.leader_commit.as_ref())?;
    let mut expected = request.prev_log_id.map_or(0, |prev| prev.index + 1);
    request.entries.iter().try_for_each(|entry| {
        check_term(entry.log_id.leader_id.term)?;
        let index = entry.log_id.index;
        if index != expected {
            return Err(RaftInputError::EntriesNotConsecutive { index, expected });
        }
        expected = index + 1;
        Ok(())
    })
}

/// What each shard has received of the snapshot it is being sent.
#[derive(Debug)]
pub struct SnapshotChunks {
    max_snapshot_bytes: u64,
    receiving: HashMap<ShardId, Receiving>,
}

#[derive(Debug)]
struct Receiving {
    snapshot_id: String,
    received: u64,
    /// Its last chunk came: only resends of what was received are taken
    /// (the answer to the last chunk may have been lost).
    done: bool,
    /// The bytes received so far, until the last chunk came.
    image: Vec<u8>,
}

impl SnapshotChunks {
    /// No snapshot may grow past `max_snapshot_bytes`.
    pub fn new(max_snapshot_bytes: u64) -> Self {
        Self {
            max_snapshot_bytes,
            receiving: HashMap::new(),
        }
    }

    /// Checks a chunk for `shard` and records it as received: openraft may
    /// then write it. A chunk openraft refuses is simply sent again. The
    /// chunk that completes a snapshot is taken only if `check_image` takes
    /// the whole image; otherwise the snapshot is forgotten, and its sender
    /// must start again.
    pub fn admit(
        &mut self,
        shard: ShardId,
        chunk: &InstallSnapshotRequest<TypeConfig>,
        check_image: impl FnOnce(&[u8]) -> Result<(), String>,
    ) -> Result<(), RaftInputError> {
        check_vote(&chunk.vote)?;
        check_log_id(chunk.meta.last_log_id.as_ref())?;
        let snapshot_id = &chunk.meta.snapshot_id;
        let (received, done) = match self.receiving.get(&shard) {
            Some(receiving) if &receiving.snapshot_id == snapshot_id => {
                (receiving.received, receiving.done)
            }
            _ => (0, false),
        };
        let end = chunk.offset.saturating_add(chunk.data.len() as u64);
        if chunk.offset > received || (done && end > received) {
            return Err(RaftInputError::ChunkOutOfPlace {
                snapshot_id: snapshot_id.clone(),
                offset: chunk.offset,
                received,
            });
        }
        if end > self.max_snapshot_bytes {
            return Err(RaftInputError::SnapshotTooLarge {
                snapshot_id: snapshot_id.clone(),
                bytes: end,
                max: self.max_snapshot_bytes,
            });
        }
        let receiving = self.receiving.entry(shard).or_insert_with(|| Receiving {
            snapshot_id: snapshot_id.clone(),
            received: 0,
            done: false,
            image: Vec::new(),
        });
        if &receiving.snapshot_id != snapshot_id {
            *receiving = Receiving {
                snapshot_id: snapshot_id.clone(),
                received: 0,
                done: false,
                image: Vec::new(),
            };
        }
        if !done && end > received {
            let new_from = (received - chunk.offset) as usize;
            receiving.image.extend_from_slice(&chunk.data[new_from..]);
        }
        receiving.received = received.max(end);
        if chunk.done && !done {
            let image = std::mem::take(&mut receiving.image);
            if let Err(why) = check_image(&image) {
                self.receiving.remove(&shard);
                return Err(RaftInputError::BadImage {
                    snapshot_id: snapshot_id.clone(),
                    why,
                });
            }
            receiving.done = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, SnapshotMeta};

    use super::*;

    fn vote(term: u64) -> Vote<NodeId> {
        Vote::new(term, 1)
    }

    fn chunk(
        snapshot_id: &str,
        offset: u64,
        len: usize,
        done: bool,
    ) -> InstallSnapshotRequest<TypeConfig> {
        InstallSnapshotRequest {
            vote: vote(3),
            meta: SnapshotMeta {
                snapshot_id: snapshot_id.to_owned(),
                ..SnapshotMeta::default()
            },
            offset,
            data: vec![0; len],
            done,
        }
    }

    /// An image check that takes any image.
    fn any_image(_: &[u8]) -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn vote_near_the_end_of_the_terms_would_stop_every_later_election() {
        let forged = VoteRequest::new(vote(u64::MAX - 1), None);
        assert_eq!(
            check_vote_request(&forged),
            Err(RaftInputError::TermTooHigh { term: u64::MAX - 1 })
        );
        assert_eq!(
            check_vote_request(&VoteRequest::new(vote(MAX_TERM), None)),
            Ok(())
        );
        let old_log = Some(LogId::new(CommittedLeaderId::new(u64::MAX, 1), 7));
        assert!(check_vote_request(&VoteRequest::new(vote(5), old_log)).is_err());
    }

    #[test]
    fn append_naming_an_overflowing_term_anywhere_is_refused() {
        let append = |prev: Option<LogId<NodeId>>, commit| AppendEntriesRequest::<TypeConfig> {
            vote: vote(4),
            prev_log_id: prev,
            entries: Vec::new(),
            leader_commit: commit,
        };
        let forged = Some(LogId::new(CommittedLeaderId::new(MAX_TERM + 1, 1), 9));
        let fine = Some(LogId::new(CommittedLeaderId::new(4, 1), 9));
        assert_eq!(check_append(&append(fine, fine)), Ok(()));
        assert!(check_append(&append(forged, fine)).is_err());
        assert!(check_append(&append(fine, forged)).is_err());
    }

    #[test]
    fn append_whose_entries_skip_past_its_prev_log_id_would_leave_a_hole() {
        let at = |index| LogId::new(CommittedLeaderId::new(5, 3), index);
        let append = |prev: Option<u64>, indexes: &[u64]| AppendEntriesRequest::<TypeConfig> {
            vote: vote(5),
            prev_log_id: prev.map(at),
            entries: indexes
                .iter()
                .map(|&index| openraft::Entry {
                    log_id: at(index),
                    payload: openraft::EntryPayload::Blank,
                })
                .collect(),
            leader_commit: None,
        };
        assert_eq!(check_append(&append(Some(4268), &[4269, 4270])), Ok(()));
        assert_eq!(check_append(&append(None, &[0, 1])), Ok(()));
        assert_eq!(check_append(&append(Some(9), &[])), Ok(()));
        assert_eq!(
            check_append(&append(Some(4268), &[4400, 4401])),
            Err(RaftInputError::EntriesNotConsecutive {
                index: 4400,
                expected: 4269
            })
        );
        assert!(check_append(&append(Some(1), &[2, 4])).is_err());
        assert!(check_append(&append(None, &[3])).is_err());
    }

    #[test]
    fn chunk_far_past_the_received_bytes_would_allocate_its_offset() {
        let mut chunks = SnapshotChunks::new(1 << 30);
        assert!(matches!(
            chunks.admit(0, &chunk("s1", 1 << 40, 10, false), any_image),
            Err(RaftInputError::ChunkOutOfPlace { received: 0, .. })
        ));
        chunks
            .admit(0, &chunk("s1", 0, 100, false), any_image)
            .unwrap();
        assert!(
            chunks
                .admit(0, &chunk("s1", 101, 10, false), any_image)
                .is_err()
        );
        chunks
            .admit(0, &chunk("s1", 100, 100, false), any_image)
            .unwrap();
    }

    #[test]
    fn resent_chunk_is_taken_again() {
        let mut chunks = SnapshotChunks::new(1 << 30);
        chunks
            .admit(0, &chunk("s1", 0, 100, false), any_image)
            .unwrap();
        chunks
            .admit(0, &chunk("s1", 100, 100, false), any_image)
            .unwrap();
        chunks
            .admit(0, &chunk("s1", 100, 100, false), any_image)
            .unwrap();
        chunks
            .admit(0, &chunk("s1", 200, 50, true), any_image)
            .unwrap();
        chunks
            .admit(0, &chunk("s1", 200, 50, true), any_image)
            .unwrap();
        assert!(
            chunks
                .admit(0, &chunk("s1", 250, 10, false), any_image)
                .is_err(),
            "a finished snapshot takes no more chunks"
        );
    }

    #[test]
    fn new_snapshot_starts_at_zero_and_shards_are_apart() {
        let mut chunks = SnapshotChunks::new(1 << 30);
        chunks
            .admit(0, &chunk("s1", 0, 100, false), any_image)
            .unwrap();
        chunks
            .admit(1, &chunk("t1", 0, 10, false), any_image)
            .unwrap();
        assert!(
            chunks
                .admit(0, &chunk("s2", 100, 10, false), any_image)
                .is_err()
        );
        chunks
            .admit(0, &chunk("s2", 0, 10, false), any_image)
            .unwrap();
        chunks
            .admit(1, &chunk("t1", 10, 10, false), any_image)
            .unwrap();
    }

    #[test]
    fn chunks_growing_a_snapshot_past_the_cap_are_refused() {
        let mut chunks = SnapshotChunks::new(150);
        chunks
            .admit(0, &chunk("s1", 0, 100, false), any_image)
            .unwrap();
        assert!(matches!(
            chunks.admit(0, &chunk("s1", 100, 100, false), any_image),
            Err(RaftInputError::SnapshotTooLarge {
                bytes: 200,
                max: 150,
                ..
            })
        ));
        chunks
            .admit(0, &chunk("s1", 100, 50, true), any_image)
            .unwrap();
    }

    #[test]
    fn bad_image_stops_the_replica_that_installs_it() {
        let mut chunks = SnapshotChunks::new(1 << 20);
        chunks
            .admit(0, &chunk("s1", 0, 100, false), any_image)
            .unwrap();
        let mut seen = Vec::new();
        let refused = chunks.admit(0, &chunk("s1", 50, 80, true), |image| {
            seen = image.to_vec();
            Err("fails its checksum".into())
        });
        assert_eq!(seen.len(), 130, "the whole image, resent bytes once");
        assert!(
            matches!(refused, Err(RaftInputError::BadImage { ref why, .. }) if why.contains("checksum")),
            "{refused:?}"
        );
        assert!(
            chunks
                .admit(0, &chunk("s1", 100, 30, true), any_image)
                .is_err(),
            "a refused snapshot is sent again from its start"
        );
        chunks
            .admit(0, &chunk("s1", 0, 130, true), any_image)
            .unwrap();
    }
}
