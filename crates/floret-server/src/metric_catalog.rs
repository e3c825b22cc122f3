//! Every metric a node exports, with its kind, its help text and, for
//! histograms, its buckets: the one list `docs/metrics.md` follows and the
//! Prometheus endpoint describes ([`describe`]). A test scrapes a real node
//! and checks that everything it exports is here, with this kind.
//!
//! Counters and gauges about queues carry a `queue` label; per-producer
//! gauges carry only the top producers by backlog (`metrics.top_producers`)
//! and one `producer="other"` series for the rest, so a queue with a
//! million producers exports a bounded number of series. Gauges are
//! sampled every few seconds (`sampler.rs`) from what this node leads:
//! summed over the nodes, they give the cluster's figures.
//!
//! IMPLEMENTATION CAVEATS
//! - Delivery, ack and redelivery counters restart from zero with the
//!   node (Prometheus' `rate` takes that as a counter reset).

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution, with explicit buckets.
    Histogram(&'static [f64]),
}

impl MetricKind {
    /// Its name in Prometheus' `# TYPE` line.
    pub fn prometheus_type(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram(_) => "histogram",
        }
    }
}

/// One exported metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metric {
    /// Its name.
    pub name: &'static str,
    /// Its kind.
    pub kind: MetricKind,
    /// What it counts or measures (the `# HELP` text).
    pub help: &'static str,
    /// Its labels, besides the ones Prometheus adds.
    pub labels: &'static [&'static str],
}

/// Buckets of counts that go up to a raft entry's 64 operations.
const OPERATIONS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// Buckets of a sink batch's messages, up to the largest `batch_max`.
const BATCH_MESSAGES: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1_000.0, 2_000.0, 5_000.0, 10_000.0,
];

/// Buckets of the time a step takes, in seconds: 250 µs to 10 s.
const STEP_SECONDS: &[f64] = &[
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0,
];

/// Buckets of the time a message waits for its first delivery, in
/// seconds: 1 ms to 10 minutes (a backlog drains for minutes).
const WAIT_SECONDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
];

const QUEUE: &[&str] = &["queue"];
const QUEUE_PRODUCER: &[&str] = &["queue", "producer"];
const SHARD: &[&str] = &["shard"];

