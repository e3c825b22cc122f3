//! What the cluster's shards say about themselves, through the admin API
//! of the serving nodes: whether a restarted node caught up, who leads a
//! shard, whether every shard is back with its preferred leader, and
//! whether the replicas of each shard hold the same state (digests at the
//! same applied index).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::{Cluster, NodeId};
use crate::process::{poll, shard_leader};

impl Cluster {
    /// Waits until node `id` has applied, on every shard it holds, at least
    /// what the most advanced other replica had applied when this was called.
    pub async fn wait_caught_up(&self, id: NodeId, within: Duration) -> anyhow::Result<()> {
        let mut target: BTreeMap<u32, u64> = BTreeMap::new();
        for other in self.ids().into_iter().filter(|&n| n != id) {
            for replica in self.client(other).replica_digests().await? {
                let applied = target.entry(replica.shard_id).or_default();
                *applied = (*applied).max(replica.applied_index);
            }
        }
        let until = Instant::now() + within;
        loop {
            let behind: Vec<u32> = match self.client(id).replica_digests().await {
                Ok(replicas) => replicas
                    .iter()
                    .filter(|r| r.applied_index < target.get(&r.shard_id).copied().unwrap_or(0))
                    .map(|r| r.shard_id)
                    .collect(),
                Err(_) => target.keys().copied().collect(),
            };
            if behind.is_empty() {
                return Ok(());
            }
            if Instant::now() >= until {
                bail!("node {id} did not catch up within {within:?} on shards {behind:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The leader of `shard` as the serving nodes see it, once one is
    /// reachable (None after `within`).
    pub async fn leader_of(&self, shard: u32, within: Duration) -> Option<NodeId> {
        poll(within, Duration::from_millis(100), || async {
            for id in self.serving() {
                let status =
                    tokio::time::timeout(Duration::from_secs(2), self.client(id).cluster_status())
                        .await;
                if let Ok(Ok(status)) = status
                    && let Some(leader) = shard_leader(&status, shard)
                    && self.serving().contains(&leader)
                {
                    return Some(leader);
                }
            }
            None
        })
        .await
    }

    /// Waits until every shard is led by its preferred replica, as a
    /// serving node reports it: the leaderships a fault moved have been
    /// handed back. False after `within`.
    pub async fn wait_for_preferred_leaders(&self, within: Duration) -> bool {
        poll(within, Duration::from_millis(200), || async {
            let id = *self.serving().first()?;
            let status =
                tokio::time::timeout(Duration::from_secs(2), self.client(id).cluster_status())
                    .await
                    .ok()?
                    .ok()?;
            status
                .shards
                .iter()
                .all(|shard| shard.leader_id != 0 && shard.leader_id == shard.preferred_leader_id)
                .then_some(())
        })
        .await
        .is_some()
    }

    /// Every replica's (applied index, digest) per shard, from every node;
    /// waits up to `within` for the replicas of each shard to agree on the
    /// applied index. Returns the shards whose replicas differ.
    pub async fn digest_mismatches(&self, within: Duration) -> anyhow::Result<Vec<String>> {
        let until = Instant::now() + within;
        loop {
            let mut by_shard: BTreeMap<u32, Vec<(NodeId, u64, u64)>> = BTreeMap::new();
            for id in self.ids() {
                let replicas = self
                    .client(id)
                    .replica_digests()
                    .await
                    .with_context(|| format!("replica digests of node {id}"))?;
                for replica in replicas {
                    by_shard.entry(replica.shard_id).or_default().push((
                        id,
                        replica.applied_index,
                        replica.digest,
                    ));
                }
            }
            let differing: Vec<String> = by_shard
                .iter()
                .filter(|(_, replicas)| {
                    replicas
                        .windows(2)
                        .any(|w| (w[0].1, w[0].2) != (w[1].1, w[1].2))
                })
                .map(|(shard, replicas)| {
                    format!("shard {shard}: (node, applied, digest) {replicas:?}")
                })
                .collect();
            if differing.is_empty() || Instant::now() >= until {
                return Ok(differing);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
