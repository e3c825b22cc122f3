//! Handing off every shard this node leads before it stops, so that a
//! rolling restart stalls each shard for a hand-over, not for an election
//! timeout.
//!
//! The node first stops calling elections itself (it must not win back
//! what it gives away). Then, for every shard it leads, it steps aside
//! for the replica holding most of its log (`hand_back.rs`: the proposer
//! pauses, entries in flight commit, dispatch of the shard stops) and
//! tells that replica to take over (`Peer.TakeLeadership`), which calls
//! its election once its log holds the leader's last entry and wins it
//! with the leader's vote. All shards are handed off at once; the node
//! waits until none is led by it any more, or until the time it was given
//! runs out, and says how it went.
//!
//! IMPLEMENTATION CAVEATS
//! - A shard whose replicas are all unreachable stays led by this node
//!   until it stops, and elects a leader after the usual timeout.

use std::sync::Arc;
use std::time::Duration;

use floret_cluster::Shards;
use floret_proto::peer::v1::TakeLeadershipRequest;
use floret_store::{NodeId, ShardId};
use tokio::time::Instant;

use super::hand_back::HandBack;

/// How the hand-off went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandOff {
    /// Shards this node led when it began.
    pub led: usize,
    /// Of them, shards it still led when it gave up waiting.
    pub still_led: usize,
}

/// Hands every shard this node leads to a caught-up replica, within
/// `within`.
pub async fn hand_off_leaderships(
    shards: &Arc<Shards>,
    hand_back: &HandBack,
    within: Duration,
) -> HandOff {
    let deadline = Instant::now() + within;
    for group in shards.groups() {
        group.raft.runtime_config().elect(false);
    }
    let led: Vec<ShardId> = shards
        .groups()
        .map(|group| group.id)
        .filter(|&shard| shards.leads(shard))
        .collect();
    // Bounded as a whole: a successor that never answers (a partition)
    // must not hold the stop past its deadline.
    let _gave_up_waiting = tokio::time::timeout_at(
        deadline,
        futures::future::join_all(
            led.iter()
                .map(|&shard| hand_off_to_most_caught_up(shards, hand_back, shard, deadline)),
        ),
    )
    .await;
    let still_led = loop {
        let still_led = led.iter().filter(|&&shard| shards.leads(shard)).count();
        if still_led == 0 || Instant::now() >= deadline {
            break still_led;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    HandOff {
        led: led.len(),
        still_led,
    }
}

/// Hands `shard` to its most caught-up replica, before `deadline`.
async fn hand_off_to_most_caught_up(
    shards: &Shards,
    hand_back: &HandBack,
    shard: ShardId,
    deadline: Instant,
) {
    if let Some(successor) = hand_back.most_caught_up_replica(shard) {
        hand_off(shards, hand_back, shard, successor, deadline).await;
    }
}

/// Hands `shard` to `successor`, before `deadline` (a leader leaving the
/// shard's replicas does this too, `moves.rs`).
pub(super) async fn hand_off(
    shards: &Shards,
    hand_back: &HandBack,
    shard: ShardId,
    successor: NodeId,
    deadline: Instant,
) {
    let stepped_aside =
        match tokio::time::timeout_at(deadline, hand_back.step_aside(shard, successor)).await {
            Ok(Ok(stepped_aside)) => stepped_aside,
            Ok(Err(why)) => {
                tracing::warn!(shard, successor, %why, "cannot hand the shard off");
                return;
            }
            Err(_) => return,
        };
    let took_over = tell_to_take_over(shards, shard, successor, stepped_aside).await;
    match took_over {
        Ok(leader) if leader == successor => {
            tracing::info!(shard, to = successor, "shard handed off");
        }
        Ok(leader) => {
            tracing::info!(
                shard,
                successor,
                leader,
                "shard elected another leader while handed off"
            );
        }
        Err(why) => {
            tracing::warn!(shard, successor, %why, "the successor did not take the shard over; it elects a leader once this node stops");
        }
    }
}

/// Asks `successor` to take `shard` over: the leader it settled on.
async fn tell_to_take_over(
    shards: &Shards,
    shard: ShardId,
    successor: NodeId,
    stepped_aside: super::hand_back::SteppedAside,
) -> Result<NodeId, String> {
    let mut client = shards
        .peers()
        .peer_client(successor)
        .ok_or_else(|| format!("node {successor} is not a member"))?;
    let request = TakeLeadershipRequest {
        shard_id: shard,
        node_id: shards.node_id(),
        leader_last_log_index: stepped_aside.last_log_index,
        wait_ms: stepped_aside.elect_within.as_millis() as u64,
    };
    let answer = client
        .take_leadership(request)
        .await
        .map_err(|status| status.message().to_owned())?;
    match answer.into_inner().leader_id {
        0 => Err("no leader settled in time".to_owned()),
        leader => Ok(leader),
    }
}
