//! Assembles a node: opens the data dir, opens the raft group of every
//! shard it holds with its proposer and leadership watcher, the dispatcher,
//! and the gRPC server (Floret, Admin, Peer, health, reflection); then
//! bootstraps the shards (the server already answers the peers' probes and
//! raft calls) and starts giving leaderships back to preferred replicas;
//! and takes it all down again.
//!
//! Shutdown order: health goes NOT_SERVING, the gRPC server stops taking
//! calls and drains, the raft groups stop, then the database is synced and
//! its flusher joined.
//!
//! IMPLEMENTATION CAVEATS
//! - Health turns SERVING once every shard this node holds has a leader; it
//!   does not turn back when a shard loses its leader later.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::{MAX_PEER_MESSAGE_BYTES, Peers, PeersError, Shards, ShardsError};
use floret_proto::peer::v1::peer_server::PeerServer;
use floret_proto::v1::admin_server::AdminServer;
use floret_proto::v1::floret_server::FloretServer;
use floret_sched::SchedulerConfig;
use floret_store::{Database, OpenError};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::backpressure::Backpressure;
use crate::commit::Committer;
use crate::config::Config;
use crate::deliver::{self, DispatcherHandle};
use crate::idle;
use crate::load_view::LoadView;
use crate::proposer::{Proposers, ShardProposer};
use crate::rebalance;
use crate::service::admin::AdminService;
use crate::service::fan_in;
use crate::service::floret::FloretService;
use crate::service::peer::PeerService;
use crate::settle::Settler;

