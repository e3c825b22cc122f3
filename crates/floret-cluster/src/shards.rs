//! The shards this node holds: one openraft group per shard whose replica
//! set includes this node, all on the node's one database, created at start
//! and shut down together; and the bootstrap that founds new groups.
//!
//! Bootstrap never founds a group twice. Only a shard's preferred replica
//! initialises it, and only once every other replica has answered that its
//! own replica was never initialised either. So three nodes started together
//! on empty data dirs form the cluster; a node restarted on an existing
//! data dir simply rejoins; and a node whose data dir was wiped hears from
//! the others that the shard exists and waits for its leader to send the
//! log or a snapshot. Until every other replica answers, the preferred
//! replica keeps asking (a group cannot form without a majority anyway).
//!
//! **Vote guard.** Raft assumes a node never forgets a vote or an entry it
//! acknowledged. A node that may have (its data dir was wiped and the
//! cluster already exists, or opening its log cut off a torn write, which a
//! disk that lost synced data leaves too) neither grants votes nor
//! campaigns until a leader has reached it, or for [`VOTE_GUARD`] at most,
//! and does not resume a leadership its stored vote records. The chaos
//! suite found each of these losing committed entries: a wiped node's vote
//! elected a replica that lacked one; a leader whose log lost its tail
//! resumed leading at start and imposed its shorter log. A new node in a
//! new cluster is guarded only until its peers have all answered that no
//! shard exists yet.
//!
//! IMPLEMENTATION CAVEATS
//! - A guarded node still accepts appends from any leader, a stale one
//!   included: a wiped node does not know the terms it voted in before.
//!   Losing data then needs a stale leader still running beside the new
//!   one at the moment of the wipe.
//! - After [`VOTE_GUARD`] without a leader (every node lost its tail in a
//!   power failure) the guard lifts and votes go by the logs as usual.
//! - Membership is fixed by configuration: no joint-consensus changes yet.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use floret_proto::peer::v1::ShardStatesRequest;
use floret_store::{
    AppliedListener, Database, NodeId, OpenError, Raft, ShardId, ShardReader, StorageError,
};
use openraft::{BasicNode, SnapshotPolicy};

use crate::gossip::{Liveness, View};
use crate::network::PeerNetwork;
use crate::peers::Peers;
use crate::placement::{ReplicaPlacement, ShardPlacement};

/// How long bootstrap waits for a peer to say which shards it has.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a node that may have forgotten votes or entries refuses to vote.
pub const VOTE_GUARD: Duration = Duration::from_secs(10);
/// How often bootstrap checks whether a guarded shard may vote again.
const GUARD_CHECK_INTERVAL: Duration = Duration::from_millis(200);
/// Pause between two bootstrap rounds while some peer has not answered.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Raft timing and snapshot tunables shared by every shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftTuning {
    /// Leader heartbeat; each group sends its own, so keep it modest on small machines.
    pub heartbeat: Duration,
    /// Lower bound of the election timeout; well above scheduling noise on a loaded 2-core box.
    /// A follower calls an election after the leader lease (the upper bound)
    /// plus a random timeout between the bounds: with 1-2 s, 3-4 s after the
    /// leader's last heartbeat.
    pub election_timeout_min: Duration,
    /// Upper bound of the election timeout; also the leader lease.
    pub election_timeout_max: Duration,
    /// Entries applied since the last snapshot before a new one is built.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot, so a briefly lagging
    /// replica catches up from the log instead of a whole snapshot.
    pub logs_kept_after_snapshot: u64,
    /// Bytes of a snapshot sent in one message to a replica that needs it.
    pub snapshot_chunk_bytes: u64,
}

impl Default for RaftTuning {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(250),
            election_timeout_min: Duration::from_millis(1_000),
            election_timeout_max: Duration::from_millis(2_000),
            snapshot_every_entries: 20_000,
            logs_kept_after_snapshot: 1_000,
            snapshot_chunk_bytes: 1024 * 1024,
        }
    }
}

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
    /// openraft refused the configuration or failed to start a group.
    #[error("cannot start the raft group of shard {shard}: {reason}")]
    Raft {
        /// The shard.
        shard: ShardId,
        /// openraft's complaint.
        reason: String,
    },
}

/// One shard on this node: its raft group and read access to its queues.
pub struct ShardGroup {
    /// The shard's index.
    pub id: ShardId,
    /// The shard's raft group.
    pub raft: Raft,
    /// Reads the shard's applied state.
    pub reader: ShardReader,
}

/// The shards this node holds, and the placements that say where every
/// producer and every shard lives.
pub struct Shards {
    peers: Arc<Peers>,
    groups: BTreeMap<ShardId, ShardGroup>,
    placement: ShardPlacement,
    replicas: ReplicaPlacement,
    tuning: RaftTuning,
    view: OnceLock<tokio::sync::watch::Receiver<Arc<View>>>,
    /// Shards that refuse to grant votes until the instant given (or until
    /// a leader reaches them), and why.
    vote_guard: Mutex<BTreeMap<ShardId, Instant>>,
    /// Whether the guard was set only because the data dir is new (lifted
    /// for shards no peer has, see [`Shards::bootstrap`]).
    guard_for_new_data_dir: bool,
}

