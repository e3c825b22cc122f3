//! The gauges a node exports, sampled every [`SAMPLE_EVERY`]: per queue
//! (backlog, in flight, backlogged producers, consumers, Jain's index),
//! per producer (the top N by backlog and an `other` series), per shard
//! (leader, term, replica and apply lag) and per node (shards led, store
//! size, log segments, gossip members). It also keeps the dispatcher's
//! per-queue delivery, ack and redelivery counters in the export.
//!
//! Everything is read from what this node leads, so summing a gauge over
//! the nodes gives the cluster's figure. Choosing the exported producers
//! is pure ([`top_producers`]); the task around it only reads and sets.
//!
//! IMPLEMENTATION CAVEATS
//! - A producer's backlog here is what the dispatcher holds for it (ready
//!   and in flight), which the store's totals per queue bound.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::{Liveness, Shards, View};
use floret_store::StoreUsage;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::deliver::{DispatcherHandle, QueueActivity};

/// How often the gauges are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// The producer label of the series summing the producers outside the top N.
pub const OTHER_PRODUCERS: &str = "other";

/// What the sampler reads.
pub struct SampledParts {
    /// The node's shards.
    pub shards: Arc<Shards>,
    /// The node's dispatcher.
    pub dispatcher: DispatcherHandle,
    /// The data dir's store.
    pub store: StoreUsage,
    /// Gossip's view, on a node of several.
    pub view: Option<watch::Receiver<Arc<View>>>,
    /// How many producers per queue get their own series.
    pub top_producers: usize,
}

/// Starts sampling every [`SAMPLE_EVERY`], the first time at once.
pub fn spawn(parts: SampledParts) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(SAMPLE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Ok(activity) = parts.dispatcher.activity(true).await else {
                return;
            };
            sample_queues(&parts.shards, &activity, parts.top_producers);
            sample_shards(&parts.shards);
            let store = parts.store.clone();
            if let Ok(usage) = tokio::task::spawn_blocking(move || store.measure()).await {
                metrics::gauge!("floret_store_bytes").set(usage.bytes as f64);
                metrics::gauge!("floret_log_segments").set(usage.log_segments as f64);
            }
            let alive = parts.view.as_ref().map_or(1, |view| {
                view.borrow()
                    .values()
                    .filter(|node| node.liveness == Liveness::Alive)
                    .count()
            });
            metrics::gauge!("floret_gossip_members_alive").set(alive as f64);
        }
    })
}

/// Per-queue counters and gauges, and the top producers' gauges.
fn sample_queues(shards: &Shards, activity: &HashMap<String, QueueActivity>, top: usize) {
    let stored = stored_per_queue(shards);
    for (queue, figures) in activity {
        let label = || [("queue", queue.clone())];
        metrics::counter!("floret_deliveries_total", &label()).absolute(figures.delivered);
        metrics::counter!("floret_acked_messages_total", &label()).absolute(figures.acked);
        metrics::counter!("floret_redeliveries_total", &label()).absolute(figures.redelivered);
        for name in COUNTED_WHERE_IT_HAPPENS {
            metrics::counter!(*name, &label()).increment(0);
        }
        let (messages, bytes) = stored.get(queue.as_str()).copied().unwrap_or_default();
        metrics::gauge!("floret_queue_backlog_messages", &label()).set(messages as f64);
        metrics::gauge!("floret_queue_backlog_bytes", &label()).set(bytes as f64);
        metrics::gauge!("floret_queue_in_flight_messages", &label()).set(figures.in_flight as f64);
        metrics::gauge!("floret_queue_backlogged_producers", &label())
            .set(figures.backlogged_producers as f64);
        metrics::gauge!("floret_queue_consumers", &label()).set(figures.consumers as f64);
        if let Some(jain) = jain_of_backlogged(figures) {
            metrics::gauge!("floret_queue_jain_index", &label()).set(jain);
        }
        for exported in top_producers(figures, top) {
            let labels = [
                ("queue", queue.clone()),
                ("producer", exported.producer.to_owned()),
            ];
            metrics::gauge!("floret_producer_backlog_messages", &labels)
                .set(exported.backlog as f64);
            metrics::gauge!("floret_producer_delivery_share", &labels).set(exported.share);
        }
    }
}

/// Per-queue counters counted where things happen (not by the
/// dispatcher), registered at zero as soon as the queue is seen, so that
/// dashboards and alerts find every series.
const COUNTED_WHERE_IT_HAPPENS: &[&str] = &[
    "floret_produced_messages_total",
    "floret_nacked_messages_total",
    "floret_dead_lettered_messages_total",
    "floret_discarded_total",
    "floret_produce_rejected_total",
    "floret_produce_throttled_total",
    "floret_produce_backpressured_total",
];

/// Messages and bytes stored per queue in the shards this node leads.
fn stored_per_queue(shards: &Shards) -> HashMap<String, (u64, u64)> {
    let mut stored: HashMap<String, (u64, u64)> = HashMap::new();
    for group in shards.groups().filter(|group| shards.leads(group.id)) {
        group
            .reader
            .totals()
            .for_each_group(|queue, _group, totals| {
                let queue_totals = match stored.get_mut(queue) {
                    Some(totals) => totals,
                    None => stored.entry(queue.to_owned()).or_default(),
                };
                queue_totals.0 += totals.messages;
                queue_totals.1 += totals.bytes;
            });
    }
    stored
}

/// Jain's index over the weighted recent deliveries of the producers with
/// messages ready; none with fewer than one such producer.
fn jain_of_backlogged(figures: &QueueActivity) -> Option<f64> {
    let shares: Vec<f64> = figures
        .producers
        .values()
        .filter(|producer| producer.ready > 0 && producer.fairness.window_deliveries > 0)
        .map(|producer| {
            producer.fairness.window_deliveries as f64 / f64::from(producer.weight.max(1))
        })
        .collect();
    floret_sched::jain_index(&shares)
}

