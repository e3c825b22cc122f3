//! Fair backpressure at node level, the reading side: sums the bytes and
//! producers of every shard replica this node holds, remembers whether the
//! node is throttling, and reads the producer's own bytes (and on a node
//! with tenants, what its tenant holds) only while it is; and the data
//! dir's free space ([`DiskRoom`]), below `storage.min_free_bytes` of which
//! every produce is refused. The decisions are `admission.rs`'s.
//!
//! IMPLEMENTATION CAVEATS
//! - Only stored bytes count: the backlog lives on disk, so memory is not
//!   watched.
//! - What each tenant holds is summed over every shard replica at most
//!   every [`TENANT_HOLDINGS_REFRESH`] while the node throttles, so a
//!   tenant's own produces of the last moment are not in it yet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floret_cluster::Shards;
use floret_proto::v1;
use floret_store::ShardReader;

use super::admission::{self, Claimant, NodeRoom, TenantHolding};
use crate::config::BackpressureConfig;
use crate::disk_room::DiskRoom;
use crate::error::RequestError;
use crate::policy;

/// How old the sums of what each tenant holds may be while a node throttles.
pub const TENANT_HOLDINGS_REFRESH: Duration = Duration::from_millis(100);

/// Decides which produces a node short of room refuses.
pub struct Backpressure {
    config: BackpressureConfig,
    shards: Arc<Shards>,
    throttling: AtomicBool,
    disk: DiskRoom,
    min_free_bytes: u64,
    /// What each tenant holds on this node, and when it was summed.
    tenant_holdings: Mutex<Option<(Instant, Arc<TenantHoldings>)>>,
}

/// Bytes and producers with stored messages of every tenant, over every
/// queue of every shard replica on this node.
#[derive(Debug, Default)]
struct TenantHoldings {
    by_tenant: HashMap<String, (u64, u64)>,
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
            tenant_holdings: Mutex::new(None),
        }
    }

    /// Refuses a produce of `messages` from `producer` (of `weight`, and of
    /// `tenant` on a node with tenants) when the node is throttling and the
    /// producer or its tenant already holds its share. Off the watermark it
    /// costs a sum of the shards' counters, nothing per message.
    pub fn admit(
        &self,
        reader: &ShardReader,
        queue: &str,
        (producer, weight): (&str, u32),
        tenant: Option<&str>,
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
        let holdings = tenant.map(|tenant| (tenant, self.tenant_holdings(Instant::now())));
        let claimant = Claimant {
            producer,
            weight,
            held,
            incoming,
            tenant: holdings.as_ref().map(|(tenant, holdings)| {
                let (bytes, producers) =
                    holdings.by_tenant.get(*tenant).copied().unwrap_or_default();
                TenantHolding {
                    tenant,
                    weight: reader
                        .stored_policy(queue, Some(&policy::tenant_policy_key(tenant)))
                        .weight
                        .unwrap_or(1),
                    bytes,
                    producers,
                    tenants: holdings.by_tenant.len() as u64,
                }
            }),
        };
        let verdict = admission::admit_on_full_node(&self.config, room, claimant);
        if verdict.is_err() {
            crate::telemetry::count_for_queue("floret_produce_backpressured_total", queue, 1);
        }
        verdict
    }

    /// What each tenant holds, summed again if the last sum is older than
    /// [`TENANT_HOLDINGS_REFRESH`] at `now`.
    fn tenant_holdings(&self, now: Instant) -> Arc<TenantHoldings> {
        let mut cached = self.tenant_holdings.lock().expect("tenant holdings lock");
        if let Some((summed_at, holdings)) = cached.as_ref()
            && now.duration_since(*summed_at) < TENANT_HOLDINGS_REFRESH
        {
            return holdings.clone();
        }
        let mut holdings = TenantHoldings::default();
        for group in self.shards.groups() {
            group.reader.totals().for_each_group(|_, tenant, totals| {
                let held = holdings.by_tenant.entry(tenant.to_owned()).or_default();
                held.0 += totals.bytes;
                held.1 += totals.producers;
            });
        }
        let holdings = Arc::new(holdings);
        *cached = Some((now, holdings.clone()));
        holdings
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
