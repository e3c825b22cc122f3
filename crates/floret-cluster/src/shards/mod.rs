//! The shards on this node: one openraft group per shard of the cluster,
//! all on the node's one database, created at start and shut down
//! together, and the routing that says which node to ask about a shard.
//!
//! Every node opens the group of every shard, and holds a replica of those
//! whose raft membership names it ([`Shards::holds`]): the ones it was
//! placed on at the cluster's first start, and those a leader moved to it
//! since (a group this node holds no replica of stays uninitialised, and
//! costs an idle task and its empty trees).
//!
//! Beside the shards, every member holds a replica of the membership group
//! ([`MEMBERSHIP_GROUP`]): a raft group whose own membership is the
//! cluster's member list, founded at a cluster's first start like a shard.
//! It applies nothing else. The current replica placement follows it
//! (`members.rs`).
//!
//! - `group.rs`: one shard's group, and opening it.
//! - `bootstrap.rs`: founding new groups, never twice.
//! - `vote_guard.rs`: a node that may have forgotten a vote or an entry it
//!   acknowledged grants no vote until a leader reaches it.
//! - `take_over.rs`: a voter whose log is ahead of a refused candidate's
//!   calls its own election when no leader is heard.
//! - `tuning.rs`: raft timing and snapshot tunables.
//! - `members.rs`: the member list as the membership group holds it, and
//!   the peers and placement that follow it.
//! - `member_changes.rs`: adding and removing members.
//! - `retirement.rs`: replacing the group of a replica moved away with a
//!   fresh one, deleting its state.
//!
//! A shard's group can be replaced while the node runs (a retired
//! replica's group by a fresh one), so each is held in a watch channel:
//! what uses a group for long (a proposer, the leadership watcher) looks
//! it up there each time, or follows the channel.
//!
//! IMPLEMENTATION CAVEATS
//! - Every node opens every shard's group, so the shard count bounds the
//!   groups per node, not the replicas it holds.

mod bootstrap;
mod group;
mod member_changes;
mod members;
mod retirement;
mod take_over;
mod tuning;
mod vote_guard;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use floret_store::{AppliedListener, Database, NodeId, OpenError, Raft, ShardId, ShardStorage};
use tokio::sync::watch;

pub use group::ShardGroup;
use group::open_group;
pub use member_changes::{
    MAX_MEMBERSHIP_VOTERS, MemberChange, MemberChangeError, membership_voters,
};
pub use members::{Member, MembersView};
pub use tuning::RaftTuning;
pub use vote_guard::VOTE_GUARD;

use crate::gossip::{Liveness, View};
use crate::peers::Peers;
use crate::placement::{ReplicaPlacement, ShardPlacement};
use take_over::LeaderContact;
use tuning::raft_config;

/// The id of the membership group, outside the range of shard ids.
pub const MEMBERSHIP_GROUP: ShardId = ShardId::MAX;

/// Why the shards could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShardsError {
    /// The data dir refused the configuration.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// sled failed to open a shard's trees.
    #[error("cannot open the trees of shard {shard}: {source}")]
    Trees {
        /// The shard.
        shard: ShardId,
        /// The sled failure.
        #[source]
        source: sled::Error,
    },
    /// A member's address the membership group holds cannot be dialled.
    #[error(transparent)]
    Peers(#[from] crate::peers::PeersError),
    /// openraft refused the configuration or failed to start a group.
    #[error("cannot start the raft group of shard {shard}: {reason}")]
    Raft {
        /// The shard.
        shard: ShardId,
        /// openraft's complaint.
        reason: String,
    },
}

