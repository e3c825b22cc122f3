//! Tells the dispatcher whenever this node gains or loses a shard's leadership.

use floret_cluster::Shards;
use tokio::task::JoinHandle;

use crate::deliver::DispatcherHandle;

/// Tells the dispatcher whenever this node gains or loses the leadership of
/// `shard`. A gain is reported only once the new leader's state machine has
/// applied everything committed before its term (`ensure_linearizable`):
/// otherwise the rebuild could see a message whose acked removal is
/// committed but not yet applied, and deliver it again.
pub fn watch_leadership(
    shards: &Shards,
    shard: u32,
    dispatcher: DispatcherHandle,
) -> JoinHandle<()> {
    let node_id = shards.node_id();
    let raft = shards
        .opened_group(shard)
        .expect("leadership is watched for the cluster's shards")
        .raft
        .clone();
    let mut metrics = raft.metrics();
    tokio::spawn(async move {
        let mut leading = false;
        loop {
            let now_leading = metrics.borrow_and_update().current_leader == Some(node_id);
            if now_leading && !leading {
                match raft.ensure_linearizable().await {
                    Ok(_) => {
                        leading = true;
                        dispatcher.leadership(shard, true);
                    }
                    Err(error) => tracing::debug!(shard, %error, "leadership not confirmed"),
                }
            } else if !now_leading && leading {
                leading = false;
                dispatcher.leadership(shard, false);
            }
            if metrics.changed().await.is_err() {
                break;
            }
        }
    })
}
