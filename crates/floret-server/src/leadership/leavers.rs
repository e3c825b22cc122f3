//! Members that leave: on the membership group's leader, a member marked
//! leaving (`floret cluster remove-node`) is taken out of the group once
//! every shard's leader reports a configuration without it and its own
//! report shows no replica left to retire (`retire.rs`; or it does not
//! answer), so it stays reachable, and keeps receiving the member list,
//! for as long as a shard still moves off it or it still deletes a
//! replica's state. Checked every [`LEAVER_CHECK`] from every node's own
//! view (the one `floret status` merges).
//!
//! IMPLEMENTATION CAVEATS
//! - A shard whose leader does not answer keeps every leaving member in
//!   the group until it does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::Shards;
use floret_proto::v1::ClusterStatusResponse;
use floret_store::{NodeId, ShardId};
use tokio::task::JoinHandle;

use crate::service::admin::AdminService;

/// How often the membership group's leader looks at its leaving members.
const LEAVER_CHECK: Duration = Duration::from_secs(1);

/// Starts the check of this node (it acts only while it leads the
/// membership group).
pub fn spawn(shards: Arc<Shards>, admin: Arc<AdminService>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(LEAVER_CHECK).await;
            let members = shards.members_view();
            if members.leader != Some(shards.node_id()) {
                continue;
            }
            let leaving: Vec<NodeId> = members
                .members
                .iter()
                .filter(|member| member.leaving && !member.voter)
                .map(|member| member.id)
                .collect();
            if leaving.is_empty() {
                continue;
            }
            let views = admin.node_views().await;
            let shard_count = shards.placement().shard_count();
            for node in leaving {
                if holds_no_replica(&views, shard_count, node)
                    && retired_its_replicas(&views, node)
                    && let Err(error) = shards.forget_leaving_member(node).await
                {
                    tracing::warn!(node, %error, "the leaving member is still in the membership group");
                }
            }
        }
    })
}

/// Whether every shard's leader, in its own report among `views`, names
/// a configuration without `node` (a shard no leader reported for keeps
/// the answer no).
fn holds_no_replica(
    views: &BTreeMap<NodeId, Result<ClusterStatusResponse, String>>,
    shard_count: u32,
    node: NodeId,
) -> bool {
    let leaders_reports: BTreeMap<ShardId, &floret_proto::v1::ShardStatus> = views
        .iter()
        .filter_map(|(&reporter, view)| Some((reporter, view.as_ref().ok()?)))
        .flat_map(|(reporter, view)| {
            view.shards
                .iter()
                .filter(move |shard| shard.leader_id == reporter)
                .map(|shard| (shard.shard_id, shard))
        })
        .collect();
    (0..shard_count).all(|shard| {
        leaders_reports.get(&shard).is_some_and(|report| {
            !report.voters.contains(&node) && !report.learners.contains(&node)
        })
    })
}

/// Whether `node`'s own report among `views` shows no replica it still
/// has to retire; a node that does not answer takes its state with it.
fn retired_its_replicas(
    views: &BTreeMap<NodeId, Result<ClusterStatusResponse, String>>,
    node: NodeId,
) -> bool {
    let Some(Ok(view)) = views.get(&node) else {
        return true;
    };
    view.nodes
        .iter()
        .filter(|status| status.node_id == node)
        .all(|status| status.stale_replicas.is_empty())
}

#[cfg(test)]
mod tests {
    use floret_proto::v1::ShardStatus;

    use super::*;

    fn leader_of(
        shard: ShardId,
        leader: NodeId,
        voters: &[NodeId],
        learners: &[NodeId],
    ) -> ShardStatus {
        ShardStatus {
            shard_id: shard,
            leader_id: leader,
            voters: voters.to_vec(),
            learners: learners.to_vec(),
            ..Default::default()
        }
    }

    fn views(
        reports: &[(NodeId, Vec<ShardStatus>)],
    ) -> BTreeMap<NodeId, Result<ClusterStatusResponse, String>> {
        reports
            .iter()
            .map(|(node, shards)| {
                let view = ClusterStatusResponse {
                    node_id: *node,
                    shards: shards.clone(),
                    ..Default::default()
                };
                (*node, Ok(view))
            })
            .collect()
    }

    #[test]
    fn a_leaving_member_still_voting_in_a_shard_is_kept() {
        let views = views(&[
            (1, vec![leader_of(0, 1, &[1, 3, 4], &[])]),
            (3, vec![leader_of(1, 3, &[1, 2, 3], &[])]),
        ]);
        assert!(!holds_no_replica(&views, 2, 2));
        assert!(holds_no_replica(&views, 1, 2));
    }

    #[test]
    fn a_leaving_member_kept_as_a_learner_is_kept() {
        let views = views(&[(1, vec![leader_of(0, 1, &[1, 3, 4], &[2])])]);
        assert!(!holds_no_replica(&views, 1, 2));
    }

    #[test]
    fn a_leaving_member_still_deleting_a_replica_is_kept_until_it_has() {
        let own_report = |stale: Vec<ShardId>| {
            let view = ClusterStatusResponse {
                node_id: 2,
                nodes: vec![floret_proto::v1::NodeStatus {
                    node_id: 2,
                    stale_replicas: stale,
                    ..Default::default()
                }],
                ..Default::default()
            };
            BTreeMap::from([(2, Ok(view))])
        };
        assert!(!retired_its_replicas(&own_report(vec![0]), 2));
        assert!(retired_its_replicas(&own_report(Vec::new()), 2));
        let silent = BTreeMap::from([(2, Err("no answer".to_owned()))]);
        assert!(
            retired_its_replicas(&silent, 2),
            "a dead member cannot be waited for"
        );
    }

    #[test]
    fn a_follower_report_does_not_speak_for_the_leader() {
        let mut views = views(&[(3, vec![leader_of(0, 1, &[1, 3, 4], &[])])]);
        assert!(!holds_no_replica(&views, 1, 2), "no leader answered");
        views.insert(1, Err("no answer".into()));
        assert!(!holds_no_replica(&views, 1, 2));
    }
}
