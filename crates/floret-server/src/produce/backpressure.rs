//! Fair backpressure at node level, the reading side: sums the bytes and
//! producers of every shard replica this node holds, remembers whether the
//! node is throttling, and reads the producer's own bytes only while it is;
//! and the data dir's free space ([`DiskRoom`]), below
//! `storage.min_free_bytes` of which every produce is refused. The
//! decisions are `admission.rs`'s.
//!
//! IMPLEMENTATION CAVEATS
//! - Only stored bytes count: the backlog lives on disk, so memory is not
//!   watched.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use floret_cluster::Shards;
use floret_proto::v1;
use floret_store::ShardReader;

use super::admission::{self, NodeRoom};
use crate::config::BackpressureConfig;
use crate::disk_room::DiskRoom;
use crate::error::RequestError;

/// Decides which produces a node short of room refuses.
pub struct Backpressure {
    config: BackpressureConfig,
    shards: Arc<Shards>,
    throttling: AtomicBool,
    disk: DiskRoom,
    min_free_bytes: u64,
}

impl Backpressure {
    /// Backpressure over the replicas `shards` holds, refusing everything
    /// while `disk` has less than `min_free_bytes` free.
    pub fn new(
        config: BackpressureConfig,
        shards: Arc<Shards>,
        disk: DiskRoom,
        min_free_bytes: u64,
    ) -> Self {
        Self {
            config,
            shards,
            throttling: AtomicBool::new(false),
            disk,
            min_free_bytes,
        }
    }

    /// Refuses a produce of `messages` from `producer` (of `weight`) when
    /// the node is throttling and the producer already holds its share. Off
    /// the watermark it costs a sum of the shards' counters, nothing per message.
    pub fn admit(
        &self,
        reader: &ShardReader,
        queue: &str,
        producer: &str,
        weight: u32,
        messages: &[v1::Message],
    ) -> Result<(), RequestError> {
        if let Err(refused) = admission::check_disk(self.disk.free_bytes(), self.min_free_bytes) {
            metrics::counter!("floret_produce_refused_disk_total").increment(1);
            return Err(refused);
        }
        let room = self.room();
        let throttled = self.throttling.load(Ordering::Relaxed);
        let throttling = admission::throttles(&self.config, room, throttled);
        if self.throttling.swap(throttling, Ordering::Relaxed) != throttling {
            tracing::info!(
                stored = room.stored_bytes,
                high = self.config.high_watermark_bytes,
                low = self.config.low_watermark_bytes,
                throttling,
                "node backpressure changed"
            );
        }
        if !throttling {
            return Ok(());
        }
        let held = reader
            .producer(queue, producer)
            .map_err(|error| {
                RequestError::unavailable(format!("cannot read the producer: {error}"))
            })?
            .map_or(0, |record| record.bytes);
        let incoming = messages.iter().map(admission::stored_size_estimate).sum();
        let verdict =
            admission::admit_on_full_node(&self.config, room, producer, weight, held, incoming);
        if verdict.is_err() {
            metrics::counter!("floret_produce_backpressured_total").increment(1);
        }
        verdict
    }

    fn room(&self) -> NodeRoom {
        self.shards.groups().fold(
            NodeRoom {
                stored_bytes: 0,
                producers: 0,
            },
            |room, group| {
                let totals = group.reader.totals();
                NodeRoom {
                    stored_bytes: room.stored_bytes + totals.bytes(),
                    producers: room.producers + totals.producers(),
                }
            },
        )
    }
}
