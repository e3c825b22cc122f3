//! Health that tells the truth.
//!
//! - Once the node's raft log stopped after an I/O failure, or a shard's
//!   raft stopped on a fatal error, the node can no longer commit what it
//!   is asked to, so its health turns NOT_SERVING for good (load balancers
//!   and clients move to other nodes) and cluster status says why. Only a
//!   restart, which recovers from the log, clears it.
//! - Once it has served, a node with a shard that has had no known leader
//!   for [`LEADERLESS_GRACE`] (its replicas lost their majority) answers
//!   NOT_SERVING too, and SERVING again once every shard has a leader. An
//!   election after a leader's loss takes well under the grace, so a
//!   failover does not flap health.
//! - A stopping node answers NOT_SERVING (`node/mod.rs` stops this watcher
//!   first).
//!
//! [`first_fault`] and [`leaderless`] decide from what they are shown;
//! [`spawn`] looks every [`CHECK_INTERVAL`] and reports.
//!
//! IMPLEMENTATION CAVEATS
//! - A fault is noticed within a check interval, not at once.
//! - Running out of disk space is not a fault here yet (it fails the log
//!   like any write error).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floret_cluster::Shards;
use floret_store::{LogHealth, ShardId};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::server::HealthReporter;

use crate::service::server::{not_serving, serving};

/// How often the node looks for a fault.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// How long a shard may go without a known leader before the node answers
/// NOT_SERVING: several election timeouts.
pub const LEADERLESS_GRACE: Duration = Duration::from_secs(5);

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

/// Why a node that has served should not now: the shards (of
/// `leaderless_since`, each shard without a known leader and since when)
/// that have had none for [`LEADERLESS_GRACE`] at `now`; none when it may serve.
pub fn leaderless(leaderless_since: &BTreeMap<ShardId, Instant>, now: Instant) -> Option<String> {
    let long: Vec<ShardId> = leaderless_since
        .iter()
        .filter(|(_, since)| now.saturating_duration_since(**since) >= LEADERLESS_GRACE)
        .map(|(&shard, _)| shard)
        .collect();
    (!long.is_empty()).then(|| {
        format!("no leader known for shards {long:?} for {LEADERLESS_GRACE:?} or more: their replicas have lost their majority")
    })
}

/// Watches `log` and every shard of `shards`. A failure is recorded in
/// `fault` and turns `health` NOT_SERVING for good. Once `ready` (the node
/// has reported SERVING), a shard without a leader for too long turns it
/// NOT_SERVING until every shard has one again.
pub fn spawn(
    log: LogHealth,
    shards: Arc<Shards>,
    health: HealthReporter,
    fault: NodeFault,
    ready: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(CHECK_INTERVAL);
        let mut leaderless_since: BTreeMap<ShardId, Instant> = BTreeMap::new();
        let mut held_back: Option<String> = None;
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
            let now = Instant::now();
            for group in shards.groups() {
                if group.raft.metrics().borrow().current_leader.is_some() {
                    leaderless_since.remove(&group.id);
                } else {
                    leaderless_since.entry(group.id).or_insert(now);
                }
            }
            if !*ready.borrow() {
                continue;
            }
            let why = leaderless(&leaderless_since, now);
            if why == held_back {
                continue;
            }
            match &why {
                Some(why) => {
                    tracing::warn!(reason = %why, "health turns NOT_SERVING");
                    not_serving(&health).await;
                }
                None => {
                    tracing::info!("every shard has a leader again: health turns SERVING");
                    serving(&health).await;
                }
            }
            held_back = why;
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
    fn a_shard_without_a_leader_for_the_grace_turns_the_node_not_serving() {
        let start = Instant::now();
        let since = BTreeMap::from([(2, start), (5, start + Duration::from_secs(3))]);
        assert_eq!(
            leaderless(&since, start + Duration::from_secs(1)),
            None,
            "an election takes less than the grace"
        );
        let why = leaderless(&since, start + LEADERLESS_GRACE).unwrap();
        assert!(why.contains("shards [2]"), "{why}");
        assert_eq!(leaderless(&BTreeMap::new(), start), None);
    }

    #[test]
    fn first_fault_recorded_stays() {
        let fault = NodeFault::default();
        assert_eq!(fault.record("first".into()), "first");
        assert_eq!(fault.record("second".into()), "first");
        assert_eq!(fault.reason().as_deref(), Some("first"));
    }
}
