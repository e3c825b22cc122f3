//! The gossip view: what every node publishes about itself and reads about
//! the others, over chitchat (scuttlebutt anti-entropy on UDP with a
//! phi-accrual failure detector).
//!
//! Each node publishes its gRPC address, the shards it leads, per queue
//! its [`QueueLoad`] and, per tenant with limits in a queue, its
//! [`TenantLoad`]; [`Gossip::view`] returns every known node with
//! the age of its last heartbeat and a [`Liveness`] verdict: dead when
//! chitchat's failure detector says so and it has been silent for at least
//! [`DEAD_AFTER_ROUNDS`] gossip rounds, suspected when it is silent for
//! [`SUSPECT_AFTER_ROUNDS`] rounds or the detector alone gives up on it.
//! The floor matters on a loaded machine: a node hears another's heartbeat
//! both directly and through third nodes, so the detector learns very short
//! intervals and would declare a node dead after a one-second stall.
//!
//! Values are short strings (`queue:<name>` -> `p=3;w=3;m=120;b=15360;r=512.5;c=1`,
//! `gossip_values.rs`) so a node's whole state fits in a datagram or two. The transport
//! (`gossip_transport.rs`) seals every datagram with the cluster's secret,
//! drops those that fail it, and counts bytes and drops
//! ([`Gossip::traffic`]). chitchat's cluster id is the cluster's name, so
//! two clusters that share a secret still ignore each other.
//!
//! Peers are first sought at their peer ports' numbers over UDP (the
//! seeds); a member whose gossip port differs is reached through
//! [`Gossip::introduce`] once its address is learned over the peer API
//! (`gossip_reach.rs` in the server).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chitchat::{
    ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, ProtocolVersion,
    spawn_chitchat,
};
use floret_store::{NodeId, ShardId};

use crate::gossip_transport::{GossipSecret, SealedTransport, Traffic};
pub use crate::gossip_values::{QueueLoad, TenantLoad};

/// Gossip rounds without a new heartbeat after which a live node is suspected.
pub const SUSPECT_AFTER_ROUNDS: u32 = 3;
/// Gossip rounds without a new heartbeat before a node can be declared dead.
pub const DEAD_AFTER_ROUNDS: u32 = 10;
/// Key of a node's gRPC address.
const GRPC_KEY: &str = "grpc";
/// Key of the shards a node leads.
const LED_KEY: &str = "led";
/// Prefix of the per-queue load keys.
const QUEUE_PREFIX: &str = "queue:";
/// Prefix of the per-tenant load keys (`tenant:<queue>/<tenant>`; a queue
/// name has no `/`).
const TENANT_PREFIX: &str = "tenant:";

/// How a node gossips.
#[derive(Debug, Clone)]
pub struct GossipConfig {
    /// UDP address to listen on.
    pub listen: SocketAddr,
    /// UDP address the others reach this node at.
    pub advertise: SocketAddr,
    /// Where to find the other nodes (`host:port`, resolved by chitchat).
    pub seeds: Vec<String>,
    /// Pause between two gossip rounds.
    pub interval: Duration,
    /// How long a silent node may stay alive: the failure detector declares
    /// it dead once its silence is this unlikely given the intervals seen.
    pub phi_threshold: f64,
    /// The cluster's name: nodes gossip only with nodes of the same name.
    pub cluster_name: String,
    /// The secret every datagram is sealed with (none: plain datagrams).
    pub secret: Option<GossipSecret>,
}

/// Why gossip could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot start gossip on {listen}/UDP: {reason}")]
pub struct GossipError {
    listen: SocketAddr,
    reason: String,
}

/// What a node publishes about itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeReport {
    /// Shards this node leads.
    pub shards_led: Vec<ShardId>,
    /// Load per queue.
    pub queues: BTreeMap<String, QueueLoad>,
    /// Load per (queue, tenant), for tenants with limits there.
    pub tenants: BTreeMap<(String, String), TenantLoad>,
}

/// The failure detector's verdict on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Heartbeats arrive.
    Alive,
    /// Alive by the failure detector, but silent for several rounds.
    Suspected,
    /// Declared dead by the failure detector.
    Dead,
}

