//! What a data dir pins at its first use and refuses to change later: the
//! shard count and the cluster's placement. Each claim is flushed before
//! the node acts on it.

use std::io;

use super::{Database, OpenError};

/// Key in sled's default tree that pins the shard count of a data dir.
const SHARD_COUNT_KEY: &[u8] = b"shard_count";
/// Key in sled's default tree that pins the placement of a data dir.
const PLACEMENT_KEY: &[u8] = b"placement";

impl Database {
    /// Records the shard count on first use and refuses a different one later:
    /// producers are placed by it, so changing it would hide their queues.
    pub fn claim_shard_count(&self, shard_count: u32) -> Result<(), OpenError> {
        let Some(stored) = self.claim(SHARD_COUNT_KEY, &shard_count.to_be_bytes())? else {
            return Ok(());
        };
        let found = <[u8; 4]>::try_from(stored.as_ref())
            .map(u32::from_be_bytes)
            .unwrap_or(0);
        Err(OpenError::ShardCountMismatch {
            path: self.dir.clone(),
            found,
            requested: shard_count,
        })
    }

    /// The shard count this data dir was created with, if it records one
    /// (a new data dir does not until [`Database::claim_shard_count`]).
    pub fn recorded_shard_count(&self) -> Result<Option<u32>, OpenError> {
        let stored = self.db.get(SHARD_COUNT_KEY).map_err(|e| OpenError::Io {
            path: self.dir.clone(),
            source: io::Error::other(e),
        })?;
        Ok(stored.and_then(|bytes| {
            <[u8; 4]>::try_from(bytes.as_ref())
                .ok()
                .map(u32::from_be_bytes)
        }))
    }

    /// Records the cluster's placement (a description of its member ids and
    /// replication factor) on first use and refuses a different one later:
    /// replica sets follow from it, so a changed one could found a shard
    /// anew next to its old replicas, or leave a group with members that
    /// never hear from it.
    pub fn claim_placement(&self, placement: &str) -> Result<(), OpenError> {
        let Some(stored) = self.claim(PLACEMENT_KEY, placement.as_bytes())? else {
            return Ok(());
        };
        Err(OpenError::PlacementMismatch {
            path: self.dir.clone(),
            found: String::from_utf8_lossy(&stored).into_owned(),
            requested: placement.to_owned(),
        })
    }

    /// Stores `value` under `key` unless a value is stored there already;
    /// the stored value when it differs from `value`.
    fn claim(&self, key: &[u8], value: &[u8]) -> Result<Option<sled::IVec>, OpenError> {
        let stored = self
            .db
            .compare_and_swap(key, None as Option<&[u8]>, Some(value))
            .map_err(|e| OpenError::Io {
                path: self.dir.clone(),
                source: io::Error::other(e),
            })?;
        match stored {
            Ok(()) => {
                // A claim is durable before the node acts on it: a crash
                // must not let the next start claim anew.
                self.db.flush().map_err(|e| OpenError::Io {
                    path: self.dir.clone(),
                    source: io::Error::other(e),
                })?;
                Ok(None)
            }
            Err(conflict) => Ok(conflict.current.filter(|current| current != value)),
        }
    }
}
