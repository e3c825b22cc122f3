//! A shard's snapshot on disk: the whole state-machine tree at one log id,
//! written to `snapshots/shard-N.snap` (temp file, fsync, rename) so the
//! current snapshot survives restarts and can be sent to a lagging replica.
//!
//! IMPLEMENTATION CAVEATS
//! - The snapshot is one in-memory buffer while it is built, sent or
//!   installed: a backlog of hundreds of MiB costs that much memory for a moment.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::keys;
use crate::records::{decode, encode};
use crate::resting::{self, RestingError};
use crate::shard_tree::ShardTree;
use crate::types::{NodeId, ShardId};
use crate::wal::Wal;

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
    /// Copies every pair of `tree` that replicas share: runs with their
    /// payloads read back from `log` and inline, since a replica that
    /// installs the image has no copy of this node's log; this node's own
    /// segment counts left out.
    pub(crate) fn capture(tree: &ShardTree, log: &Wal) -> Result<Self, CaptureError> {
        let mut pairs = Vec::new();
        for item in tree.iter() {
            let (key, value) = item?;
            if key == keys::PAYLOAD_PINS {
                continue;
            }
            let value = if key.first() == Some(&keys::MESSAGE_TAG) {
                resting::inlined_run(&value, log)?
            } else {
                value.to_vec()
            };
            pairs.push((key.to_vec(), value));
        }
        Ok(Self { pairs })
    }

    /// Encoded form, as sent to replicas.
    pub fn to_bytes(&self) -> Vec<u8> {
        encode(self)
    }

    /// Decodes what [`TreeImage::to_bytes`] produced.
    pub fn from_bytes(bytes: &[u8]) -> io::Result<Self> {
        decode("snapshot", bytes).map_err(io::Error::other)
    }
}

/// Where one shard keeps its current snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    path: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct SnapshotHeader {
    meta: SnapshotMeta,
}

impl SnapshotFile {
    /// The snapshot file of `shard` under `dir`.
    pub fn new(dir: &Path, shard: ShardId) -> Self {
        Self {
            path: dir.join(format!("shard-{shard}.snap")),
        }
    }

    /// Replaces the current snapshot, durably.
    pub fn save(&self, meta: &SnapshotMeta, data: &[u8]) -> io::Result<()> {
        let dir = self.path.parent().expect("snapshot path has a folder");
        fs::create_dir_all(dir)?;
        let header = encode(&SnapshotHeader { meta: meta.clone() });
        let temp = self.path.with_extension("snap.tmp");
        let mut file = File::create(&temp)?;
        file.write_all(&(header.len() as u32).to_be_bytes())?;
        file.write_all(&header)?;
        file.write_all(data)?;
        file.sync_all()?;
        fs::rename(&temp, &self.path)?;
        File::open(dir)?.sync_all()
    }

    /// The current snapshot, if one was saved.
    pub fn load(&self) -> io::Result<Option<(SnapshotMeta, Vec<u8>)>> {
        let bytes = match fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let corrupt = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is truncated", self.path.display()),
            )
        };
        let header_len = bytes.get(..4).ok_or_else(corrupt)?;
        let header_len = u32::from_be_bytes(header_len.try_into().expect("four bytes")) as usize;
        let header = bytes.get(4..4 + header_len).ok_or_else(corrupt)?;
        let header: SnapshotHeader = decode("snapshot header", header).map_err(io::Error::other)?;
        Ok(Some((header.meta, bytes[4 + header_len..].to_vec())))
    }
}
