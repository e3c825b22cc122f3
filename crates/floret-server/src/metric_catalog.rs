//! Every metric a node exports, with its kind, its help text and, for
//! histograms, its buckets: the one list `docs/metrics.md` follows and the
//! Prometheus endpoint describes ([`describe`]). A test scrapes a real node
//! and checks that everything it exports is here, with this kind.
//!
//! IMPLEMENTATION CAVEATS
//! - No per-queue labels or gauges of backlog, in flight, raft lag yet;
//!   `floret status` shows those.

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
}

/// Buckets of counts that go up to a raft entry's 64 operations.
const OPERATIONS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// Every metric a node exports.
pub const METRICS: &[Metric] = &[
    Metric {
        name: "floret_produced_messages_total",
        kind: MetricKind::Counter,
        help: "Messages this node committed as a shard's leader.",
    },
    Metric {
        name: "floret_deliveries_total",
        kind: MetricKind::Counter,
        help: "Deliveries this node's dispatcher made (redeliveries included).",
    },
    Metric {
        name: "floret_lease_expiries_total",
        kind: MetricKind::Counter,
        help: "Deliveries whose lease expired unsettled, so the message is delivered again.",
    },
    Metric {
        name: "floret_discarded_total",
        kind: MetricKind::Counter,
        help: "Messages the dispatcher proposed to remove undelivered (past their TTL).",
    },
    Metric {
        name: "floret_produce_rejected_total",
        kind: MetricKind::Counter,
        help: "Produces refused for a producer's max_messages or max_bytes.",
    },
    Metric {
        name: "floret_produce_throttled_total",
        kind: MetricKind::Counter,
        help: "Produces refused for a producer's or a tenant's produce_rate.",
    },
    Metric {
        name: "floret_produce_backpressured_total",
        kind: MetricKind::Counter,
        help: "Produces refused by node backpressure (a producer or tenant over its fair share past the high watermark).",
    },
    Metric {
        name: "floret_produce_queue_full_total",
        kind: MetricKind::Counter,
        help: "Produces refused because the producer had too many calls or bytes waiting for a raft entry.",
    },
    Metric {
        name: "floret_produce_refused_disk_total",
        kind: MetricKind::Counter,
        help: "Produces refused because the data dir's filesystem is below storage.min_free_bytes.",
    },
    Metric {
        name: "floret_auth_refusals_total",
        kind: MetricKind::Counter,
        help: "Calls refused by authentication or permissions, by reason.",
    },
    Metric {
        name: "floret_connections_refused_total",
        kind: MetricKind::Counter,
        help: "Connections refused over the connection cap, by port.",
    },
    Metric {
        name: "floret_idle_producers_forgotten_total",
        kind: MetricKind::Counter,
        help: "Idle producers (nothing stored) whose durable record was removed.",
    },
    Metric {
        name: "floret_store_syncs_total",
        kind: MetricKind::Counter,
        help: "fdatasync calls of the raft log.",
    },
    Metric {
        name: "floret_gossip_sent_bytes_total",
        kind: MetricKind::Counter,
        help: "Bytes of gossip datagrams sent.",
    },
    Metric {
        name: "floret_gossip_received_bytes_total",
        kind: MetricKind::Counter,
        help: "Bytes of gossip datagrams received.",
    },
    Metric {
        name: "floret_gossip_dropped_datagrams_total",
        kind: MetricKind::Counter,
        help: "Gossip datagrams dropped: failed the cluster's secret, out of the time window, or too large to seal.",
    },
    Metric {
        name: "floret_disk_free_bytes",
        kind: MetricKind::Gauge,
        help: "Free bytes on the data dir's filesystem.",
    },
    Metric {
        name: "floret_gossip_isolated",
        kind: MetricKind::Gauge,
        help: "1 while no other node's gossip is heard though TCP reaches them, else 0.",
    },
    Metric {
        name: "floret_entry_ops",
        kind: MetricKind::Histogram(OPERATIONS),
        help: "Operations (produces, acks, policies) folded into each raft entry this node proposed.",
    },
    Metric {
        name: "floret_store_sync_waiters",
        kind: MetricKind::Histogram(OPERATIONS),
        help: "Appends made durable by each fdatasync of the raft log.",
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
