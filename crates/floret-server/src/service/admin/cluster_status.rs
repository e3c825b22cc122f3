//! Cluster status: this node's own view (itself and the shards it holds)
//! and every node's views merged, each shard as its leader reports it,
//! with every replica's progress and every node's gossip verdict, and the
//! member list as the membership group holds it.

use std::collections::BTreeMap;

use floret_cluster::MembersView;
use floret_proto::v1;

use super::AdminService;

/// The member list in its wire form.
pub(crate) fn membership(view: MembersView) -> v1::Membership {
    v1::Membership {
        epoch: view.epoch,
        leader_id: view.leader.unwrap_or(0),
        members: view
            .members
            .into_iter()
            .map(|member| v1::Member {
                node_id: member.id,
                peer_address: member.peer_address,
                voter: member.voter,
                leaving: member.leaving,
                seat: member.seat,
            })
            .collect(),
    }
}

/// Whether the configuration `metrics` show is a single one (not joint)
/// that the replica has applied, so committed.
fn configuration_committed(metrics: &openraft::RaftMetrics<u64, openraft::BasicNode>) -> bool {
    let stored = &metrics.membership_config;
    stored.membership().get_joint_config().len() == 1
        && stored.log_id().is_some()
        && *stored.log_id() <= metrics.last_applied
}

/// Of the member lists the nodes reported, the one at the highest epoch
/// (the leader's first among equals).
fn latest_membership(
    views: &BTreeMap<u64, Result<v1::ClusterStatusResponse, String>>,
) -> Option<v1::Membership> {
    views
        .iter()
        .filter_map(|(&node, view)| Some((node, view.as_ref().ok()?.membership.as_ref()?)))
        .max_by_key(|(node, membership)| (membership.epoch, membership.leader_id == *node))
        .map(|(_, membership)| membership.clone())
}

impl AdminService {
    /// This node's own view: itself, and the shards it holds.
    pub(crate) fn local_view(&self) -> v1::ClusterStatusResponse {
        let node_id = self.shards.node_id();
        let replicas = self.shards.replicas();
        let shards: Vec<v1::ShardStatus> = self
            .shards
            .groups()
            .map(|group| {
                let metrics = group.raft.metrics().borrow().clone();
                v1::ShardStatus {
                    shard_id: group.id,
                    leader_id: metrics.current_leader.unwrap_or(0),
                    term: metrics.current_term,
                    applied_index: metrics.last_applied.map(|id| id.index).unwrap_or(0),
                    last_log_index: metrics.last_log_index.unwrap_or(0),
                    voters: metrics.membership_config.membership().voter_ids().collect(),
                    learners: metrics
                        .membership_config
                        .membership()
                        .learner_ids()
                        .collect(),
                    preferred_leader_id: replicas.preferred_leader(group.id),
                    placed: replicas.replicas(group.id).to_vec(),
                    replicas: Vec::new(),
                    backlog_messages: group.reader.totals().messages(),
                    backlog_bytes: group.reader.totals().bytes(),
                    configuration_committed: configuration_committed(&metrics),
                }
            })
            .collect();
        let shards_led = shards.iter().filter(|s| s.leader_id == node_id).count() as u32;
        v1::ClusterStatusResponse {
            node_id,
            nodes: vec![v1::NodeStatus {
                node_id,
                address: self.address.clone(),
                reachable: true,
                shards_led,
                resident_bytes: crate::telemetry::resident_bytes().unwrap_or(0),
                fault: self.fault.reason().unwrap_or_default(),
                gossip_address: self
                    .gossip
                    .as_ref()
                    .map(|gossip| gossip.advertise.to_string())
                    .unwrap_or_default(),
                gossip_warning: self
                    .gossip
                    .as_ref()
                    .and_then(|gossip| gossip.warning.borrow().clone())
                    .unwrap_or_default(),
                stale_replicas: self.shards.stale_replicas(),
                ..Default::default()
            }],
            shards,
            membership: Some(membership(self.shards.members_view())),
        }
    }

