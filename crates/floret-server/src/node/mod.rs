//! Assembles a node: binds its two ports ([`crate::bind_listeners`]), opens the
//! data dir, opens the raft group of every shard it holds with its proposer
//! and leadership watcher, the dispatcher, and the gRPC servers (Floret,
//! Admin, health and reflection on the client port; Peer on the peer
//! port); then
//! bootstraps the shards (the server already answers the peers' probes and
//! raft calls) and starts giving leaderships back to preferred replicas;
//! and takes it all down again.
//!
//! Shutdown order (a drain, bounded by `shutdown.drain_timeout_ms`):
//! health goes NOT_SERVING, the node stops asking for leaderships back and
//! hands every shard it leads to a caught-up replica (`leadership/drain.rs`)
//! while it still serves calls (forwarding them to the new leaders); then
//! the gRPC server stops taking calls, consume streams end UNAVAILABLE so
//! their clients move to another node, open calls finish; the raft groups
//! stop, then the database is synced and its flusher joined.
//!
//! Health turns SERVING once every shard this node holds has a leader;
//! NOT_SERVING for good on a fatal store or raft error, and while a shard
//! has had no leader for a while (`faults.rs`); and NOT_SERVING once it
//! begins to stop.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::{Peers, Shards};
use floret_sched::SchedulerConfig;
use floret_store::{AppliedListener, Database};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::console::{self, ConsoleParts};
use crate::deliver;
use crate::deliver::book::Tenancy;
use crate::disk_room::DiskRoom;
use crate::faults::{self, NodeFault};
use crate::idle;
use crate::leadership::hand_back::HandBack;
use crate::leadership::watch::watch_leadership;
use crate::leadership::{drain, leavers, moves, rebalance, retire};
use crate::load_view::LoadView;
use crate::produce::proposer::{Proposers, ShardProposer};
use crate::produce::tenant_limits::TenantLimits;
use crate::router::ShardRouter;
use crate::service::server::{Listeners, Server};
use crate::settle::Settler;
use crate::sink;
use crate::telemetry::sampler::{self, SampledParts};
use crate::tls::NodeTls;

mod error;
mod join;
mod parts;
mod ready;

pub use error::NodeError;
use parts::NodeParts;

/// The least time a stop gives open calls to finish, however long the
/// hand-off of leaderships took.
const MIN_CALL_DRAIN: Duration = Duration::from_secs(1);

/// A running node.
pub struct Node {
    /// Where clients dial it.
    address: SocketAddr,
    /// Where the other nodes dial it; none for a one-node cluster.
    peer_address: Option<SocketAddr>,
    /// Why it stopped serving, once a fatal store or raft error happened.
    fault: NodeFault,
    shards: Arc<Shards>,
    database: Database,
    /// Set to true when the node stops: the server drains, peer streams end.
    stopping: watch::Sender<bool>,
    server: Server,
    /// Set to true once the node has reported SERVING.
    ready: watch::Sender<bool>,
    /// Turns health NOT_SERVING on a fault or while shards have no leader.
    health_watcher: JoinHandle<()>,
    watchers: Vec<JoinHandle<()>>,
    /// Asks for leaderships back (with peers); stopped first when draining.
    rebalancer: Option<JoinHandle<()>>,
    /// Steps aside from the shards it leads when it stops.
    hand_back: HandBack,
    /// The most a stop takes (`shutdown.drain_timeout_ms`).
    drain_timeout: Duration,
    /// The metrics sampler and the metrics and console port, which read
    /// the store: stopped before it closes.
    telemetry: Vec<JoinHandle<()>>,
    load_view: Option<LoadView>,
}

