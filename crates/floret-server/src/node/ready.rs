//! Readiness: a node reports SERVING once every shard it holds, or is
//! placed on, has a leader.
//!
//! Which shards those are is read again on every look: the placement a
//! starting node begins with may be older than the members it learns a
//! moment later, and a stale replica it holds at start may be retired
//! meanwhile; neither must hold the node back.

use std::time::Duration;

use super::{Node, NodeError};

/// How often a starting node looks whether its shards have leaders.
const READY_CHECK: Duration = Duration::from_millis(20);

impl Node {
    /// Waits until every shard this node holds or is placed on has a
    /// leader, then reports SERVING.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), NodeError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let leaderless = self
                .shards
                .placed_or_held_groups()
                .find(|group| group.raft.metrics().borrow().current_leader.is_none());
            let Some(group) = leaderless else {
                break;
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(NodeError::NotReady {
                    shard: group.id,
                    waited: timeout,
                });
            }
            tokio::time::sleep(READY_CHECK).await;
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
