//! The `floret.v1.Admin` service: cluster status and queue statistics.
//!
//! Queue statistics combine the durable per-producer counters of every shard
//! (read from the state machines, off the async runtime) with the
//! dispatcher's in-memory delivery counters.
//!
//! IMPLEMENTATION CAVEATS
//! - Statistics list every producer with stored state; there is no paging yet.

use std::collections::BTreeMap;
use std::sync::Arc;

use floret_cluster::Shards;
use floret_proto::v1;
use floret_store::ProducerEntry;
use tonic::{Request, Response, Status};

use super::{now_unix_ms, status};
use crate::dispatcher::DispatcherHandle;
use crate::request;

/// Serves inspection of one node.
pub struct AdminService {
    shards: Arc<Shards>,
    dispatcher: DispatcherHandle,
    address: String,
}

impl AdminService {
    /// A service over the node's shards and dispatcher; `address` is what clients dial.
    pub fn new(shards: Arc<Shards>, dispatcher: DispatcherHandle, address: String) -> Self {
        Self {
            shards,
            dispatcher,
            address,
        }
    }
}

#[tonic::async_trait]
impl v1::admin_server::Admin for AdminService {
    async fn cluster_status(
        &self,
        _request: Request<v1::ClusterStatusRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        let shards = self
            .shards
            .groups()
            .iter()
            .map(|group| {
                let metrics = group.raft.metrics().borrow().clone();
                v1::ShardStatus {
                    shard_id: group.id,
                    leader_id: metrics.current_leader.unwrap_or(0),
                    term: metrics.current_term,
                    applied_index: metrics.last_applied.map(|id| id.index).unwrap_or(0),
                    last_log_index: metrics.last_log_index.unwrap_or(0),
                    voters: metrics.membership_config.membership().voter_ids().collect(),
                }
            })
            .collect();
        Ok(Response::new(v1::ClusterStatusResponse {
            node_id: self.shards.node_id(),
            nodes: vec![v1::NodeStatus {
                node_id: self.shards.node_id(),
                address: self.address.clone(),
            }],
            shards,
        }))
    }

    async fn queue_stats(
        &self,
        request: Request<v1::QueueStatsRequest>,
    ) -> Result<Response<v1::QueueStatsResponse>, Status> {
        let wanted = request.into_inner().queue;
        let wanted = (!wanted.is_empty())
            .then(|| request::queue_name(&wanted))
            .transpose()?;
        let shards = self.shards.clone();
        let filter = wanted.clone();
        let producers =
            tokio::task::spawn_blocking(move || durable_producers(&shards, filter.as_deref()))
                .await
                .map_err(|e| Status::internal(format!("stats task failed: {e}")))??;
        let activity = self
            .dispatcher
            .activity()
            .await
            .map_err(status::from_stopped)?;
        let mut queues: BTreeMap<String, v1::QueueStat> = BTreeMap::new();
        for (name, activity) in &activity {
            if wanted.as_ref().is_none_or(|w| w == name) {
                let stat = queues.entry(name.clone()).or_default();
                stat.queue = name.clone();
                stat.in_flight = activity.in_flight;
                stat.delivered = activity.delivered;
                stat.redelivered = activity.redelivered;
                stat.consumers = activity.consumers;
            }
        }
        for (entry, oldest_age_ms) in producers {
            let in_flight = activity
                .get(&entry.queue)
                .and_then(|a| a.in_flight_by_producer.get(&entry.producer))
                .copied()
                .unwrap_or(0);
            let stat = queues.entry(entry.queue.clone()).or_default();
            stat.queue = entry.queue.clone();
            stat.backlog_messages += entry.record.messages;
            stat.backlog_bytes += entry.record.bytes;
            stat.acked += entry.record.acked;
            stat.oldest_message_age_ms = stat.oldest_message_age_ms.max(oldest_age_ms);
            stat.producers.push(v1::ProducerStat {
                producer_id: entry.producer,
                backlog_messages: entry.record.messages,
                backlog_bytes: entry.record.bytes,
                in_flight,
                delivered: entry.record.acked + in_flight,
                acked: entry.record.acked,
                oldest_message_age_ms: oldest_age_ms,
            });
        }
        Ok(Response::new(v1::QueueStatsResponse {
            queues: queues.into_values().collect(),
        }))
    }
}

/// Every producer of every shard (of one queue, if given), with its oldest message's age.
fn durable_producers(
    shards: &Shards,
    queue: Option<&str>,
) -> Result<Vec<(ProducerEntry, u64)>, Status> {
    let now_ms = now_unix_ms();
    let mut producers = Vec::new();
    for group in shards.groups() {
        for entry in group.reader.producers() {
            let entry = entry
                .map_err(|e| Status::internal(format!("cannot read shard {}: {e}", group.id)))?;
            if queue.is_some_and(|q| q != entry.queue) {
                continue;
            }
            let oldest_age_ms = if entry.record.messages == 0 {
                0
            } else {
                group
                    .reader
                    .oldest_message(&entry.queue, &entry.producer, entry.record.head)
                    .map_err(|e| Status::internal(format!("cannot read shard {}: {e}", group.id)))?
                    .map(|(_, message)| (now_ms - message.enqueued_at_ms).max(0) as u64)
                    .unwrap_or(0)
            };
            producers.push((entry, oldest_age_ms));
        }
    }
    Ok(producers)
}