impl Liveness {
    /// Lower-case name, as shown to operators.
    pub fn as_str(self) -> &'static str {
        match self {
            Liveness::Alive => "alive",
            Liveness::Suspected => "suspected",
            Liveness::Dead => "dead",
        }
    }
}

/// One node as the view knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    /// Its gRPC address.
    pub grpc_address: String,
    /// Verdict of the failure detector.
    pub liveness: Liveness,
    /// Time since its heartbeat last changed (zero for this node).
    pub age: Duration,
    /// What it last published.
    pub report: NodeReport,
}

/// Every node this one has heard of, by node id (of a restarted node's
/// generations, an alive one, else the newest).
pub type View = BTreeMap<NodeId, NodeView>;

/// This node's gossip agent.
pub struct Gossip {
    handle: ChitchatHandle,
    node_id: NodeId,
    interval: Duration,
    traffic: Arc<Traffic>,
    /// Per node (by chitchat id): the last heartbeat seen and when it changed.
    heartbeats: Mutex<HashMap<ChitchatId, (u64, Instant)>>,
    published_queues: Mutex<BTreeSet<String>>,
    published_tenants: Mutex<BTreeSet<(String, String)>>,
}

impl Gossip {
    /// Starts gossiping as `node_id`, publishing `grpc_address`.
    pub async fn start(
        node_id: NodeId,
        grpc_address: &str,
        config: GossipConfig,
    ) -> Result<Self, GossipError> {
        let generation = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let chitchat_id = ChitchatId::new(node_id.to_string(), generation, config.advertise);
        let failure_detector_config = FailureDetectorConfig {
            phi_threshold: config.phi_threshold,
            initial_interval: config.interval,
            max_interval: config.interval * 10,
            dead_node_grace_period: Duration::from_secs(3_600),
            ..FailureDetectorConfig::default()
        };
        let chitchat_config = ChitchatConfig {
            chitchat_id,
            cluster_id: config.cluster_name.clone(),
            gossip_interval: config.interval,
            listen_addr: config.listen,
            seed_nodes: config.seeds.clone(),
            failure_detector_config,
            marked_for_deletion_grace_period: Duration::from_secs(3_600),
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: ProtocolVersion::V0,
        };
        let traffic = Arc::new(Traffic::default());
        let transport = SealedTransport {
            secret: config.secret.clone(),
            traffic: traffic.clone(),
        };
        let handle = spawn_chitchat(
            chitchat_config,
            vec![(GRPC_KEY.to_owned(), grpc_address.to_owned())],
            &transport,
        )
        .await
        .map_err(|error| GossipError {
            listen: config.listen,
            reason: format!("{error:#}"),
        })?;
        Ok(Self {
            handle,
            node_id,
            interval: config.interval,
            traffic,
            heartbeats: Mutex::default(),
            published_queues: Mutex::default(),
            published_tenants: Mutex::default(),
        })
    }

    /// Publishes this node's report; only changed values are gossiped.
    pub async fn publish(&self, report: &NodeReport) {
        let chitchat = self.handle.chitchat();
        let mut chitchat = chitchat.lock().await;
        let state = chitchat.self_node_state();
        let led = report
            .shards_led
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(",");
        if state.get(LED_KEY) != Some(led.as_str()) {
            state.set(LED_KEY, led);
        }
        let mut published = self.published_queues.lock().expect("gossip lock");
        for (queue, load) in &report.queues {
            let key = format!("{QUEUE_PREFIX}{queue}");
            let value = load.encode();
            if state.get(&key) != Some(value.as_str()) {
                state.set(&key, value);
            }
            published.insert(queue.clone());
        }
        published.retain(|queue| {
            let keep = report.queues.contains_key(queue);
            if !keep {
                state.delete(&format!("{QUEUE_PREFIX}{queue}"));
            }
            keep
        });
        let mut published = self.published_tenants.lock().expect("gossip lock");
        for ((queue, tenant), load) in &report.tenants {
            let key = format!("{TENANT_PREFIX}{queue}/{tenant}");
            let value = load.encode();
            if state.get(&key) != Some(value.as_str()) {
                state.set(&key, value);
            }
            published.insert((queue.clone(), tenant.clone()));
        }
        published.retain(|of| {
            let keep = report.tenants.contains_key(of);
            if !keep {
                state.delete(&format!("{TENANT_PREFIX}{}/{}", of.0, of.1));
            }
            keep
        });
    }

