//! Gives each shard's leadership back to its preferred replica.
//!
//! After a node fails, its shards elect other leaders; when it comes back
//! it is a follower everywhere, so one node would keep leading (and
//! dispatching) more than its share. Every few seconds each node looks at
//! the shards it is the preferred replica of; for one led by another node it
//! asks that leader to step aside (`Peer.HandBack`, which the leader grants
//! only when this replica is caught up), waits until its log holds the
//! leader's last entry, and calls an election, which it wins with the
//! leader's vote (see `hand_back.rs`). Leaders the gossip view declares
//! dead are not asked (a hint: the call would only time out).
//!
//! IMPLEMENTATION CAVEATS
//! - While a shard is handed over (the election, or a leader lease when
//!   the leader was elected less than a lease ago) its produces get
//!   UNAVAILABLE with a retry hint; clients retry.

use std::sync::Arc;
use std::time::Duration;

use floret_cluster::{Liveness, Shards};
use floret_proto::peer::v1::HandBackRequest;
use floret_store::{NodeId, ShardId};
use openraft::{BasicNode, RaftMetrics};
use tokio::task::JoinHandle;

/// How often a node checks for shards it should lead.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long a started node waits before asking for leaderships back, so it
/// first catches up.
const STARTUP_GRACE: Duration = Duration::from_secs(1);
/// How long the hand-back call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the shard may take to settle on a leader after the election
/// is called. The election is called once: a candidate that loses goes on
/// as openraft's own, and calling more would only bump the term over
/// whoever is winning.
const ELECTION_DEADLINE: Duration = Duration::from_secs(3);

/// Starts the rebalancer of this node.
pub fn spawn(shards: Arc<Shards>) -> JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep(STARTUP_GRACE).await;
        let node_id = shards.node_id();
        loop {
            let misplaced: Vec<(ShardId, NodeId)> = shards
                .groups()
                .filter(|group| {
                    shards.replicas().preferred_leader(group.id) == node_id
                        && shards.votes_in(group.id, node_id)
                })
                .filter_map(|group| {
                    let leader = group.raft.metrics().borrow().current_leader?;
                    let leader_alive = shards
                        .liveness(leader)
                        .is_none_or(|liveness| liveness != Liveness::Dead);
                    (leader != node_id && leader_alive).then_some((group.id, leader))
                })
                .collect();
            futures::future::join_all(
                misplaced
                    .into_iter()
                    .map(|(shard, leader)| take_back(&shards, shard, leader)),
            )
            .await;
            tokio::time::sleep(CHECK_INTERVAL).await;
        }
    })
}

async fn take_back(shards: &Shards, shard: ShardId, leader: NodeId) {
    let node_id = shards.node_id();
    let Some(mut client) = shards.peers().peer_client(leader) else {
        return;
    };
    let request = HandBackRequest {
        shard_id: shard,
        node_id,
    };
    let answer = match tokio::time::timeout(CALL_TIMEOUT, client.hand_back(request)).await {
        Ok(Ok(answer)) => answer.into_inner(),
        Ok(Err(status)) => {
            tracing::debug!(shard, leader, %status, "hand-back call failed");
            return;
        }
        Err(_) => return,
    };
    if !answer.accepted {
        tracing::debug!(shard, leader, reason = answer.reason, "hand-back refused");
        return;
    }
    let new_leader = elect_once_caught_up(
        shards,
        shard,
        answer.leader_last_log_index,
        Duration::from_millis(answer.wait_ms),
    )
    .await;
    if new_leader == Some(node_id) {
        tracing::info!(
            shard,
            from = leader,
            "leadership back on the preferred replica"
        );
    } else {
        tracing::debug!(
            shard,
            ?new_leader,
            "did not win the hand-back election; will ask again"
        );
    }
}

/// Calls an election in `shard` once this node's log holds the stepping-
/// aside leader's `leader_last_log_index` (0: not known), or after
/// `elect_within` at the latest; the shard's leader once it settles, none
/// if it did not within [`ELECTION_DEADLINE`].
pub(crate) async fn elect_once_caught_up(
    shards: &Shards,
    shard: ShardId,
    leader_last_log_index: u64,
    elect_within: Duration,
) -> Option<NodeId> {
    let group = shards.group(shard)?;
    let mut metrics = group.raft.metrics();
    if leader_last_log_index == 0 {
        tokio::time::sleep(elect_within).await;
    } else {
        let caught_up = |m: &RaftMetrics<NodeId, BasicNode>| {
            m.last_log_index.unwrap_or(0) >= leader_last_log_index
        };
        let _elect_anyway = tokio::time::timeout(elect_within, metrics.wait_for(caught_up)).await;
    }
    let term_before = metrics.borrow().current_term;
    group.raft.trigger().elect().await.ok()?;
    let settled = tokio::time::timeout(
        ELECTION_DEADLINE,
        metrics.wait_for(|m| m.current_term > term_before && m.current_leader.is_some()),
    )
    .await;
    match settled {
        Ok(Ok(metrics)) => metrics.current_leader,
        _ => None,
    }
}
