//! Health that tells the truth: once the node's raft log stopped after an
//! I/O failure, or a shard's raft stopped on a fatal error, the node can
//! no longer commit what it is asked to, so its health turns NOT_SERVING
//! for good (load balancers and clients move to other nodes) and cluster
//! status says why. Only a restart, which recovers from the log, clears it.
//!
//! [`first_fault`] decides from what it is shown; [`spawn`] looks every
//! [`CHECK_INTERVAL`] and reports.
//!
//! IMPLEMENTATION CAVEATS
//! - A fault is noticed within a check interval, not at once.
//! - Running out of disk space is not a fault here yet (it fails the log
//!   like any write error).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use floret_cluster::Shards;
use floret_store::{LogHealth, ShardId};
use tokio::task::JoinHandle;
use tonic_health::server::HealthReporter;

use crate::service::server::not_serving;

/// How often the node looks for a fault.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// The node's fault, once there is one; shared with cluster status.
#[derive(Clone, Default)]
pub struct NodeFault(Arc<Mutex<Option<String>>>);

impl NodeFault {
    /// Why the node stopped serving, if it did.
    pub fn reason(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Records `reason`; the first fault recorded stays.
    fn record(&self, reason: String) -> String {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get_or_insert(reason)
            .clone()
    }
}

/// What stops the node, if anything: the raft log's failure first, else
/// the first shard whose raft stopped, as `(shard, why)`.
pub fn first_fault(
    log_failure: Option<String>,
    shards: impl IntoIterator<Item = (ShardId, Option<String>)>,
) -> Option<String> {
    if let Some(failure) = log_failure {
        return Some(format!("the raft log stopped: {failure}"));
    }
    shards
        .into_iter()
        .find_map(|(shard, fatal)| fatal.map(|why| format!("shard {shard}'s raft stopped: {why}")))
}

/// Watches `log` and every shard of `shards` until one fails, then records
/// it in `fault` and turns `health` NOT_SERVING (the node does not report
/// SERVING again while `fault` holds one).
pub fn spawn(
    log: LogHealth,
    shards: Arc<Shards>,
    health: HealthReporter,
    fault: NodeFault,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(CHECK_INTERVAL);
        let found = loop {
            interval.tick().await;
            let fatal = shards.groups().map(|group| {
                let metrics = group.raft.metrics();
                let running = &metrics.borrow().running_state;
                (group.id, running.as_ref().err().map(ToString::to_string))
            });
            if let Some(found) = first_fault(log.failure(), fatal) {
                break found;
            }
        };
        let reason = fault.record(found);
        tracing::error!(fault = %reason, "the node stops serving until it is restarted");
        not_serving(&health).await;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_log_sync_left_health_serving() {
        let shards = [(0, None), (1, None)];
        assert_eq!(first_fault(None, shards.clone()), None);
        let fault = first_fault(Some("fdatasync failed: EIO".into()), shards).unwrap();
        assert!(
            fault.contains("raft log stopped: fdatasync failed: EIO"),
            "{fault}"
        );
    }

    #[test]
    fn shard_whose_raft_stopped_is_named() {
        let shards = [(0, None), (3, Some("storage error".to_owned()))];
        assert_eq!(
            first_fault(None, shards).as_deref(),
            Some("shard 3's raft stopped: storage error")
        );
    }

    #[test]
    fn first_fault_recorded_stays() {
        let fault = NodeFault::default();
        assert_eq!(fault.record("first".into()), "first");
        assert_eq!(fault.record("second".into()), "first");
        assert_eq!(fault.reason().as_deref(), Some("first"));
    }
}