    /// Every node this one knows, with its liveness and last report.
    pub async fn view(&self) -> View {
        let chitchat = self.handle.chitchat();
        let chitchat = chitchat.lock().await;
        let now = Instant::now();
        let live: BTreeSet<&ChitchatId> = chitchat.live_nodes().collect();
        let self_id = chitchat.self_chitchat_id().clone();
        let mut heartbeats = self.heartbeats.lock().expect("gossip lock");
        let mut newest: BTreeMap<NodeId, (&ChitchatId, NodeView)> = BTreeMap::new();
        for (chitchat_id, state) in chitchat.node_states() {
            let Ok(node_id) = chitchat_id.node_id.parse::<NodeId>() else {
                continue;
            };
            let heartbeat = u64::from(state.heartbeat());
            let changed = heartbeats
                .entry(chitchat_id.clone())
                .and_modify(|seen| {
                    if seen.0 != heartbeat {
                        *seen = (heartbeat, now);
                    }
                })
                .or_insert((heartbeat, now))
                .1;
            let age = if *chitchat_id == self_id {
                Duration::ZERO
            } else {
                now.saturating_duration_since(changed)
            };
            let detector_gave_up = !live.contains(chitchat_id);
            let liveness = if detector_gave_up && age >= self.interval * DEAD_AFTER_ROUNDS {
                Liveness::Dead
            } else if detector_gave_up || age > self.interval * SUSPECT_AFTER_ROUNDS {
                Liveness::Suspected
            } else {
                Liveness::Alive
            };
            let report = NodeReport {
                shards_led: state
                    .get(LED_KEY)
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|s| s.parse().ok())
                    .collect(),
                queues: state
                    .key_values()
                    .filter_map(|(key, value)| {
                        key.strip_prefix(QUEUE_PREFIX)
                            .map(|queue| (queue.to_owned(), QueueLoad::decode(value)))
                    })
                    .collect(),
                tenants: state
                    .key_values()
                    .filter_map(|(key, value)| {
                        let (queue, tenant) = key.strip_prefix(TENANT_PREFIX)?.split_once('/')?;
                        Some((
                            (queue.to_owned(), tenant.to_owned()),
                            TenantLoad::decode(value),
                        ))
                    })
                    .collect(),
            };
            let view = NodeView {
                grpc_address: state.get(GRPC_KEY).unwrap_or_default().to_owned(),
                liveness,
                age,
                report,
            };
            let replace = newest.get(&node_id).is_none_or(|(known, known_view)| {
                (view.liveness == Liveness::Alive, chitchat_id.generation_id)
                    > (known_view.liveness == Liveness::Alive, known.generation_id)
            });
            if replace {
                newest.insert(node_id, (chitchat_id, view));
            }
        }
        heartbeats.retain(|id, _| chitchat.node_states().contains_key(id));
        newest
            .into_iter()
            .map(|(node_id, (_, view))| (node_id, view))
            .collect()
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// The UDP address the other nodes reach this node's gossip at.
    pub fn advertise(&self) -> SocketAddr {
        self.handle.chitchat_id().gossip_advertise_addr
    }

    /// Starts a gossip round with the node at `address` (a member's gossip
    /// address learned outside gossip): once it has heard this node, the
    /// two know each other and everything either knows.
    pub fn introduce(&self, address: SocketAddr) {
        if let Err(error) = self.handle.gossip(address) {
            tracing::debug!(%error, %address, "gossip stopped; no introduction");
        }
    }

    /// Bytes sent and received, and datagrams dropped, by gossip so far.
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    /// Stops gossiping.
    pub async fn shutdown(self) {
        if let Err(error) = self.handle.shutdown().await {
            tracing::debug!(%error, "gossip did not stop cleanly");
        }
    }
}