impl Node {
    /// Starts a node serving on `listeners` ([`crate::bind_listeners`]).
    /// Health answers NOT_SERVING until [`Node::wait_ready`] has seen every shard led.
    pub async fn start(mut config: Config, mut listeners: Listeners) -> Result<Self, NodeError> {
        config.validate()?;
        if (!config.peers.is_empty() || !config.join.is_empty()) && listeners.peer.is_none() {
            return Err(crate::config::ConfigError::Invalid(
                "a node of a cluster needs a peer listener (see bind_listeners)".into(),
            )
            .into());
        }
        let address = listeners.client.local_addr().map_err(NodeError::Listener)?;
        let peer_address = listeners
            .peer
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()
            .map_err(NodeError::Listener)?;
        let authenticate = crate::auth::Authenticate::new(
            crate::auth::load_verifier(&config.auth.token_keys).map_err(NodeError::Auth)?,
            crate::auth::CertificateTenants::new(&config.auth.client_certificates)
                .map_err(NodeError::Auth)?,
        );
        let database = Database::open_with(
            &config.data_dir,
            floret_store::StoreOptions {
                cache_bytes: config.storage.cache_bytes,
                log_segment_bytes: config.storage.log_segment_bytes,
            },
        )?;
        let mut members = config.members(address);
        let tls = NodeTls::load(
            &config.tls,
            config.auth.client_ca.as_deref(),
            config.node_id,
            &members.keys().copied().collect::<Vec<_>>(),
        )?;
        let gossip_secret =
            crate::load_view::gossip_secret(&config.gossip).map_err(NodeError::GossipSecret)?;
        let member_tls = tls.as_ref().and_then(NodeTls::member);
        let mut founding_members: Vec<u64> = members.keys().copied().collect();
        if !config.join.is_empty() {
            let joined =
                join::ask_to_join(config.node_id, &config.join, member_tls.as_ref()).await?;
            tracing::info!(shards = joined.shard_count, replication_factor = joined.replication_factor, members = ?joined.members.keys().collect::<Vec<_>>(), "joining the cluster");
            config.shards = Some(joined.shard_count);
            config.replication_factor = joined.replication_factor;
            founding_members = joined.founding_members;
            members = joined.members;
        }
        let shard_count = match config.shards {
            Some(shards) => shards,
            None => database
                .recorded_shard_count()?
                .unwrap_or_else(|| crate::config::default_shards(founding_members.len())),
        };
        config.shards = Some(shard_count);
        let peers = Arc::new(Peers::new(config.node_id, members, member_tls.as_ref())?);
        let (dispatcher, dispatcher_inbox) = deliver::channel();
        let applied_to_dispatcher = dispatcher.clone();
        let applied: AppliedListener = Arc::new(move |event| applied_to_dispatcher.applied(event));
        let shards = Arc::new(
            Shards::open(
                peers.clone(),
                &founding_members,
                &database,
                shard_count,
                config.replication_factor,
                &config.raft_tuning(),
                applied,
            )
            .await?,
        );
        let proposers = spawn_proposers(&shards, &config);
        deliver::spawn(
            (dispatcher.clone(), dispatcher_inbox),
            (0..shard_count)
                .map(|shard| shards.opened_group(shard).map(|group| group.reader.clone()))
                .collect(),
            proposers.clone(),
            SchedulerConfig {
                default_weight: 1,
                lease_timeout: config.lease_timeout(),
            },
            if config.auth.enabled() {
                Tenancy::Namespaced
            } else {
                Tenancy::Anonymous
            },
            config.limits.max_credits,
        );
        let mut watchers: Vec<JoinHandle<()>> = shards
            .opened_groups()
            .map(|group| watch_leadership(&shards, group.id, dispatcher.clone()))
            .collect();
        watchers.push(shards.spawn_member_follower());
        let tenant_limits = Arc::new(TenantLimits::new(shards.clone()));
        let load_view = LoadView::start(
            &config,
            peer_address.unwrap_or(address),
            gossip_secret,
            shards.clone(),
            dispatcher.clone(),
            tenant_limits.clone(),
        )
        .await?;
        let gossip = load_view.as_ref().map(LoadView::status);
        if let Some(gossip) = &gossip {
            shards.attach_view(gossip.view.clone());
            tenant_limits.follow_view(gossip.view.clone());
        }
        let (stopping, stopped) = watch::channel(false);
        let fault = NodeFault::default();
        let (disk, disk_sampler) = DiskRoom::spawn(&config.data_dir, config.storage.min_free_bytes);
        watchers.push(disk_sampler);
        let operations = listeners.operations.take();
        let view = gossip.as_ref().map(|gossip| gossip.view.clone());
        let sink_weights = sink::LocalSinkWeights::default();
        let parts = NodeParts {
            fault: fault.clone(),
            config: &config,
            advertised: config.advertised_address(address),
            shards: &shards,
            proposers: &proposers,
            dispatcher: dispatcher.clone(),
            gossip,
            disk,
            tenant_limits,
            sink_weights: sink_weights.clone(),
        };
        let hand_back = HandBack::new(shards.clone(), proposers.clone(), dispatcher.clone());
        let sink_pumps = sink::PumpParts {
            dispatcher: dispatcher.clone(),
            settler: Settler::new(
                dispatcher.clone(),
                proposers.clone(),
                shards.clone(),
                ShardRouter::new(shards.clone(), proposers.clone()),
            ),
            lease_timeout: Duration::from_millis(config.delivery.lease_timeout_ms),
            shards: shards.clone(),
            weights: sink_weights,
        };
        let services = parts.services(stopped.clone(), authenticate.clone());
        watchers.push(leavers::spawn(shards.clone(), services.admin.clone()));
        watchers.push(retire::spawn(shards.clone(), services.admin.clone()));
        let mut telemetry = Vec::new();
        if let Some(listener) = operations {
            let metrics = crate::telemetry::recorder().map_err(NodeError::Metrics)?;
            telemetry.push(sampler::spawn(SampledParts {
                shards: shards.clone(),
                dispatcher,
                store: database.usage(),
                view,
                top_producers: config.metrics_top_producers,
            }));
            let console = ConsoleParts {
                metrics,
                admin: services.admin.clone(),
                authenticate,
            };
            telemetry.push(console::spawn(listener, console, stopped.clone()));
        }
        watchers.push(sink::spawn(sink_pumps, stopped.clone()));
        let server = Server::start(services, listeners, tls.as_ref(), stopped).await?;
        watchers.extend(background_tasks(&shards, proposers, &config));
        let rebalancer = has_peers(&shards).then(|| rebalance::spawn(shards.clone()));
        watchers.push(moves::spawn(
            shards.clone(),
            hand_back.clone(),
            config.membership.moves_at_once,
        ));
        let (ready, is_ready) = watch::channel(false);
        let health_watcher = faults::spawn(
            database.log_health(),
            shards.clone(),
            server.health(),
            fault.clone(),
            is_ready,
        );
        tracing::info!(node_id = config.node_id, %address, ?peer_address, data_dir = %config.data_dir.display(), shards = shard_count, members = ?peers.node_ids(), "node started");
        Ok(Self {
            address,
            peer_address,
            fault,
            shards,
            database,
            stopping,
            server,
            ready,
            health_watcher,
            watchers,
            rebalancer,
            hand_back,
            drain_timeout: Duration::from_millis(config.shutdown.drain_timeout_ms),
            telemetry,
            load_view,
        })
    }