/// The shards this node holds, and the placements that say where every
/// producer and every shard lives.
pub struct Shards {
    peers: Arc<Peers>,
    /// Every shard's group, and the membership group's, each replaceable.
    groups: BTreeMap<ShardId, watch::Sender<Arc<ShardGroup>>>,
    /// What a replaced group is opened on.
    storage: ShardStorage,
    raft_config: Arc<openraft::Config>,
    events: AppliedListener,
    placement: ShardPlacement,
    /// Where the shards were placed at the cluster's first start: what
    /// founds them, and what the data dir and the peers' probes compare.
    founding: ReplicaPlacement,
    /// Where the shards are placed over the current members.
    replicas: RwLock<Arc<ReplicaPlacement>>,
    replication_factor: usize,
    /// The peer addresses this node was configured with: they win over the
    /// membership group's for the members they name (a node may reach a
    /// peer through its own route).
    configured_addresses: BTreeMap<NodeId, String>,
    tuning: RaftTuning,
    view: OnceLock<tokio::sync::watch::Receiver<Arc<View>>>,
    /// Shards that refuse to grant votes until the instant given (or until
    /// a leader reaches them), and why.
    vote_guard: Mutex<BTreeMap<ShardId, Instant>>,
    /// Whether the guard was set only because the data dir is new (lifted
    /// for shards no peer has, see [`Shards::bootstrap`]).
    guard_for_new_data_dir: bool,
    /// Whether a peer has asked which shards exist here (as a peer founding
    /// a new cluster's shards does).
    asked_which_shards_exist: std::sync::atomic::AtomicBool,
    /// When each shard last heard from a leader.
    leader_contact: BTreeMap<ShardId, Arc<LeaderContact>>,
    /// Set once the groups are shut down: a group opened after that (a
    /// retired replica's fresh one) is shut down at once.
    stopped: Mutex<bool>,
}

impl Shards {
    /// Opens the raft group of every shard and the membership group. The
    /// groups do not elect until [`Shards::bootstrap`] has run (or a peer's
    /// leader reaches them), so the node can serve its peers first.
    /// `founding_members` are the members of the cluster's first start;
    /// `peers` holds the members as this node was configured or told when
    /// joining, until the membership group says otherwise.
    pub async fn open(
        peers: Arc<Peers>,
        founding_members: &[NodeId],
        database: &Database,
        shard_count: u32,
        replication_factor: usize,
        tuning: &RaftTuning,
        events: AppliedListener,
    ) -> Result<Self, ShardsError> {
        database.claim_shard_count(shard_count)?;
        let founding = ReplicaPlacement::new(shard_count, founding_members, replication_factor);
        database.claim_placement(founding.description())?;
        let configured_addresses: BTreeMap<NodeId, String> = peers
            .node_ids()
            .into_iter()
            .filter_map(|node| Some((node, peers.address(node)?)))
            .collect();
        let config =
            Arc::new(raft_config(tuning).map_err(|reason| ShardsError::Raft { shard: 0, reason })?);
        let lost_tail = database.log_cut_at_open() > 0;
        let new_data_dir = database.created() && peers.others().next().is_some();
        let storage = database.shard_storage();
        let mut groups = BTreeMap::new();
        for shard in (0..shard_count).chain([MEMBERSHIP_GROUP]) {
            let group = open_group(shard, &peers, &config, &storage, &events, lost_tail).await?;
            groups.insert(shard, group);
        }
        let mut vote_guard = BTreeMap::new();
        if lost_tail {
            tracing::warn!(
                log_bytes_cut = database.log_cut_at_open(),
                new_data_dir,
                "this node may have lost votes or entries it acknowledged: it grants no vote until a leader reaches it"
            );
        } else if new_data_dir {
            tracing::info!(
                "new data dir: no vote until the peers have said whether the cluster already exists (a new cluster starts at once; a node rejoining after losing its data waits for a leader)"
            );
        }
        if lost_tail || new_data_dir {
            let until = Instant::now() + VOTE_GUARD;
            for (&shard, group) in &groups {
                group.raft.runtime_config().elect(false);
                vote_guard.insert(shard, until);
            }
        }
        let opened = Instant::now();
        let groups: BTreeMap<ShardId, watch::Sender<Arc<ShardGroup>>> = groups
            .into_iter()
            .map(|(shard, group)| (shard, watch::Sender::new(Arc::new(group))))
            .collect();
        let shards = Self {
            leader_contact: groups
                .keys()
                .map(|&shard| (shard, Arc::new(LeaderContact::new(opened))))
                .collect(),
            vote_guard: Mutex::new(vote_guard),
            stopped: Mutex::new(false),
            guard_for_new_data_dir: new_data_dir && !lost_tail,
            asked_which_shards_exist: std::sync::atomic::AtomicBool::new(false),
            peers,
            groups,
            storage,
            raft_config: config,
            events,
            placement: ShardPlacement::new(shard_count),
            replicas: RwLock::new(Arc::new(founding.clone())),
            founding,
            replication_factor,
            configured_addresses,
            tuning: tuning.clone(),
            view: OnceLock::new(),
        };
        shards.follow_members()?;
        Ok(shards)
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.peers.node_id()
    }

