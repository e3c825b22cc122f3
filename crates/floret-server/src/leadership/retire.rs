//! Retiring this node's replicas that a move took away: a shard whose
//! replica here still holds state (`Shards::stale_replicas`: the placement
//! over the current members puts it elsewhere) loses that state once the
//! node that reports leading the shard, at a term at least this replica's,
//! reports a committed configuration (not a joint one mid-change) that
//! names this node neither as voter nor as learner. The group is stopped,
//! the report asked for again (a stopped replica acks nothing more, so a
//! configuration that excludes it then cannot come to count on it), and
//! only then is the state deleted and a fresh group opened; if the check
//! fails then, the group opens again on the state it kept.
//!
//! Until then a replica moved away keeps its state, and its stored
//! messages keep the raft log segments their payloads lie in.
//!
//! IMPLEMENTATION CAVEATS
//! - A shard whose leader does not answer keeps its stale replicas here.
//! - Retirements run one at a time, every [`RETIRE_CHECK`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::Shards;
use floret_proto::v1::ClusterStatusResponse;
use floret_store::{NodeId, ShardId};
use tokio::task::JoinHandle;

use crate::service::admin::AdminService;

/// How often a node looks for replicas of its own to retire.
pub const RETIRE_CHECK: Duration = Duration::from_secs(2);

/// Starts the retirement of this node's stale replicas.
pub fn spawn(shards: Arc<Shards>, admin: Arc<AdminService>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(RETIRE_CHECK).await;
            shards.lift_expired_vote_guards();
            let stale = shards.stale_replicas();
            if stale.is_empty() {
                continue;
            }
            let views = admin.node_views().await;
            for shard in stale {
                let own_term = shards
                    .opened_group(shard)
                    .map_or(0, |group| group.raft.metrics().borrow().current_term);
                if leader_dropped(&views, shard, shards.node_id(), own_term) {
                    retire(&shards, &admin, shard).await;
                }
            }
        }
    })
}

/// Stops the group of `shard`, checks the leader's report again, and
/// deletes the replica's state or keeps it.
async fn retire(shards: &Shards, admin: &AdminService, shard: ShardId) {
    let node = shards.node_id();
    let final_term = match shards.stop_group(shard).await {
        Ok(term) => term,
        Err(error) => {
            tracing::warn!(
                shard,
                %error,
                "cannot stop the group of a replica moved away, or read its last term: keeping the replica"
            );
            if let Err(error) = shards.restart_group(shard, false).await {
                tracing::error!(shard, %error, "cannot open the shard's group again");
            }
            return;
        }
    };
    let views = admin.node_views().await;
    let dropped = leader_dropped(&views, shard, node, final_term);
    if !dropped {
        tracing::info!(
            shard,
            "the shard's leader no longer reports a configuration without this node: keeping the replica"
        );
    }
    if let Err(error) = shards.restart_group(shard, dropped).await {
        tracing::error!(shard, %error, "cannot open the shard's group again");
    }
}

/// Whether the node that reports, in its own view among `views`, leading
/// `shard` at a term of at least `own_term` has a committed configuration
/// naming `node` neither as voter nor as learner.
fn leader_dropped(
    views: &BTreeMap<NodeId, Result<ClusterStatusResponse, String>>,
    shard: ShardId,
    node: NodeId,
    own_term: u64,
) -> bool {
    views
        .iter()
        .filter_map(|(&reporter, view)| Some((reporter, view.as_ref().ok()?)))
        .flat_map(|(reporter, view)| {
            view.shards
                .iter()
                .filter(move |status| status.shard_id == shard && status.leader_id == reporter)
        })
        .any(|leader| {
            leader.term >= own_term
                && leader.configuration_committed
                && !leader.voters.contains(&node)
                && !leader.learners.contains(&node)
        })
}

#[cfg(test)]
mod tests {
    use floret_proto::v1::ShardStatus;

    use super::*;

    fn report(
        reporter: NodeId,
        leader: NodeId,
        term: u64,
        voters: &[NodeId],
        learners: &[NodeId],
        committed: bool,
    ) -> (NodeId, Result<ClusterStatusResponse, String>) {
        let status = ShardStatus {
            shard_id: 0,
            leader_id: leader,
            term,
            voters: voters.to_vec(),
            learners: learners.to_vec(),
            configuration_committed: committed,
            ..Default::default()
        };
        let view = ClusterStatusResponse {
            node_id: reporter,
            shards: vec![status],
            ..Default::default()
        };
        (reporter, Ok(view))
    }

    #[test]
    fn a_replica_the_leader_committed_a_configuration_without_is_retired() {
        let views = BTreeMap::from([report(1, 1, 5, &[1, 3, 4], &[], true)]);
        assert!(leader_dropped(&views, 0, 2, 5));
        assert!(!leader_dropped(&views, 1, 2, 5), "another shard");
    }

    #[test]
    fn a_replica_still_named_as_voter_or_learner_is_kept() {
        let voter = BTreeMap::from([report(1, 1, 5, &[1, 2, 3], &[], true)]);
        assert!(!leader_dropped(&voter, 0, 2, 5));
        let learner = BTreeMap::from([report(1, 1, 5, &[1, 3, 4], &[2], true)]);
        assert!(!leader_dropped(&learner, 0, 2, 5));
    }

    #[test]
    fn a_replica_whose_removal_is_not_committed_is_kept() {
        let views = BTreeMap::from([report(1, 1, 5, &[1, 3, 4], &[], false)]);
        assert!(
            !leader_dropped(&views, 0, 2, 5),
            "a joint or uncommitted configuration may still count on node 2"
        );
    }

    #[test]
    fn a_leader_of_an_older_term_than_the_replica_knows_does_not_speak_for_the_shard() {
        let views = BTreeMap::from([report(1, 1, 4, &[1, 3, 4], &[], true)]);
        assert!(!leader_dropped(&views, 0, 2, 5));
    }

    #[test]
    fn a_follower_report_does_not_speak_for_the_leader() {
        let views = BTreeMap::from([
            report(3, 1, 5, &[1, 3, 4], &[], true),
            (1, Err("no answer".to_owned())),
        ]);
        assert!(!leader_dropped(&views, 0, 2, 5));
    }
}
