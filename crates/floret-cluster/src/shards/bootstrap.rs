//! Bootstrap: founding the groups of the shards this node is the
//! preferred replica of (and the membership group, if this node has the
//! lowest id), and asking the peers which shards they have.
//!
//! Bootstrap never founds a group twice. Only a shard's preferred replica
//! initialises it, and only once every other replica has answered that its
//! own replica was never initialised either. So three nodes started together
//! on empty data dirs form the cluster; a node restarted on an existing
//! data dir simply rejoins; and a node whose data dir was wiped hears from
//! the others that the shard exists and waits for its leader to send the
//! log or a snapshot. Until every other replica answers, the preferred
//! replica keeps asking (a group cannot form without a majority anyway).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use floret_proto::peer::v1::{ShardStatesRequest, ShardStatesResponse};
use floret_store::{NodeId, ShardId};
use openraft::BasicNode;

use super::{MEMBERSHIP_GROUP, Shards, ShardsError};

/// How long bootstrap waits for a peer to say which shards it has.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between two bootstrap rounds while some peer has not answered.
pub(super) const PROBE_INTERVAL: Duration = Duration::from_millis(500);

impl Shards {
    /// Founds the groups this node is the preferred replica of and that no
    /// replica has ever initialised; asks a lone voter to elect at once.
    /// Returns when every such group is founded or known to exist elsewhere,
    /// and every vote guard is lifted.
    pub async fn bootstrap(&self) -> Result<(), ShardsError> {
        if self.guard_for_new_data_dir {
            self.lift_vote_guard_where_new().await;
        }
        let node_id = self.node_id();
        let mut to_found = Vec::new();
        for group in self.all_groups() {
            let shard = group.id;
            let raft_error = |e: openraft::error::Fatal<NodeId>| ShardsError::Raft {
                shard,
                reason: e.to_string(),
            };
            if group.raft.is_initialized().await.map_err(raft_error)? {
                let lone_voter = group
                    .raft
                    .metrics()
                    .borrow()
                    .membership_config
                    .membership()
                    .voter_ids()
                    .eq([node_id]);
                if lone_voter {
                    group.raft.trigger().elect().await.map_err(raft_error)?;
                }
            } else if self.founder(shard) == node_id {
                to_found.push(shard);
            }
        }
        while !to_found.is_empty() {
            let answers = self.probe_peers().await;
            let mut still_waiting = Vec::new();
            for shard in to_found {
                let (initialised_elsewhere, all_answered) = self.presence(shard, &answers);
                if initialised_elsewhere {
                    tracing::info!(shard, "shard exists on its other replicas; joining it");
                } else if all_answered {
                    self.found(shard).await?;
                } else {
                    still_waiting.push(shard);
                }
            }
            to_found = still_waiting;
            if !to_found.is_empty() {
                tracing::debug!(shards = ?to_found, "waiting for every replica to answer before founding");
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
        }
        self.release_vote_guards().await;
        Ok(())
    }

    async fn found(&self, shard: ShardId) -> Result<(), ShardsError> {
        let members: BTreeMap<NodeId, BasicNode> = self
            .replica_ids(shard)
            .into_iter()
            .map(|node| {
                let address = self.peers.address(node).unwrap_or_default();
                (node, BasicNode::new(address))
            })
            .collect();
        let voters: Vec<&NodeId> = members.keys().collect();
        if shard == MEMBERSHIP_GROUP {
            tracing::info!(?voters, "founding the membership group");
        } else {
            tracing::info!(shard, ?voters, "founding shard");
        }
        let group = self
            .any_group(shard)
            .expect("every group is opened at start");
        match group.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(openraft::error::RaftError::APIError(
                openraft::error::InitializeError::NotAllowed(_),
            )) => Ok(()),
            Err(error) => Err(ShardsError::Raft {
                shard,
                reason: error.to_string(),
            }),
        }
    }

    /// The nodes that hold `group` from its founding: a shard's replicas,
    /// or every founding member for the membership group.
    fn replica_ids(&self, group: ShardId) -> Vec<NodeId> {
        if group == MEMBERSHIP_GROUP {
            self.founding.members().to_vec()
        } else {
            self.founding.replicas(group).to_vec()
        }
    }

    /// The node that founds `group`: a shard's preferred replica, or the
    /// member with the lowest id for the membership group.
    fn founder(&self, group: ShardId) -> NodeId {
        if group == MEMBERSHIP_GROUP {
            self.founding.members()[0]
        } else {
            self.founding.preferred_leader(group)
        }
    }