/// HTTP/2 pings on idle connections, so dead peers are noticed.
const HTTP2_KEEPALIVE: Duration = Duration::from_secs(30);
/// TCP keepalive on accepted sockets.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);
/// How long shutdown waits for open calls (consume streams never end by
/// themselves) before closing them; their leases come back on restart.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Concurrent streams per connection, so one client cannot pin unbounded resources.
const MAX_CONCURRENT_STREAMS: u32 = 1_024;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configuration is not valid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The data dir could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The member list is not usable.
    #[error(transparent)]
    Peers(#[from] PeersError),
    /// The shards could not start.
    #[error(transparent)]
    Shards(#[from] ShardsError),
    /// Gossip could not start.
    #[error(transparent)]
    Gossip(#[from] floret_cluster::GossipError),
    /// Server reflection could not be set up.
    #[error("cannot set up gRPC reflection: {0}")]
    Reflection(String),
    /// The listener's address is unknown.
    #[error("cannot read the listen address: {0}")]
    Listener(std::io::Error),
    /// Some shard elected no leader in time.
    #[error("shard {shard} has no leader after {waited:?}")]
    NotReady {
        /// The shard.
        shard: u32,
        /// How long we waited.
        waited: Duration,
    },
}

/// A running node.
pub struct Node {
    address: SocketAddr,
    shards: Arc<Shards>,
    database: Database,
    health: HealthReporter,
    /// Set to true when the node stops: the server drains, peer streams end.
    stopping: watch::Sender<bool>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    watchers: Vec<JoinHandle<()>>,
    load_view: Option<LoadView>,
}

impl Node {
    /// Starts a node serving on `listener` (already bound, so port 0 works).
    /// Health answers NOT_SERVING until [`Node::wait_ready`] has seen every shard led.
    pub async fn start(config: Config, listener: TcpListener) -> Result<Self, NodeError> {
        config.validate()?;
        let address = listener.local_addr().map_err(NodeError::Listener)?;
        let database = Database::open_with_cache(&config.data_dir, config.storage.cache_bytes)?;
        let peers = Arc::new(Peers::new(config.node_id, config.members(address))?);
        let (dispatcher, dispatcher_inbox) = deliver::channel();
        let applied_to_dispatcher = dispatcher.clone();
        let listener_fn: floret_store::AppliedListener =
            Arc::new(move |event| applied_to_dispatcher.applied(event));
        let shards = Arc::new(
            Shards::open(
                peers.clone(),
                &database,
                config.shards,
                config.replication_factor,
                &config.raft_tuning(),
                listener_fn,
            )
            .await?,
        );
        let proposers = Proposers::new(
            shards
                .groups()
                .map(|group| {
                    let proposer =
                        ShardProposer::spawn(group.id, group.raft.clone(), config.batching.clone());
                    (group.id, proposer)
                })
                .collect(),
        );
        deliver::spawn(
            (dispatcher.clone(), dispatcher_inbox),
            (0..config.shards)
                .map(|shard| shards.group(shard).map(|group| group.reader.clone()))
                .collect(),
            proposers.clone(),
            SchedulerConfig {
                default_weight: 1,
                lease_timeout: config.lease_timeout(),
            },
            config.limits.max_credits,
        );
        let mut watchers: Vec<JoinHandle<()>> = shards
            .groups()
            .map(|group| watch_leadership(&shards, group.id, dispatcher.clone()))
            .collect();
        let settler = Settler::new(dispatcher.clone(), proposers.clone(), shards.clone());
        let load_view =
            LoadView::start(&config, address, shards.clone(), dispatcher.clone()).await?;
        let view = load_view.as_ref().map(LoadView::receiver);
        if let Some(view) = &view {
            shards.attach_view(view.clone());
        }

        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(floret_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| NodeError::Reflection(e.to_string()))?;
        let consumers = fan_in::Sources {
            dispatcher: dispatcher.clone(),
            settler: settler.clone(),
            peers: peers.clone(),
            max_credits: config.limits.max_credits,
            view: view.clone(),
            cross_node_split: config.fairness.cross_node_split,
        };
        let floret = FloretServer::new(FloretService::new(
            shards.clone(),
            proposers.clone(),
            config.limits.clone(),
            consumers,
            Backpressure::new(config.backpressure.clone(), shards.clone()),
        ))
        .max_decoding_message_size(config.limits.max_request_bytes);
        let (stopping, stopped) = watch::channel(false);
        let peer = PeerServer::new(PeerService::new(
            shards.clone(),
            settler,
            proposers.clone(),
            dispatcher.clone(),
            stopped.clone(),
        ))
        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
        let admin = AdminServer::new(AdminService::new(
            shards.clone(),
            dispatcher,
            Committer::new(shards.clone(), proposers.clone()),
            address.to_string(),
            view,
        ));
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .http2_keepalive_interval(Some(HTTP2_KEEPALIVE))
                .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS))
                .add_service(health_service)
                .add_service(reflection)
                .add_service(floret)
                .add_service(admin)
                .add_service(peer)
                .serve_with_incoming_shutdown(incoming(listener), async move {
                    let mut stopped = stopped;
                    let _sender_gone = stopped.wait_for(|stopping| *stopping).await;
                }),
        );
        let bootstrapping = shards.clone();
        watchers.push(tokio::spawn(async move {
            if let Err(error) = bootstrapping.bootstrap().await {
                tracing::error!(%error, "cannot bootstrap the shards");
            }
        }));
        if peers.others().next().is_some() {
            watchers.push(rebalance::spawn(shards.clone()));
        }
        watchers.push(idle::spawn(
            shards.clone(),
            proposers,
            Duration::from_millis(config.producers.forget_idle_after_ms),
        ));
        tracing::info!(node_id = config.node_id, %address, data_dir = %config.data_dir.display(), shards = config.shards, members = ?peers.node_ids(), "node started");
        Ok(Self {
            address,
            shards,
            database,
            health,
            stopping,
            server,
            watchers,
            load_view,
        })
    }

    /// Waits until every shard this node holds has a leader, then reports SERVING.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), NodeError> {
        for group in self.shards.groups() {
            let mut metrics = group.raft.metrics();
            let led =
                tokio::time::timeout(timeout, metrics.wait_for(|m| m.current_leader.is_some()))
                    .await;
            if !matches!(led, Ok(Ok(_))) {
                return Err(NodeError::NotReady {
                    shard: group.id,
                    waited: timeout,
                });
            }
        }
        self.health
            .set_service_status("", ServingStatus::Serving)
            .await;
        self.health
            .set_serving::<FloretServer<FloretService>>()
            .await;
        self.health.set_serving::<AdminServer<AdminService>>().await;
        Ok(())
    }

    /// Whether the node is one of several.
    pub fn has_peers(&self) -> bool {
        self.shards.peers().others().next().is_some()
    }

    /// The address the gRPC server listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Runs until `shutdown` resolves or the server fails, then stops cleanly.
    pub async fn serve_until(mut self, shutdown: impl Future<Output = ()>) {
        tokio::select! {
            () = shutdown => tracing::info!("shutting down"),
            result = &mut self.server => {
                match result {
                    Ok(Ok(())) => tracing::warn!("gRPC server stopped by itself"),
                    Ok(Err(error)) => tracing::error!(%error, "gRPC server failed"),
                    Err(error) => tracing::error!(%error, "gRPC server task failed"),
                }
            }
        }
        self.stop().await;
    }

    async fn stop(self) {
        self.health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        self.stopping.send_replace(true);
        let server_abort = self.server.abort_handle();
        match tokio::time::timeout(DRAIN_TIMEOUT, self.server).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "gRPC server task did not end cleanly"),
            Err(_) => {
                tracing::warn!(
                    ?DRAIN_TIMEOUT,
                    "calls still open after the drain timeout; closing them"
                );
                server_abort.abort();
            }
        }
        if let Some(load_view) = self.load_view {
            load_view.stop().await;
        }
        self.shards.shutdown().await;
        for watcher in &self.watchers {
            watcher.abort();
        }
        if let Err(error) = self.database.sync().await {
            tracing::error!(%error, "final sync failed");
        }
        drop(self.shards);
        self.database.close();
        tracing::info!("node stopped");
    }
}

/// Accepted connections with Nagle off (a produce answer must not wait for
/// the peer's delayed ACK: that alone costs ~40 ms per round trip) and TCP keepalive on.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(TCP_KEEPALIVE))
}

/// Tells the dispatcher whenever this node gains or loses the leadership of
/// `shard`. A gain is reported only once the new leader's state machine has
/// applied everything committed before its term (`ensure_linearizable`):
/// otherwise the rebuild could see a message whose acked removal is
/// committed but not yet applied, and deliver it again.
fn watch_leadership(shards: &Shards, shard: u32, dispatcher: DispatcherHandle) -> JoinHandle<()> {
    let node_id = shards.node_id();
    let raft = shards
        .group(shard)
        .expect("leadership is watched for held shards")
        .raft
        .clone();
    let mut metrics = raft.metrics();
    tokio::spawn(async move {
        let mut leading = false;
        loop {
            let now_leading = metrics.borrow_and_update().current_leader == Some(node_id);
            if now_leading && !leading {
                match raft.ensure_linearizable().await {
                    Ok(_) => {
                        leading = true;
                        dispatcher.leadership(shard, true);
                    }
                    Err(error) => tracing::debug!(shard, %error, "leadership not confirmed"),
                }
            } else if !now_leading && leading {
                leading = false;
                dispatcher.leadership(shard, false);
            }
            if metrics.changed().await.is_err() {
                break;
            }
        }
    })
}