/// Raft figures of every shard this node holds.
fn sample_shards(shards: &Shards) {
    let mut led = 0;
    for group in shards.groups() {
        let raft = group.raft.metrics().borrow().clone();
        let shard = [("shard", group.id.to_string())];
        let leader = raft.current_leader.unwrap_or(0);
        metrics::gauge!("floret_shard_leader", &shard).set(leader as f64);
        metrics::gauge!("floret_shard_term", &shard).set(raft.current_term as f64);
        let last_log = raft.last_log_index.unwrap_or(0);
        let applied = raft.last_applied.map_or(0, |id| id.index);
        metrics::gauge!("floret_shard_apply_lag_entries", &shard)
            .set(last_log.saturating_sub(applied) as f64);
        if leader == shards.node_id() {
            led += 1;
        }
        for (replica, matched) in raft.replication.iter().flatten() {
            if *replica == shards.node_id() {
                continue;
            }
            let matched = matched.map_or(0, |id| id.index);
            let labels = [
                ("shard", group.id.to_string()),
                ("replica", replica.to_string()),
            ];
            metrics::gauge!("floret_shard_replica_lag_entries", &labels)
                .set(last_log.saturating_sub(matched) as f64);
        }
    }
    metrics::gauge!("floret_shards_led").set(f64::from(led));
}

/// One exported producer series of a queue.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportedProducer<'a> {
    /// The producer, or [`OTHER_PRODUCERS`].
    pub producer: &'a str,
    /// Messages ready and in flight.
    pub backlog: u64,
    /// Its share of the queue's recent deliveries on this node, 0 to 1.
    pub share: f64,
}

/// The `top` producers by backlog (ties by name), then one
/// [`OTHER_PRODUCERS`] series summing the rest when there is a rest.
pub fn top_producers(figures: &QueueActivity, top: usize) -> Vec<ExportedProducer<'_>> {
    let mut producers: Vec<(&str, u64, u64)> = figures
        .producers
        .iter()
        .map(|(name, activity)| {
            let in_flight = figures
                .in_flight_by_producer
                .get(name)
                .copied()
                .unwrap_or(0);
            (
                name.as_str(),
                activity.ready + in_flight,
                activity.fairness.window_deliveries,
            )
        })
        .collect();
    producers.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let delivered: u64 = producers.iter().map(|p| p.2).sum();
    let share = |deliveries: u64| {
        if delivered == 0 {
            0.0
        } else {
            deliveries as f64 / delivered as f64
        }
    };
    let rest = producers.split_off(top.min(producers.len()));
    let mut exported: Vec<ExportedProducer<'_>> = producers
        .into_iter()
        .map(|(producer, backlog, deliveries)| ExportedProducer {
            producer,
            backlog,
            share: share(deliveries),
        })
        .collect();
    if !rest.is_empty() {
        exported.push(ExportedProducer {
            producer: OTHER_PRODUCERS,
            backlog: rest.iter().map(|p| p.1).sum(),
            share: share(rest.iter().map(|p| p.2).sum()),
        });
    }
    exported
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deliver::ProducerActivity;
    use crate::deliver::fairness::ProducerFairness;

    fn queue(producers: &[(&str, u64, u64, u64)]) -> QueueActivity {
        let mut figures = QueueActivity::default();
        for &(name, ready, in_flight, deliveries) in producers {
            figures.producers.insert(
                name.to_owned(),
                ProducerActivity {
                    fairness: ProducerFairness {
                        window_deliveries: deliveries,
                        ..Default::default()
                    },
                    weight: 1,
                    deficit: 0,
                    ready,
                },
            );
            figures
                .in_flight_by_producer
                .insert(name.to_owned(), in_flight);
        }
        figures
    }

    #[test]
    fn a_queue_with_many_producers_exported_a_series_per_producer() {
        let figures = queue(&[
            ("flood", 900, 100, 10),
            ("b", 5, 0, 10),
            ("c", 3, 1, 10),
            ("d", 1, 0, 10),
            ("e", 0, 0, 0),
        ]);
        let exported = top_producers(&figures, 2);
        let names: Vec<&str> = exported.iter().map(|p| p.producer).collect();
        assert_eq!(names, ["flood", "b", OTHER_PRODUCERS]);
        assert_eq!(exported[0].backlog, 1000);
        assert_eq!(exported[2].backlog, 5, "c and d and e summed");
        assert!((exported[2].share - 0.5).abs() < 1e-9);
        let total: f64 = exported.iter().map(|p| p.share).sum();
        assert!((total - 1.0).abs() < 1e-9, "shares add up to one");
    }

    #[test]
    fn a_queue_within_the_top_n_got_an_empty_other_series() {
        let figures = queue(&[("a", 1, 0, 0), ("b", 2, 0, 0)]);
        let exported = top_producers(&figures, 10);
        assert_eq!(exported.len(), 2);
        assert_eq!(exported[0].producer, "b");
        assert!(
            exported.iter().all(|p| p.share == 0.0),
            "nothing delivered yet"
        );
    }

    #[test]
    fn jain_counted_producers_with_nothing_ready() {
        let fair = queue(&[("a", 5, 0, 10), ("b", 5, 0, 10), ("idle", 0, 0, 1)]);
        assert_eq!(jain_of_backlogged(&fair), Some(1.0));
        let unfair = queue(&[("a", 5, 0, 30), ("b", 5, 0, 10)]);
        assert!(jain_of_backlogged(&unfair).unwrap() < 0.9);
    }
}