    /// Every node's view merged: each shard as its leader reports it (else
    /// the replica with the highest term), with every replica's progress.
    pub(super) fn merge(
        &self,
        views: BTreeMap<u64, Result<v1::ClusterStatusResponse, String>>,
    ) -> v1::ClusterStatusResponse {
        let mut nodes = self.merge_nodes(&views);
        let shards = self.merge_shards(&views);
        self.add_gossip_verdicts(&mut nodes);
        v1::ClusterStatusResponse {
            node_id: self.shards.node_id(),
            nodes,
            shards,
            membership: latest_membership(&views),
        }
    }

    /// Each node as it reports itself, or unreachable with why.
    fn merge_nodes(
        &self,
        views: &BTreeMap<u64, Result<v1::ClusterStatusResponse, String>>,
    ) -> Vec<v1::NodeStatus> {
        let peers = self.shards.peers();
        views
            .iter()
            .map(|(&node_id, view)| match view {
                Ok(view) => v1::NodeStatus {
                    peer_address: peers.address(node_id).unwrap_or_default(),
                    ..view.nodes.first().cloned().unwrap_or_default()
                },
                Err(error) => v1::NodeStatus {
                    node_id,
                    peer_address: peers.address(node_id).unwrap_or_default(),
                    reachable: false,
                    error: error.clone(),
                    ..Default::default()
                },
            })
            .collect()
    }

    /// Each shard as its leader reports it (else the replica with the
    /// highest term), with the applied index and lag of every replica that
    /// report names (its voters and learners; the placement's replicas when
    /// no node reported the shard).
    fn merge_shards(
        &self,
        views: &BTreeMap<u64, Result<v1::ClusterStatusResponse, String>>,
    ) -> Vec<v1::ShardStatus> {
        let reports: BTreeMap<(u32, u64), &v1::ShardStatus> = views
            .iter()
            .filter_map(|(&node, view)| view.as_ref().ok().map(|view| (node, view)))
            .flat_map(|(node, view)| view.shards.iter().map(move |s| ((s.shard_id, node), s)))
            .collect();
        let placement = self.shards.replicas();
        (0..self.shards.placement().shard_count())
            .map(|shard| {
                let best = reports
                    .range((shard, 0)..=(shard, u64::MAX))
                    .map(|(&(_, node), s)| (node, *s))
                    .max_by_key(|(node, s)| (s.leader_id == *node, s.term, s.last_log_index))
                    .map(|(_, s)| s.clone());
                let replicas: Vec<u64> = match &best {
                    Some(best) => best.voters.iter().chain(&best.learners).copied().collect(),
                    None => placement.replicas(shard).to_vec(),
                };
                let best = best.unwrap_or_else(|| v1::ShardStatus {
                    shard_id: shard,
                    preferred_leader_id: placement.preferred_leader(shard),
                    placed: placement.replicas(shard).to_vec(),
                    ..Default::default()
                });
                let replica_statuses = replicas
                    .iter()
                    .map(|&node| match reports.get(&(shard, node)) {
                        Some(report) => v1::ReplicaStatus {
                            node_id: node,
                            reachable: true,
                            applied_index: report.applied_index,
                            lag: best.last_log_index.saturating_sub(report.applied_index),
                        },
                        None => v1::ReplicaStatus {
                            node_id: node,
                            ..Default::default()
                        },
                    })
                    .collect();
                v1::ShardStatus {
                    replicas: replica_statuses,
                    ..best
                }
            })
            .collect()
    }

    /// What the gossip view says of each node: liveness, heartbeat age and load.
    fn add_gossip_verdicts(&self, nodes: &mut [v1::NodeStatus]) {
        let Some(gossip) = &self.gossip else {
            return;
        };
        let view = gossip.view.borrow().clone();
        for node in nodes {
            let Some(seen) = view.get(&node.node_id) else {
                node.liveness = "unknown".into();
                continue;
            };
            node.liveness = seen.liveness.as_str().into();
            node.heartbeat_age_ms = seen.age.as_millis() as u64;
            let queues = seen.report.queues.values();
            node.backlog_messages = queues.clone().map(|q| q.messages).sum();
            node.backlog_bytes = queues.clone().map(|q| q.bytes).sum();
            node.backlogged_producers = queues.clone().map(|q| q.backlogged_producers).sum();
            node.dispatch_rate = queues.map(|q| q.dispatch_rate).sum();
        }
    }
}
