//! The raft type configuration of every shard and the commands its log carries.
//!
//! One raft entry is one [`Command`]: a batch of operations that the shard
//! leader folded together (many produces and acks to the same shard become one
//! entry, so one flush commits all of them). Each operation gets its own
//! [`OpReply`], in order.

use std::collections::BTreeMap;
use std::io::Cursor;

use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    /// Types of every floret shard's raft group.
    pub TypeConfig:
        D = Command,
        R = CommandReply,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
);

/// Node id of a floret node; also its raft node id in every shard.
pub type NodeId = u64;
/// Index of a shard (one raft group) in `0..shard_count`.
pub type ShardId = u32;
/// A shard's raft handle.
pub type Raft = openraft::Raft<TypeConfig>;
/// A log id of a shard's raft log.
pub type LogId = openraft::LogId<NodeId>;
/// A storage error as openraft expects it.
pub type StorageError = openraft::StorageError<NodeId>;

/// One raft entry's payload: the operations the leader folded into it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// Applied in order, atomically with the rest of the entry.
    pub ops: Vec<Op>,
}

/// One change to a shard's queues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Append messages to one producer's queue.
    Enqueue(Enqueue),
    /// Delete acknowledged messages.
    Remove(Vec<MessageRef>),
}

/// Messages of one producer, as the produce request brought them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enqueue {
    /// Queue the producer writes into.
    pub queue: String,
    /// The tenant inside the queue.
    pub producer: String,
    /// The producer's own increasing batch number, for idempotent retries.
    pub producer_sequence: Option<u64>,
    /// Commit time chosen by the leader, so every replica stores the same value.
    pub enqueued_at_ms: i64,
    /// The messages, in order.
    pub messages: Vec<NewMessage>,
}

/// A message before it has a sequence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewMessage {
    /// Opaque bytes (encoded as one byte string, not byte by byte: the same
    /// bytes in postcard, decoded with one allocation).
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// String headers, sorted so that encodings are deterministic.
    pub headers: BTreeMap<String, String>,
}

/// Names one stored message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MessageRef {
    /// Queue of the message.
    pub queue: String,
    /// Producer of the message.
    pub producer: String,
    /// Sequence the message got at commit.
    pub sequence: u64,
}

/// What applying one entry produced: one reply per op.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandReply {
    /// In the order of [`Command::ops`].
    pub replies: Vec<OpReply>,
}

/// The outcome of one op. Every variant is deterministic: all replicas compute the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpReply {
    /// Messages got sequences `first_sequence..first_sequence + count`.
    Enqueued {
        /// Sequence of the first message of the batch.
        first_sequence: u64,
        /// Number of messages in the batch.
        count: u64,
        /// The batch was applied before (same producer sequence): these are the original sequences.
        duplicate: bool,
    },
    /// The producer sequence is older than the last one applied; its sequences are not kept.
    StaleProducerSequence {
        /// The last producer sequence applied for that producer.
        last: u64,
    },
    /// How many of the named messages existed and were deleted.
    Removed {
        /// Messages that were still stored.
        count: u64,
    },
}