/// Every metric a node exports.
pub const METRICS: &[Metric] = &[
    Metric {
        name: "floret_produced_messages_total",
        kind: MetricKind::Counter,
        help: "Messages this node committed as a shard's leader.",
        labels: QUEUE,
    },
    Metric {
        name: "floret_deliveries_total",
        kind: MetricKind::Counter,
        help: "Deliveries this node's dispatcher made, redeliveries included (since the node started).",
        labels: QUEUE,
    },
    Metric {
        name: "floret_redeliveries_total",
        kind: MetricKind::Counter,
        help: "Deliveries of a message delivered before: after a nack, a lapsed lease or a failover (since the node started).",
        labels: QUEUE,
    },
    Metric {
        name: "floret_acked_messages_total",
        kind: MetricKind::Counter,
        help: "Acks whose removal committed on this node as the shard's leader (since the node started).",
        labels: QUEUE,
    },
    Metric {
        name: "floret_nacked_messages_total",
        kind: MetricKind::Counter,
        help: "Nacks this node took as the shard's leader: the message is delivered again.",
        labels: QUEUE,
    },
    Metric {
        name: "floret_dead_lettered_messages_total",
        kind: MetricKind::Counter,
        help: "Messages this node moved to the dead letters as the shard's leader: rejected by a consumer, past max_attempts or past their TTL with dead_letter_on_expiry.",
        labels: QUEUE,
    },
    Metric {
        name: "floret_lease_expiries_total",
        kind: MetricKind::Counter,
        help: "Deliveries whose lease expired unsettled, so the message is delivered again.",
        labels: &[],
    },
    Metric {
        name: "floret_discarded_total",
        kind: MetricKind::Counter,
        help: "Messages the dispatcher proposed to remove undelivered (past their TTL or max_attempts), dead-lettered or not.",
        labels: QUEUE,
    },
    Metric {
        name: "floret_produce_rejected_total",
        kind: MetricKind::Counter,
        help: "Produces refused for a producer's max_messages or max_bytes.",
        labels: QUEUE,
    },
    Metric {
        name: "floret_produce_throttled_total",
        kind: MetricKind::Counter,
        help: "Produces refused for a producer's or a tenant's produce_rate.",
        labels: QUEUE,
    },
    Metric {
        name: "floret_produce_backpressured_total",
        kind: MetricKind::Counter,
        help: "Produces refused by node backpressure (a producer or tenant over its fair share past the high watermark).",
        labels: QUEUE,
    },
    Metric {
        name: "floret_produce_queue_full_total",
        kind: MetricKind::Counter,
        help: "Produces refused because the producer had too many calls or bytes waiting for a raft entry.",
        labels: &[],
    },
    Metric {
        name: "floret_produce_refused_disk_total",
        kind: MetricKind::Counter,
        help: "Produces refused because the data dir's filesystem is below storage.min_free_bytes.",
        labels: &[],
    },
    Metric {
        name: "floret_auth_refusals_total",
        kind: MetricKind::Counter,
        help: "Calls refused by authentication or permissions, by reason.",
        labels: &["reason"],
    },
    Metric {
        name: "floret_connections_refused_total",
        kind: MetricKind::Counter,
        help: "Connections refused over the connection cap, by port.",
        labels: &["port"],
    },
    Metric {
        name: "floret_idle_producers_forgotten_total",
        kind: MetricKind::Counter,
        help: "Idle producers (nothing stored) whose durable record was removed.",
        labels: &[],
    },
    Metric {
        name: "floret_store_syncs_total",
        kind: MetricKind::Counter,
        help: "fdatasync calls of the raft log.",
        labels: &[],
    },
    Metric {
        name: "floret_gossip_sent_bytes_total",
        kind: MetricKind::Counter,
        help: "Bytes of gossip datagrams sent.",
        labels: &[],
    },
    Metric {
        name: "floret_gossip_received_bytes_total",
        kind: MetricKind::Counter,
        help: "Bytes of gossip datagrams received.",
        labels: &[],
    },
    Metric {
        name: "floret_gossip_dropped_datagrams_total",
        kind: MetricKind::Counter,
        help: "Gossip datagrams dropped: failed the cluster's secret, out of the time window, or too large to seal.",
        labels: &[],
    },
    Metric {
        name: "floret_queue_backlog_messages",
        kind: MetricKind::Gauge,
        help: "Messages stored and not yet acked in the shards this node leads.",
        labels: QUEUE,
    },
    Metric {
        name: "floret_queue_backlog_bytes",
        kind: MetricKind::Gauge,
        help: "Bytes of the messages stored and not yet acked in the shards this node leads.",
        labels: QUEUE,
    },
    Metric {
        name: "floret_queue_in_flight_messages",
        kind: MetricKind::Gauge,
        help: "Messages delivered and not yet settled, from the shards this node leads.",
        labels: QUEUE,
    },
    Metric {
        name: "floret_queue_backlogged_producers",
        kind: MetricKind::Gauge,
        help: "Producers with messages ready for delivery in the shards this node leads.",
        labels: QUEUE,
    },
    Metric {
        name: "floret_queue_consumers",
        kind: MetricKind::Gauge,
        help: "Consume streams subscribed to the queue on this node.",
        labels: QUEUE,
    },
    Metric {
        name: "floret_queue_jain_index",
        kind: MetricKind::Gauge,
        help: "Jain's fairness index over the weighted recent deliveries of this node's backlogged producers (1 is perfectly fair; absent with none).",
        labels: QUEUE,
    },
    Metric {
        name: "floret_producer_backlog_messages",
        kind: MetricKind::Gauge,
        help: "Messages stored and unacked per producer of the shards this node leads: the top producers by backlog, and producer=\"other\" for the rest.",
        labels: QUEUE_PRODUCER,
    },
    Metric {
        name: "floret_producer_delivery_share",
        kind: MetricKind::Gauge,
        help: "Each producer's share (0 to 1) of the queue's recent deliveries on this node: the top producers by backlog, and producer=\"other\" for the rest.",
        labels: QUEUE_PRODUCER,
    },
    Metric {
        name: "floret_shard_leader",
        kind: MetricKind::Gauge,
        help: "The node this node knows as the shard's leader (0 while it knows none).",
        labels: SHARD,
    },
    Metric {
        name: "floret_shard_term",
        kind: MetricKind::Gauge,
        help: "The shard's raft term on this node.",
        labels: SHARD,
    },
    Metric {
        name: "floret_shard_replica_lag_entries",
        kind: MetricKind::Gauge,
        help: "On the shard's leader: raft entries each follower lacks.",
        labels: &["shard", "replica"],
    },
    Metric {
        name: "floret_shard_apply_lag_entries",
        kind: MetricKind::Gauge,
        help: "Raft entries in this node's log of the shard not yet applied.",
        labels: SHARD,
    },
    Metric {
        name: "floret_shards_led",
        kind: MetricKind::Gauge,
        help: "Shards this node leads.",
        labels: &[],
    },
    Metric {
        name: "floret_store_bytes",
        kind: MetricKind::Gauge,
        help: "Bytes the data dir's store takes on disk: the state machines and the raft log.",
        labels: &[],
    },
    Metric {
        name: "floret_log_segments",
        kind: MetricKind::Gauge,
        help: "Files of the raft log (segments) this node keeps.",
        labels: &[],
    },
    Metric {
        name: "floret_disk_free_bytes",
        kind: MetricKind::Gauge,
        help: "Free bytes on the data dir's filesystem.",
        labels: &[],
    },
    Metric {
        name: "floret_gossip_members_alive",
        kind: MetricKind::Gauge,
        help: "Members gossip sees alive, this node included (the member count on a one-node cluster).",
        labels: &[],
    },
    Metric {
        name: "floret_gossip_isolated",
        kind: MetricKind::Gauge,
        help: "1 while no other node's gossip is heard though TCP reaches them, else 0.",
        labels: &[],
    },
    Metric {
        name: "floret_produce_seconds",
        kind: MetricKind::Histogram(STEP_SECONDS),
        help: "Produce calls on a shard's leader, from admission to commit.",
        labels: &[],
    },
    Metric {
        name: "floret_dwell_seconds",
        kind: MetricKind::Histogram(WAIT_SECONDS),
        help: "Messages' wait from commit to their first delivery.",
        labels: QUEUE,
    },
    Metric {
        name: "floret_ack_seconds",
        kind: MetricKind::Histogram(STEP_SECONDS),
        help: "Acks on a shard's leader, from receipt to the removal's commit.",
        labels: &[],
    },
    Metric {
        name: "floret_store_sync_seconds",
        kind: MetricKind::Histogram(STEP_SECONDS),
        help: "fdatasync calls of the raft log.",
        labels: &[],
    },
    Metric {
        name: "floret_raft_append_seconds",
        kind: MetricKind::Histogram(STEP_SECONDS),
        help: "Raft append-entries calls to a follower, round trip.",
        labels: &[],
    },
    Metric {
        name: "floret_apply_seconds",
        kind: MetricKind::Histogram(STEP_SECONDS),
        help: "Applying a batch of committed raft entries to a shard's state machine.",
        labels: &[],
    },
    Metric {
        name: "floret_entry_ops",
        kind: MetricKind::Histogram(OPERATIONS),
        help: "Operations (produces, acks, policies) folded into each raft entry this node proposed.",
        labels: &[],
    },
    Metric {
        name: "floret_store_sync_waiters",
        kind: MetricKind::Histogram(OPERATIONS),
        help: "Appends made durable by each fdatasync of the raft log.",
        labels: &[],
    },
    Metric {
        name: "floret_sink_messages_total",
        kind: MetricKind::Counter,
        help: "Messages a queue's sink answered, by outcome: ok (removed), retry (handed back after a back-off), reject (dead-lettered).",
        labels: &["queue", "outcome"],
    },
    Metric {
        name: "floret_sink_batches_total",
        kind: MetricKind::Counter,
        help: "Batches this node sent to a queue's sink, by result: answered, or failed (the call failed, timed out or answered another number of results; sent again).",
        labels: &["queue", "result"],
    },
    Metric {
        name: "floret_sink_rate_part",
        kind: MetricKind::Gauge,
        help: "This node's part of a capped sink's rate, messages/s: summed over the nodes it is the cap.",
        labels: &["queue"],
    },
    Metric {
        name: "floret_sink_in_flight_part",
        kind: MetricKind::Gauge,
        help: "Batches this node may have at a queue's sink at once: its part of max_in_flight (1 without it).",
        labels: &["queue"],
    },
    Metric {
        name: "floret_sink_batches_in_flight",
        kind: MetricKind::Gauge,
        help: "Batches this node has at a queue's sink, sent and not yet answered.",
        labels: &["queue"],
    },
    Metric {
        name: "floret_sink_batch_seconds",
        kind: MetricKind::Histogram(STEP_SECONDS),
        help: "Calls to a sink that it answered, from sending the batch to its answer.",
        labels: &[],
    },
    Metric {
        name: "floret_sink_batch_messages",
        kind: MetricKind::Histogram(BATCH_MESSAGES),
        help: "Messages in each batch sent to a sink.",
        labels: &[],
    },
    Metric {
        name: "floret_replicas_retired_total",
        kind: MetricKind::Counter,
        help: "Replicas of this node a move took away whose state it deleted.",
        labels: &[],
    },
];

/// Gives every metric its help text, on the recorder installed.
pub fn describe() {
    for metric in METRICS {
        match metric.kind {
            MetricKind::Counter => metrics::describe_counter!(metric.name, metric.help),
            MetricKind::Gauge => metrics::describe_gauge!(metric.name, metric.help),
            MetricKind::Histogram(_) => metrics::describe_histogram!(metric.name, metric.help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_was_listed_twice_or_named_against_prometheus_conventions() {
        let mut names: Vec<&str> = METRICS.iter().map(|metric| metric.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), METRICS.len(), "listed twice");
        for metric in METRICS {
            assert!(metric.name.starts_with("floret_"), "{}", metric.name);
            assert_eq!(
                metric.name.ends_with("_total"),
                metric.kind == MetricKind::Counter,
                "counters, and only counters, end in _total: {}",
                metric.name
            );
        }
    }
}
