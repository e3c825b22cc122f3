//! The raft type configuration of every shard and the commands its log carries.
//!
//! One raft entry is one [`Command`]: a batch of operations that the shard
//! leader folded together (many produces and acks to the same shard become one
//! entry, so one flush commits all of them). Each operation gets its own
//! [`OpReply`], in order.

use std::collections::BTreeMap;
use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::policy::Policy;
use crate::sink_spec::{SetSink, SinkSpec};

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

impl Command {
    /// Every message payload the command carries, in the one order the log
    /// and the state machine both use: ops in order, each op's messages in
    /// order.
    pub fn payloads_mut(&mut self) -> impl Iterator<Item = &mut Vec<u8>> {
        self.ops
            .iter_mut()
            .filter_map(|op| match op {
                Op::Enqueue(enqueue) => Some(enqueue),
                Op::EnqueueDelayed(delayed) => Some(&mut delayed.enqueue),
                _ => None,
            })
            .flat_map(|enqueue| enqueue.messages.iter_mut().map(|m| &mut m.payload))
    }
}

/// One change to a shard's queues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Append messages to one producer's queue.
    Enqueue(Enqueue),
    /// Delete acknowledged messages.
    Remove(Vec<MessageRef>),
    /// Store a queue's default policy (`producer` None) or a producer's override.
    SetPolicy(SetPolicy),
    /// Take messages out of their producer's queue without delivering them
    /// (expired, out of attempts, or nacked without requeue), into the
    /// dead letters or not at all.
    Discard(Discard),
    /// Put dead letters back at the end of their producer's queue as new messages.
    ReplayDeadLetters(DeadLetterSelection),
    /// Delete dead letters.
    DeleteDeadLetters(DeadLetterSelection),
    /// Append messages that are not to be delivered before a time.
    EnqueueDelayed(DelayedEnqueue),
    /// Delete the counters of producers that have stayed idle.
    ForgetIdle(Vec<IdleProducer>),
    /// Store or remove a queue's sink.
    SetSink(SetSink),
}

/// A producer seen idle: nothing stored, no policy override, and its tail
/// unchanged since the leader first saw it so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleProducer {
    /// Its queue.
    pub queue: String,
    /// The producer.
    pub producer: String,
    /// Its tail when seen idle: if it produced since, it is kept.
    pub tail: u64,
}

/// Messages of one producer, held back until `deliver_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelayedEnqueue {
    /// The messages, as a plain enqueue.
    pub enqueue: Enqueue,
    /// Not delivered before this, ms since the Unix epoch.
    pub deliver_at_ms: i64,
}

/// A policy change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetPolicy {
    /// The queue.
    pub queue: String,
    /// The producer whose override this is; None for the queue's defaults.
    pub producer: Option<String>,
    /// The settings.
    pub policy: Policy,
    /// True: `policy` replaces what is stored. False: its set fields are
    /// written over what is stored and the others keep their value.
    pub replace: bool,
}

/// Messages leaving their queue undelivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discard {
    /// When the leader decided it, ms since the Unix epoch.
    pub at_ms: i64,
    /// The messages.
    pub messages: Vec<Discarded>,
}

/// One message leaving its queue undelivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discarded {
    /// The message.
    pub message: MessageRef,
    /// Why.
    pub reason: DeadLetterReason,
    /// Deliveries it had.
    pub attempts: u32,
    /// Keep it as a dead letter (else it is deleted).
    pub dead_letter: bool,
}

/// Why a message became a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeadLetterReason {
    /// Its producer went over `max_messages` or `max_bytes` with `dead_letter_oldest`.
    Overflow,
    /// Its TTL passed before it was delivered.
    Expired,
    /// It was delivered `max_attempts` times without an ack.
    MaxAttempts,
    /// A consumer nacked it without requeue.
    Rejected,
    /// The queue's sink rejected it.
    SinkRejected,
}

impl DeadLetterReason {
    /// The name used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Overflow => "overflow",
            Self::Expired => "ttl",
            Self::MaxAttempts => "max_attempts",
            Self::Rejected => "nacked",
            Self::SinkRejected => "sink",
        }
    }
}

/// Dead letters of one queue in one shard, by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterSelection {
    /// The queue.
    pub queue: String,
    /// Dead-letter ids within the shard.
    pub ids: Vec<u64>,
    /// When the leader proposed it, ms since the Unix epoch (a replay's commit time).
    pub at_ms: i64,
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
    /// How many of the named messages (or dead letters) existed and were deleted.
    Removed {
        /// Messages that were still stored.
        count: u64,
    },
    /// The produce would take the producer past its limits and its overflow
    /// action is `reject`: nothing was stored.
    OverLimit {
        /// Messages the producer has stored.
        messages: u64,
        /// Bytes the producer has stored.
        bytes: u64,
        /// Bytes the refused messages would have taken.
        batch_bytes: u64,
        /// The limits in force.
        policy: Policy,
    },
    /// The policy as stored after the change.
    PolicySet {
        /// The stored settings.
        policy: Policy,
    },
    /// Dead letters put back into their producers' queues.
    Replayed {
        /// Dead letters that existed and were replayed.
        count: u64,
    },
    /// The queue's sink as stored after the change (None: it has none).
    SinkSet {
        /// The stored sink.
        sink: Option<SinkSpec>,
        /// Whether the queue had a sink before.
        had_one: bool,
    },
}