    /// The cluster's members.
    pub fn peers(&self) -> &Arc<Peers> {
        &self.peers
    }

    /// The shard's group on this node, if this node holds a replica of it.
    pub fn group(&self, shard: ShardId) -> Option<Arc<ShardGroup>> {
        self.opened_group(shard)
            .filter(|group| self.holds_replica(group))
    }

    /// The shards this node holds, in id order.
    pub fn groups(&self) -> impl Iterator<Item = Arc<ShardGroup>> + '_ {
        self.opened_groups()
            .filter(|group| self.holds_replica(group))
    }

    /// The shards this node holds, and those the placement puts on it that
    /// no leader has reached yet (at a cluster's first start, before they
    /// are founded): what a starting node waits to see led.
    pub fn placed_or_held_groups(&self) -> impl Iterator<Item = Arc<ShardGroup>> + '_ {
        let placement = self.replicas();
        let node_id = self.node_id();
        self.opened_groups()
            .filter(move |group| placement.holds(node_id, group.id) || self.holds_replica(group))
    }

    /// The group of `shard` on this node now, whether or not it holds a
    /// replica of it (a replica may move here later). It is replaced when
    /// a replica moved away retires: hold [`Shards::group_changes`] to
    /// follow it.
    pub fn opened_group(&self, shard: ShardId) -> Option<Arc<ShardGroup>> {
        (shard != MEMBERSHIP_GROUP)
            .then(|| self.any_group(shard))
            .flatten()
    }

    /// The group of `shard` now and every group that replaces it later.
    pub fn group_changes(&self, shard: ShardId) -> Option<watch::Receiver<Arc<ShardGroup>>> {
        self.groups.get(&shard).map(watch::Sender::subscribe)
    }

    /// The group of every shard, in id order.
    pub fn opened_groups(&self) -> impl Iterator<Item = Arc<ShardGroup>> + '_ {
        self.groups
            .range(..MEMBERSHIP_GROUP)
            .map(|(_, group)| group.borrow().clone())
    }

    /// A shard's group or the membership group's.
    fn any_group(&self, group: ShardId) -> Option<Arc<ShardGroup>> {
        self.groups.get(&group).map(|group| group.borrow().clone())
    }

    /// Every shard's group, then the membership group.
    fn all_groups(&self) -> Vec<Arc<ShardGroup>> {
        self.groups
            .values()
            .map(|group| group.borrow().clone())
            .collect()
    }

    /// The membership group.
    fn membership_group(&self) -> Arc<ShardGroup> {
        self.any_group(MEMBERSHIP_GROUP)
            .expect("every node opens the membership group")
    }

    /// Whether this node holds a replica of `shard` now: its group's
    /// membership, as this replica knows it, names this node as a voter,
    /// or as a learner the placement puts there (one catching up). A
    /// learner the placement does not name is a replica moved away, about
    /// to be dropped.
    pub fn holds(&self, shard: ShardId) -> bool {
        self.opened_group(shard)
            .is_some_and(|group| self.holds_replica(&group))
    }

    /// Whether `node` votes in `shard` as this node's replica knows it (a
    /// replica moving to a node is a learner first).
    pub fn votes_in(&self, shard: ShardId, node: NodeId) -> bool {
        self.opened_group(shard).is_some_and(|group| {
            group
                .raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .voter_ids()
                .any(|voter| voter == node)
        })
    }

    fn holds_replica(&self, group: &ShardGroup) -> bool {
        let node_id = self.node_id();
        let metrics = group.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        if membership.voter_ids().any(|voter| voter == node_id) {
            return true;
        }
        membership.learner_ids().any(|learner| learner == node_id)
            && self.replicas().holds(node_id, group.id)
    }

    /// The shards this node holds, then the membership group: every raft
    /// group here, for checks that compare replicas.
    pub fn groups_and_membership(&self) -> impl Iterator<Item = Arc<ShardGroup>> + '_ {
        self.groups()
            .chain(std::iter::once(self.membership_group()))
    }

    /// The raft group a peer's raft call names: a shard's (held here or
    /// not, as a leader may be adding this node), or the membership group's.
    pub fn raft(&self, group: ShardId) -> Option<Raft> {
        self.any_group(group).map(|group| group.raft.clone())
    }

    /// Producer -> shard placement.
    pub fn placement(&self) -> &ShardPlacement {
        &self.placement
    }

    /// Shard -> replica set placement over the current members.
    pub fn replicas(&self) -> Arc<ReplicaPlacement> {
        self.replicas
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Shard -> replica set placement at the cluster's first start.
    pub fn founding(&self) -> &ReplicaPlacement {
        &self.founding
    }

    /// How many replicas each shard has (every member when fewer).
    pub fn replication_factor(&self) -> usize {
        self.replication_factor
    }

    /// The raft tuning every group runs with.
    pub fn tuning(&self) -> &RaftTuning {
        &self.tuning
    }

    /// Whether this node currently leads `shard`.
    pub fn leads(&self, shard: ShardId) -> bool {
        self.leader_of(shard) == Some(self.node_id())
    }

    /// The leader of `shard` as this node knows it: from its own replica, or,
    /// for a shard it does not hold, None.
    pub fn leader_of(&self, shard: ShardId) -> Option<NodeId> {
        self.group(shard)
            .and_then(|group| group.raft.metrics().borrow().current_leader)
    }

    /// Lets [`Shards::route`] take leaders of shards this node does not
    /// hold from the gossip view (set once, when gossip has started).
    pub fn attach_view(&self, view: tokio::sync::watch::Receiver<Arc<View>>) {
        let _already_attached = self.view.set(view);
    }

    /// The gossip view's verdict on `node`, if there is a view that knows it.
    pub fn liveness(&self, node: NodeId) -> Option<Liveness> {
        let view = self.view.get()?.borrow().clone();
        view.get(&node).map(|seen| seen.liveness)
    }

    /// Where a request for `shard` should go: its leader as this node's own
    /// replica knows it; else the node that gossips leading it (alive before
    /// suspected, the most recently heard first); else its preferred replica.
    pub fn route(&self, shard: ShardId) -> NodeId {
        self.leader_of(shard)
            .or_else(|| {
                let view = self.view.get()?.borrow().clone();
                view.iter()
                    .filter(|(_, node)| {
                        node.liveness != Liveness::Dead && node.report.shards_led.contains(&shard)
                    })
                    .min_by_key(|(_, node)| (node.liveness != Liveness::Alive, node.age))
                    .map(|(&node, _)| node)
            })
            .unwrap_or_else(|| self.replicas().preferred_leader(shard))
    }

    /// Stops every raft group.
    pub async fn shutdown(&self) {
        let groups = {
            let mut stopped = self
                .stopped
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            *stopped = true;
            self.all_groups()
        };
        for group in groups {
            if let Err(error) = group.raft.shutdown().await {
                tracing::warn!(shard = group.id, %error, "raft group did not stop cleanly");
            }
        }
    }
}
