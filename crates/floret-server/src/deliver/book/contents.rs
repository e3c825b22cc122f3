//! What the dispatch book reads of the shards' replicated state, and nothing
//! more: messages, delivery times, policies and producer counters.
//!
//! The node implements it over its shards' `ShardReader`s (in
//! `deliver/actor.rs`); the book's tests implement it over maps. Reads are
//! synchronous and local (sled), which is why the book may call them inside
//! one decision.

use std::ops::Range;

use floret_store::policy::{Policy, PolicyTable};
use floret_store::records::StoredMessage;
use floret_store::{ShardId, StorageError};

/// A shard's state could not be read: the store's error, as its text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReadError(pub String);

impl From<StorageError> for ReadError {
    fn from(error: StorageError) -> Self {
        Self(error.to_string())
    }
}

/// One producer of a shard with messages stored, as a rebuild loads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBacklog {
    /// Its queue.
    pub queue: String,
    /// The producer.
    pub producer: String,
    /// Its oldest live message up to its tail.
    pub sequences: Range<u64>,
}

/// The replicated state of the shards this node holds, as the book reads it.
pub trait ShardContents {
    /// Whether this node holds a replica of `shard`.
    fn holds(&self, shard: ShardId) -> bool;

    /// How many shards the cluster has (ids are `0..shard_count`).
    fn shard_count(&self) -> usize;

    /// One stored message; None once it was removed.
    fn message(
        &self,
        shard: ShardId,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Result<Option<StoredMessage>, ReadError>;

    /// When a delayed message may be delivered, ms since the Unix epoch.
    fn deliver_at(&self, shard: ShardId, queue: &str, producer: &str, sequence: u64)
    -> Option<i64>;

    /// The policy in force for `producer` of `queue`.
    fn policy(&self, shard: ShardId, queue: &str, producer: &str) -> Policy;

    /// The policy stored for `queue` (`producer` None) or one producer, without inheritance.
    fn stored_policy(&self, shard: ShardId, queue: &str, producer: Option<&str>) -> Policy;

    /// Every policy of the shard.
    fn policies(&self, shard: ShardId) -> PolicyTable;

    /// The producer's next unused sequence, if it ever produced here.
    fn producer_tail(
        &self,
        shard: ShardId,
        queue: &str,
        producer: &str,
    ) -> Result<Option<u64>, ReadError>;

    /// Every producer of the shard with messages stored.
    fn backlogs(&self, shard: ShardId) -> Result<Vec<StoredBacklog>, ReadError>;

    /// Every producer of the shard, as `(queue, producer)`, stored messages or not.
    fn producers(&self, shard: ShardId) -> Vec<(String, String)>;
}
