//! What a node tells its operators about itself besides logs: per-queue
//! counters at the places things happen ([`count_for_queue`]), gauges
//! sampled every few seconds from what the node leads ([`sampler`]), and
//! the Prometheus recorder with the catalog's buckets ([`recorder`]), and
//! the process's resident memory ([`resident_bytes`]).
//! The names, kinds and help texts are in [`crate::metric_catalog`].

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

use crate::metric_catalog::{METRICS, MetricKind};

pub mod sampler;

/// Series not updated for this long are dropped from the export: producers
/// that left the top N, queues that emptied, shards no longer held.
/// Sampled gauges are set every [`sampler::SAMPLE_EVERY`].
const IDLE_SERIES_TIMEOUT: Duration = Duration::from_secs(60);

/// Resident memory of this process, from `/proc/self/status` (Linux only).
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kibibytes: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kibibytes * 1024)
}

/// Adds `count` to the counter `name` of `queue`.
pub fn count_for_queue(name: &'static str, queue: &str, count: u64) {
    metrics::counter!(name, "queue" => queue.to_owned()).increment(count);
}

/// The process-wide Prometheus recorder's handle, which renders the
/// `/metrics` page; installed by the first call (nodes sharing a process,
/// as `floret dev` runs them, share one recorder).
pub fn recorder() -> Result<PrometheusHandle, String> {
    static INSTALLED: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();
    INSTALLED.get_or_init(install_recorder).clone()
}

/// Installs the Prometheus recorder, with every histogram's buckets from
/// the catalog and the help texts.
fn install_recorder() -> Result<PrometheusHandle, String> {
    let mut builder =
        PrometheusBuilder::new().idle_timeout(MetricKindMask::GAUGE, Some(IDLE_SERIES_TIMEOUT));
    for metric in METRICS {
        if let MetricKind::Histogram(buckets) = metric.kind {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(metric.name.to_owned()), buckets)
                .map_err(|error| format!("buckets of {}: {error}", metric.name))?;
        }
    }
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|_| "a metrics recorder is already installed".to_owned())?;
    crate::metric_catalog::describe();
    Ok(handle)
}