    /// What the other replicas of `shard` said in `answers` (from
    /// [`Shards::probe_peers`]): whether any has it initialised, and
    /// whether all of them answered.
    pub(super) fn presence(
        &self,
        shard: ShardId,
        answers: &BTreeMap<NodeId, Option<BTreeSet<ShardId>>>,
    ) -> (bool, bool) {
        let node_id = self.node_id();
        let replica_ids = self.replica_ids(shard);
        let others = replica_ids.iter().filter(|&&node| node != node_id);
        let initialised_elsewhere = others
            .clone()
            .any(|node| matches!(answers.get(node), Some(Some(set)) if set.contains(&shard)));
        let all_answered = others
            .clone()
            .all(|node| matches!(answers.get(node), Some(Some(_))));
        (initialised_elsewhere, all_answered)
    }

    /// Every other member's answer: the shards it has initialised, or None
    /// when it did not answer.
    pub(super) async fn probe_peers(&self) -> BTreeMap<NodeId, Option<BTreeSet<ShardId>>> {
        let probes = self.peers.others().map(|node| {
            let client = self.peers.peer_client(node);
            async move {
                let Some(mut client) = client else {
                    return (node, None);
                };
                let answer =
                    tokio::time::timeout(PROBE_TIMEOUT, client.shard_states(ShardStatesRequest {}))
                        .await;
                match answer {
                    Ok(Ok(states)) => {
                        let states = states.into_inner();
                        if states.placement != self.founding.description() {
                            tracing::error!(
                                node,
                                theirs = states.placement,
                                ours = self.founding.description(),
                                "peer is configured with another cluster placement; not founding shards with it"
                            );
                            return (node, None);
                        }
                        let existing = existing_shards(&states, self.placement.shard_count());
                        (node, Some(existing))
                    }
                    Ok(Err(status)) => {
                        tracing::debug!(node, %status, "peer did not say which shards it has");
                        (node, None)
                    }
                    Err(_) => (node, None),
                }
            }
        });
        futures::future::join_all(probes)
            .await
            .into_iter()
            .collect()
    }

    /// Whether the membership group holds a configuration later than the
    /// founding one (the members changed since the cluster's first start).
    pub fn members_changed(&self) -> bool {
        self.membership_group()
            .raft
            .metrics()
            .borrow()
            .membership_config
            .log_id()
            .is_some_and(|log_id| log_id.index > 0)
    }

    /// The shards whose replica here has a membership or a vote (was
    /// founded, joined, or took part in an election): a group that exists.
    /// What a peer asks before it founds a shard, so this node remembers
    /// that one asked: a shard it then finds existing was founded by a
    /// peer starting a new cluster with it, not kept by a cluster it rejoins.
    pub async fn initialized(&self) -> Result<Vec<ShardId>, ShardsError> {
        self.asked_which_shards_exist
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let mut initialized = Vec::new();
        for group in self.all_groups() {
            let exists = group
                .raft
                .is_initialized()
                .await
                .map_err(|e| ShardsError::Raft {
                    shard: group.id,
                    reason: e.to_string(),
                })?;
            if exists {
                initialized.push(group.id);
            }
        }
        Ok(initialized)
    }
}

/// The shards a peer's answer says exist: those its replicas have
/// initialised, or every shard once the members changed. Every shard was
/// founded before the members first changed, and its founding replicas
/// may all have retired it since (a move took it elsewhere): a founder
/// on a wiped data dir must not found it again beside its live replicas.
fn existing_shards(states: &ShardStatesResponse, shard_count: u32) -> BTreeSet<ShardId> {
    let mut existing: BTreeSet<ShardId> = states.initialized.iter().copied().collect();
    if states.members_changed {
        existing.extend(0..shard_count);
    }
    existing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wiped_founder_does_not_found_a_shard_its_founding_replicas_retired() {
        let retired_everywhere = ShardStatesResponse {
            initialized: vec![0, 2, MEMBERSHIP_GROUP],
            placement: String::new(),
            members_changed: true,
        };
        assert_eq!(
            existing_shards(&retired_everywhere, 4),
            BTreeSet::from([0, 1, 2, 3, MEMBERSHIP_GROUP])
        );
        let first_start = ShardStatesResponse {
            initialized: vec![2],
            placement: String::new(),
            members_changed: false,
        };
        assert_eq!(existing_shards(&first_start, 4), BTreeSet::from([2]));
    }
}
