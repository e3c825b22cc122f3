//! Fair backpressure at node level: when the bytes stored on this node pass
//! the high watermark, a produce from a producer that holds more than its
//! fair share of them is refused with RESOURCE_EXHAUSTED and a retry hint;
//! producers under their share keep producing. Throttling stops once the
//! node is back below the low watermark.
//!
//! A producer's fair share is the node's stored bytes divided by the
//! producers holding messages on it, times the producer's weight. The node's
//! figures are the [`floret_store::BacklogTotals`] of every shard replica it
//! holds (its disk); the producer's own comes from its shard's record.
//!
//! IMPLEMENTATION CAVEATS
//! - Every producer over its share is throttled at once, not the one most
//!   over it first.
//! - Shares use the producer's own weight against an unweighted average, so
//!   weights are approximate while producers of different weights flood.
//! - Only stored bytes count: the backlog lives on disk, so memory is not
//!   watched.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use floret_cluster::Shards;
use floret_proto::v1;
use floret_store::ShardReader;
use tonic::Status;

use crate::config::BackpressureConfig;
use crate::policy;

/// Decides which produces a node short of room refuses.
pub struct Backpressure {
    config: BackpressureConfig,
    shards: Arc<Shards>,
    throttling: AtomicBool,
}

impl Backpressure {
    /// Backpressure over the replicas `shards` holds.
    pub fn new(config: BackpressureConfig, shards: Arc<Shards>) -> Self {
        Self {
            config,
            shards,
            throttling: AtomicBool::new(false),
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
    ) -> Result<(), Status> {
        let (stored, producers) = self
            .shards
            .groups()
            .fold((0, 0), |(bytes, producers), group| {
                let totals = group.reader.totals();
                (bytes + totals.bytes(), producers + totals.producers())
            });
        let throttling = if stored >= self.config.high_watermark_bytes {
            true
        } else if stored <= self.config.low_watermark_bytes {
            false
        } else {
            self.throttling.load(Ordering::Relaxed)
        };
        if self.throttling.swap(throttling, Ordering::Relaxed) != throttling {
            tracing::info!(
                stored,
                high = self.config.high_watermark_bytes,
                low = self.config.low_watermark_bytes,
                throttling,
                "node backpressure changed"
            );
        }
        if !throttling {
            return Ok(());
        }
        let share = stored / producers.max(1) * u64::from(weight.max(1));
        let held = reader
            .producer(queue, producer)
            .map_err(|error| Status::unavailable(format!("cannot read the producer: {error}")))?
            .map_or(0, |record| record.bytes);
        let incoming: u64 = messages.iter().map(stored_size_estimate).sum();
        if held + incoming <= share {
            return Ok(());
        }
        metrics::counter!("floret_produce_backpressured_total").increment(1);
        Err(policy::exhausted(
            format!(
                "this node stores {stored} bytes, over its high watermark of {}; producer {producer:?} holds {held} bytes, more than its fair share of {share}: nothing was stored, retry later (producers under their share are still accepted)",
                self.config.high_watermark_bytes
            ),
            Duration::from_millis(self.config.retry_after_ms),
        ))
    }
}

/// About the bytes a message takes once stored (payload, headers, timestamp).
fn stored_size_estimate(message: &v1::Message) -> u64 {
    let headers: usize = message
        .headers
        .iter()
        .map(|(key, value)| key.len() + value.len() + 2)
        .sum();
    (message.payload.len() + headers + 12) as u64
}
