//! Tells the dispatcher whenever this node gains or loses a shard's
//! leadership, following the shard's group when a fresh one replaces it.

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
    let mut groups = shards
        .group_changes(shard)
        .expect("leadership is watched for the cluster's shards");
    tokio::spawn(async move {
        let mut leading = false;
        loop {
            let raft = groups.borrow_and_update().raft.clone();
            let mut metrics = raft.metrics();
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
            // The group stopped: the node stops, or a retired replica's
            // group is being replaced by a fresh one.
            if leading {
                leading = false;
                dispatcher.leadership(shard, false);
            }
            if groups.changed().await.is_err() {
                break;
            }
        }
    })
}