    /// Whether the node is one of several.
    pub fn has_peers(&self) -> bool {
        has_peers(&self.shards)
    }

    /// The client port's address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The peer port's address; none for a one-node cluster.
    pub fn peer_address(&self) -> Option<SocketAddr> {
        self.peer_address
    }

    /// Runs until `shutdown` resolves or the server fails, then stops cleanly.
    pub async fn serve_until(mut self, shutdown: impl Future<Output = ()>) {
        tokio::select! {
            () = shutdown => tracing::info!("shutting down"),
            () = self.server.failed() => {}
        }
        self.stop().await;
    }

    async fn stop(self) {
        let began = tokio::time::Instant::now();
        self.health_watcher.abort();
        let _stopped = self.health_watcher.await;
        self.server.report_not_serving().await;
        if let Some(rebalancer) = self.rebalancer {
            rebalancer.abort();
            let _stopped = rebalancer.await;
        }
        if has_peers(&self.shards) && self.fault.reason().is_none() {
            let hand_off =
                drain::hand_off_leaderships(&self.shards, &self.hand_back, self.drain_timeout / 2)
                    .await;
            tracing::info!(
                led = hand_off.led,
                still_led = hand_off.still_led,
                took_ms = began.elapsed().as_millis() as u64,
                "leaderships handed off"
            );
        }
        self.stopping.send_replace(true);
        let left = self.drain_timeout.saturating_sub(began.elapsed());
        self.server.drain(left.max(MIN_CALL_DRAIN)).await;
        if let Some(load_view) = self.load_view {
            load_view.stop().await;
        }
        self.shards.shutdown().await;
        for watcher in &self.watchers {
            watcher.abort();
        }
        for task in self.telemetry {
            task.abort();
            let _stopped = task.await;
        }
        if let Err(error) = self.database.sync().await {
            tracing::error!(%error, "final sync failed");
        }
        drop(self.shards);
        self.database.close();
        tracing::info!("node stopped");
    }
}

/// Whether the node is one of several.
fn has_peers(shards: &Shards) -> bool {
    shards.peers().others().next().is_some()
}

/// Starts the proposer of every shard (it proposes only where this node leads).
fn spawn_proposers(shards: &Shards, config: &Config) -> Proposers {
    Proposers::new(
        shards
            .opened_groups()
            .map(|group| {
                let changes = shards
                    .group_changes(group.id)
                    .expect("the proposer's shard is opened");
                let proposer = ShardProposer::spawn(group.id, changes, config.batching.clone());
                (group.id, proposer)
            })
            .collect(),
    )
}

/// Bootstrapping the shards and forgetting idle producers.
fn background_tasks(
    shards: &Arc<Shards>,
    proposers: Proposers,
    config: &Config,
) -> Vec<JoinHandle<()>> {
    let bootstrapping = shards.clone();
    let mut tasks = vec![tokio::spawn(async move {
        if let Err(error) = bootstrapping.bootstrap().await {
            tracing::error!(%error, "cannot bootstrap the shards");
        }
    })];
    tasks.push(idle::spawn(
        shards.clone(),
        proposers,
        Duration::from_millis(config.producers.forget_idle_after_ms),
    ));
    tasks
}