impl Shards {
    /// Opens the raft group of every shard this node holds. The groups do
    /// not elect until [`Shards::bootstrap`] has run (or a peer's leader
    /// reaches them), so the node can serve its peers first.
    pub async fn open(
        peers: Arc<Peers>,
        database: &Database,
        shard_count: u32,
        replication_factor: usize,
        tuning: &RaftTuning,
        events: AppliedListener,
    ) -> Result<Self, ShardsError> {
        database.claim_shard_count(shard_count)?;
        let node_id = peers.node_id();
        let replicas = ReplicaPlacement::new(shard_count, &peers.node_ids(), replication_factor);
        database.claim_placement(replicas.description())?;
        let config =
            Arc::new(raft_config(tuning).map_err(|reason| ShardsError::Raft { shard: 0, reason })?);
        let lost_tail = database.log_cut_at_open() > 0;
        let new_data_dir = database.created() && peers.others().next().is_some();
        let mut groups = BTreeMap::new();
        for shard in (0..shard_count).filter(|&shard| replicas.holds(node_id, shard)) {
            let trees = |source| ShardsError::Trees { shard, source };
            let raft_error = |reason: String| ShardsError::Raft { shard, reason };
            let mut log_store = database.log_store(shard);
            if lost_tail {
                forget_leadership(&mut log_store)
                    .await
                    .map_err(|e| raft_error(e.to_string()))?;
            }
            let state_machine = database
                .state_machine(shard, Some(events.clone()))
                .map_err(trees)?;
            let reader = state_machine.reader();
            let network = PeerNetwork::new(shard, peers.clone());
            let raft = Raft::new(node_id, config.clone(), network, log_store, state_machine)
                .await
                .map_err(|e| raft_error(e.to_string()))?;
            groups.insert(
                shard,
                ShardGroup {
                    id: shard,
                    raft,
                    reader,
                },
            );
        }
        let mut vote_guard = BTreeMap::new();
        if lost_tail || new_data_dir {
            tracing::warn!(
                log_bytes_cut = database.log_cut_at_open(),
                new_data_dir,
                "this node may have lost votes or entries it acknowledged: it grants no vote until a leader reaches it"
            );
            let until = Instant::now() + VOTE_GUARD;
            for (&shard, group) in &groups {
                group.raft.runtime_config().elect(false);
                vote_guard.insert(shard, until);
            }
        }
        Ok(Self {
            vote_guard: Mutex::new(vote_guard),
            guard_for_new_data_dir: new_data_dir && !lost_tail,
            peers,
            groups,
            placement: ShardPlacement::new(shard_count),
            replicas,
            tuning: tuning.clone(),
            view: OnceLock::new(),
        })
    }

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
        for group in self.groups.values() {
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
            } else if self.replicas.preferred_leader(shard) == node_id {
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
            .replicas
            .replicas(shard)
            .iter()
            .map(|&node| {
                let address = self.peers.address(node).unwrap_or_default();
                (node, BasicNode::new(address))
            })
            .collect();
        tracing::info!(shard, voters = ?members.keys().collect::<Vec<_>>(), "founding shard");
        let group = &self.groups[&shard];
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

    /// Whether this node must refuse a vote for `shard` now (see the
    /// module's vote guard). The guard lifts once a leader other than this
    /// node is known, or when it expires.
    pub fn refuses_vote(&self, shard: ShardId) -> bool {
        let mut guard = self
            .vote_guard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(&until) = guard.get(&shard) else {
            return false;
        };
        let leader_reached_us = self.groups.get(&shard).is_some_and(|group| {
            group
                .raft
                .metrics()
                .borrow()
                .current_leader
                .is_some_and(|leader| leader != self.node_id())
        });
        if leader_reached_us || Instant::now() >= until {
            guard.remove(&shard);
            drop(guard);
            self.lift_vote_guard(shard, leader_reached_us);
            return false;
        }
        true
    }

    /// Lets `shard`'s group vote and campaign again (its guard entry is gone).
    fn lift_vote_guard(&self, shard: ShardId, leader_reached_us: bool) {
        if let Some(group) = self.groups.get(&shard) {
            group.raft.runtime_config().elect(true);
        }
        tracing::info!(shard, leader_reached_us, "vote guard lifted");
    }

    /// The shards whose vote guard is still up.
    fn guarded_shards(&self) -> Vec<ShardId> {
        self.vote_guard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .keys()
            .copied()
            .collect()
    }

    /// Checks every guarded shard until none is left, so a shard nobody
    /// asks for a vote still campaigns again once a leader reached it or
    /// the guard expired.
    async fn release_vote_guards(&self) {
        loop {
            let guarded = self.guarded_shards();
            if guarded.is_empty() {
                return;
            }
            for shard in guarded {
                self.refuses_vote(shard);
            }
            tokio::time::sleep(GUARD_CHECK_INTERVAL).await;
        }
    }

    /// For a node on a new data dir: asks the peers until each guarded
    /// shard is decided. A shard no replica has is new (the cluster is being
    /// founded), so its guard goes; one that exists elsewhere keeps it.
    async fn lift_vote_guard_where_new(&self) {
        let mut undecided: BTreeSet<ShardId> = self.guarded_shards().into_iter().collect();
        let until = Instant::now() + VOTE_GUARD;
        while !undecided.is_empty() && Instant::now() < until {
            let answers = self.probe_peers().await;
            undecided.retain(|&shard| {
                let (exists, all_answered) = self.presence(shard, &answers);
                if exists {
                    tracing::warn!(
                        shard,
                        "rejoining a shard after losing this node's data: no vote until its leader reaches us"
                    );
                    return false;
                }
                if all_answered {
                    self.vote_guard
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .remove(&shard);
                    self.lift_vote_guard(shard, false);
                    return false;
                }
                true
            });
            if !undecided.is_empty() {
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
        }
    }

    /// What the other replicas of `shard` said in `answers` (from
    /// [`Shards::probe_peers`]): whether any has it initialised, and
    /// whether all of them answered.
    fn presence(
        &self,
        shard: ShardId,
        answers: &BTreeMap<NodeId, Option<BTreeSet<ShardId>>>,
    ) -> (bool, bool) {
        let node_id = self.node_id();
        let others = self
            .replicas
            .replicas(shard)
            .iter()
            .filter(|&&node| node != node_id);
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
    async fn probe_peers(&self) -> BTreeMap<NodeId, Option<BTreeSet<ShardId>>> {
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
                        if states.placement != self.replicas.description() {
                            tracing::error!(
                                node,
                                theirs = states.placement,
                                ours = self.replicas.description(),
                                "peer is configured with another cluster placement; not founding shards with it"
                            );
                            return (node, None);
                        }
                        (node, Some(states.initialized.into_iter().collect()))
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

    /// The shards whose replica here has a membership or a vote (was
    /// founded, joined, or took part in an election): a group that exists.
    pub async fn initialized(&self) -> Result<Vec<ShardId>, ShardsError> {
        let mut initialized = Vec::new();
        for group in self.groups.values() {
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

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.peers.node_id()
    }

    /// The cluster's members.
    pub fn peers(&self) -> &Arc<Peers> {
        &self.peers
    }

    /// The shard's group on this node, if this node holds a replica of it.
    pub fn group(&self, shard: ShardId) -> Option<&ShardGroup> {
        self.groups.get(&shard)
    }

    /// The shards this node holds, in id order.
    pub fn groups(&self) -> impl Iterator<Item = &ShardGroup> {
        self.groups.values()
    }

    /// Producer -> shard placement.
    pub fn placement(&self) -> &ShardPlacement {
        &self.placement
    }

    /// Shard -> replica set placement.
    pub fn replicas(&self) -> &ReplicaPlacement {
        &self.replicas
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
            .unwrap_or_else(|| self.replicas.preferred_leader(shard))
    }

    /// Stops every raft group.
    pub async fn shutdown(&self) {
        for group in self.groups.values() {
            if let Err(error) = group.raft.shutdown().await {
                tracing::warn!(shard = group.id, %error, "raft group did not stop cleanly");
            }
        }
    }
}

fn raft_config(tuning: &RaftTuning) -> Result<openraft::Config, String> {
    let election_max = tuning.election_timeout_max.as_millis() as u64;
    let config = openraft::Config {
        cluster_name: "floret".into(),
        heartbeat_interval: tuning.heartbeat.as_millis() as u64,
        election_timeout_min: tuning.election_timeout_min.as_millis() as u64,
        election_timeout_max: election_max,
        install_snapshot_timeout: election_max.max(5_000),
        snapshot_max_chunk_size: tuning.snapshot_chunk_bytes,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(tuning.snapshot_every_entries),
        max_in_snapshot_log_to_keep: tuning.logs_kept_after_snapshot,
        ..Default::default()
    };
    config.validate().map_err(|e| e.to_string())
}

/// Rewrites a committed vote for this node as an uncommitted one, so that
/// openraft does not resume leadership from it at start: a node whose log
/// lost its tail may lack entries it committed as leader, and resuming
/// would impose its shorter log on the followers.
async fn forget_leadership(log_store: &mut floret_store::LogStore) -> Result<(), StorageError> {
    use openraft::storage::RaftLogStorage;
    if let Some(vote) = log_store.read_vote().await?
        && vote.is_committed()
    {
        log_store
            .save_vote(&openraft::Vote {
                leader_id: vote.leader_id,
                committed: false,
            })
            .await?;
    }
    Ok(())
}
