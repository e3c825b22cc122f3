//! Queue statistics: this node's own figures (durable counters of every
//! shard it holds, its dispatcher's delivery and fairness figures) and
//! every node's merged, with Jain's index over the merged producers.

use std::collections::BTreeMap;

use floret_cluster::Shards;
use floret_proto::v1;
use floret_sched::jain_index;
use floret_store::ProducerEntry;
use tonic::Status;

use super::AdminService;
use crate::deliver::fairness::WINDOW_SECONDS;
use crate::error::RequestError;
use crate::service::now_unix_ms;

impl AdminService {
    /// This node's own figures: durable counters of every shard it holds
    /// (marked `led` where it leads the producer's shard) and its
    /// dispatcher's delivery and fairness figures.
    pub(super) async fn local_stats(
        &self,
        wanted: Option<String>,
    ) -> Result<v1::QueueStatsResponse, Status> {
        let shards = self.shards.clone();
        let filter = wanted.clone();
        let producers =
            tokio::task::spawn_blocking(move || durable_producers(&shards, filter.as_deref()))
                .await
                .map_err(|e| {
                    Status::from(RequestError::Internal(format!("stats task failed: {e}")))
                })??;
        let activity = self.dispatcher.activity(true).await.map_err(Status::from)?;
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
            let queue_activity = activity.get(&entry.queue);
            let in_flight = queue_activity
                .and_then(|a| a.in_flight_by_producer.get(&entry.producer))
                .copied()
                .unwrap_or(0);
            let scheduling = queue_activity
                .and_then(|a| a.producers.get(&entry.producer))
                .cloned()
                .unwrap_or_default();
            let led = self.shards.leads(
                self.shards
                    .placement()
                    .shard_of(&entry.queue, &entry.producer),
            );
            let stat = queues.entry(entry.queue.clone()).or_default();
            stat.queue = entry.queue.clone();
            stat.producers.push(v1::ProducerStat {
                producer_id: entry.producer,
                backlog_messages: entry.record.messages,
                backlog_bytes: entry.record.bytes,
                in_flight,
                delivered: entry.record.acked + in_flight,
                acked: entry.record.acked,
                oldest_message_age_ms: oldest_age_ms,
                window_deliveries: scheduling.fairness.window_deliveries,
                dwell_p50_ms: scheduling.fairness.dwell_p50_ms,
                dwell_p99_ms: scheduling.fairness.dwell_p99_ms,
                weight: scheduling.weight.max(1),
                deficit: scheduling.deficit,
                ready: scheduling.ready,
                led,
            });
        }
        for stat in queues.values_mut() {
            summarise(stat);
        }
        Ok(v1::QueueStatsResponse {
            queues: queues.into_values().collect(),
        })
    }
}

/// Fills a queue's totals and Jain's index from its producers.
fn summarise(stat: &mut v1::QueueStat) {
    stat.backlog_messages = stat.producers.iter().map(|p| p.backlog_messages).sum();
    stat.backlog_bytes = stat.producers.iter().map(|p| p.backlog_bytes).sum();
    stat.acked = stat.producers.iter().map(|p| p.acked).sum();
    stat.oldest_message_age_ms = stat
        .producers
        .iter()
        .map(|p| p.oldest_message_age_ms)
        .max()
        .unwrap_or(0);
    let shares: Vec<f64> = stat
        .producers
        .iter()
        .filter(|p| p.window_deliveries > 0 && p.ready > 0)
        .map(|p| p.window_deliveries as f64 / f64::from(p.weight.max(1)))
        .collect();
    stat.jain_index = jain_index(&shares).unwrap_or(0.0);
    stat.fairness_window_seconds = WINDOW_SECONDS;
}

/// Every node's own figures merged: a producer's from the node leading its
/// shard (else the replica that applied the most acks), delivery counters
/// summed over the nodes' dispatchers.
pub(super) fn merge_queue_stats(answers: Vec<v1::QueueStatsResponse>) -> v1::QueueStatsResponse {
    let mut queues: BTreeMap<String, v1::QueueStat> = BTreeMap::new();
    let mut producers: BTreeMap<(String, String), v1::ProducerStat> = BTreeMap::new();
    for answer in answers {
        for stat in answer.queues {
            let merged = queues.entry(stat.queue.clone()).or_default();
            merged.queue = stat.queue.clone();
            merged.in_flight += stat.in_flight;
            merged.delivered += stat.delivered;
            merged.redelivered += stat.redelivered;
            merged.consumers += stat.consumers;
            for producer in stat.producers {
                let key = (stat.queue.clone(), producer.producer_id.clone());
                let better = producers
                    .get(&key)
                    .is_none_or(|known| (producer.led, producer.acked) > (known.led, known.acked));
                if better {
                    producers.insert(key, producer);
                }
            }
        }
    }
    for ((queue, _), producer) in producers {
        queues.entry(queue).or_default().producers.push(producer);
    }
    for stat in queues.values_mut() {
        summarise(stat);
    }
    v1::QueueStatsResponse {
        queues: queues.into_values().collect(),
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
            let entry = entry.map_err(|e| {
                Status::from(RequestError::Internal(format!(
                    "cannot read shard {}: {e}",
                    group.id
                )))
            })?;
            if queue.is_some_and(|q| q != entry.queue) {
                continue;
            }
            let oldest_age_ms = if entry.record.messages == 0 {
                0
            } else {
                group
                    .reader
                    .oldest_message(&entry.queue, &entry.producer, entry.record.head)
                    .map_err(|e| {
                        Status::from(RequestError::Internal(format!(
                            "cannot read shard {}: {e}",
                            group.id
                        )))
                    })?
                    .map(|(_, message)| (now_ms - message.enqueued_at_ms).max(0) as u64)
                    .unwrap_or(0)
            };
            producers.push((entry, oldest_age_ms));
        }
    }
    Ok(producers)
}
