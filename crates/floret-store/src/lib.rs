//! floret's storage: the per-shard openraft log store and queue state
//! machine on one sled database per node.
//!
//! A node opens its data dir with [`Database::open`], then asks it for each
//! shard's [`LogStore`] and [`StateMachine`]. Every shard's log lives in one
//! write-ahead log ([`wal`]) whose appends the node's single [`Flusher`]
//! thread makes durable with one `fdatasync` for all shards (group commit);
//! the state machines live in sled, keep each producer's messages in runs
//! (the messages of one produce call under one key, see `runs.rs`) keyed by
//! `(queue, producer, first sequence)` and only counters per producer, so
//! memory never holds the backlog. A message's payload is written once: a
//! run points at it in the raft log (`resting.rs`), which keeps the
//! segments stored messages point into.
//!
//! IMPLEMENTATION CAVEATS
//! - Snapshots are whole-tree images held in memory while built or installed.
//! - Delivery attempts are not replicated: they live in the leader's scheduler.

#![allow(
    clippy::result_large_err,
    reason = "openraft's storage traits return its StorageError; helpers feeding them return it too"
)]

mod backlog_totals;
mod blocking;
mod change_set;
mod database;
#[cfg(test)]
mod decode_properties;
mod durability;
pub mod failpoints;
mod flusher;
pub mod keys;
mod log_store;
pub mod policy;
mod purger;
mod reader;
pub mod records;
mod resting;
mod runs;
mod shard_tree;
mod sink_spec;
mod snapshot;
mod state_machine;
mod storage_error;
mod types;
pub mod wal;

pub use backlog_totals::{BacklogTotals, GroupTotals, PRODUCER_GROUP_SEPARATOR, producer_group};
pub use blocking::may_block;
pub use database::{
    DEFAULT_CACHE_BYTES, Database, DiskUsage, FORMAT_VERSION, LogHealth, MARKER_FILE, OpenError,
    ShardStorage, StoreOptions, StoreUsage,
};
pub use flusher::{FlushWaiter, Flusher};
pub use log_store::LogStore;
pub use reader::{ProducerEntry, ShardReader};
pub use resting::{LoggedPayload, RestingError};
pub use sink_spec::{SetSink, SinkSpec, SinkTarget};
pub use snapshot::{CaptureError, SnapshotFile, SnapshotMeta, TreeImage, check_image};
pub use state_machine::{AppliedEvent, AppliedListener, SnapshotBuilder, StateMachine};
pub use types::*;
