//! Readiness: a node reports SERVING once every shard it holds, or is
//! placed on, has a leader.

use std::sync::Arc;
use std::time::Duration;

use super::{Node, NodeError};

impl Node {
    /// Waits until every shard this node holds or is placed on has a
    /// leader, then reports SERVING. A group replaced meanwhile (a stale
    /// replica retired) is looked at again.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), NodeError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let shards: Vec<u32> = self
            .shards
            .placed_or_held_groups()
            .map(|group| group.id)
            .collect();
        for shard in shards {
            loop {
                let Some(group) = self
                    .shards
                    .placed_or_held_groups()
                    .find(|group| group.id == shard)
                else {
                    break;
                };
                let mut metrics = group.raft.metrics();
                let led = tokio::time::timeout_at(
                    deadline,
                    metrics.wait_for(|m| m.current_leader.is_some()),
                )
                .await;
                match led {
                    Ok(Ok(_)) => break,
                    Ok(Err(_stopped)) => {
                        if let Some(mut changes) = self.shards.group_changes(shard) {
                            let replaced = changes.wait_for(|now| !Arc::ptr_eq(now, &group));
                            let _deadline_or_stopped =
                                tokio::time::timeout_at(deadline, replaced).await;
                        }
                    }
                    Err(_) => {
                        return Err(NodeError::NotReady {
                            shard,
                            waited: timeout,
                        });
                    }
                }
            }
        }
        if self.fault.reason().is_none() {
            self.server.report_serving().await;
            if self.fault.reason().is_some() {
                self.server.report_not_serving().await;
            }
        }
        self.ready.send_replace(true);
        Ok(())
    }
}
