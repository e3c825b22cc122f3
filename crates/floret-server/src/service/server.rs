//! The node's gRPC servers, one per port: the client port serves the public
//! API (health, reflection of `floret.v1` alone, Floret, Admin), where
//! every `floret.peer.v1` method answers UNIMPLEMENTED; the peer port
//! serves the Peer service alone, to the other nodes. With TLS the client
//! port serves TLS and the peer port mutual TLS, where every call is
//! identified as a member (`peer_identity.rs`). Health answers NOT_SERVING
//! until the node reports it ready; both drain open calls for a bounded
//! time when the node stops.
//!
//! Each port keeps a bounded number of connections open (`connections.rs`):
//! `limits.max_connections` on the client port, [`MAX_PEER_CONNECTIONS`]
//! on the peer port; each connection carries at most
//! [`MAX_CONCURRENT_STREAMS`] streams.

use std::sync::Arc;
use std::time::Duration;

use floret_cluster::MAX_PEER_MESSAGE_BYTES;
use floret_proto::peer::v1::peer_server::PeerServer;
use floret_proto::v1::admin_server::AdminServer;
use floret_proto::v1::floret_server::FloretServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::ServerTlsConfig;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::admin::AdminService;
use super::connections::cap;
use super::floret::FloretService;
use super::peer::PeerService;
use super::peer_identity::identify_members;
use super::request_id::RequestIds;
use crate::auth::Authenticate;
use crate::tls::NodeTls;

/// HTTP/2 pings on idle connections, so dead peers are noticed.
const HTTP2_KEEPALIVE: Duration = Duration::from_secs(30);
/// TCP keepalive on accepted sockets.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);
/// Concurrent streams per connection, so one client cannot pin unbounded resources.
pub const MAX_CONCURRENT_STREAMS: u32 = 1_024;
/// Connections open at once on the peer port: every other member keeps a
/// channel or two, so this leaves room for a cluster of a hundred nodes.
pub const MAX_PEER_CONNECTIONS: usize = 256;

/// The services a node serves.
pub struct Services {
    /// The data plane.
    pub floret: FloretService,
    /// Operations.
    pub admin: Arc<AdminService>,
    /// Node to node.
    pub peer: PeerService,
    /// Largest request a client may send.
    pub max_request_bytes: usize,
    /// The members as they are at each call, for identifying callers on
    /// the peer port.
    pub members: Arc<floret_cluster::Peers>,
    /// Connections open at once on the client port.
    pub max_client_connections: usize,
    /// Names the tenant of every Floret and Admin call.
    pub authenticate: Authenticate,
}

/// A server that cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServerSetupError {
    /// Server reflection could not be set up.
    #[error("cannot set up gRPC reflection: {0}")]
    Reflection(String),
    /// The TLS material does not make a usable TLS configuration.
    #[error("cannot serve TLS on the {port} port: {reason}")]
    Tls {
        /// Which port: client or peer.
        port: &'static str,
        /// Why.
        reason: String,
    },
}

/// The node's two listeners, bound before it starts (so port 0 works).
pub struct Listeners {
    /// The client port.
    pub client: TcpListener,
    /// The peer port; none for a one-node cluster given no `peer_listen`.
    pub peer: Option<TcpListener>,
    /// The metrics and console port (`metrics_listen`), if set.
    pub operations: Option<TcpListener>,
}

/// The running servers.
pub struct Server {
    health: HealthReporter,
    /// The serving task, until it has ended (then it must not be awaited again).
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl Server {
    /// Serves `services` on `listeners` (over `tls` if given) until
    /// `stopped` turns true; health answers NOT_SERVING until
    /// [`Server::report_serving`].
    pub async fn start(
        services: Services,
        listeners: Listeners,
        tls: Option<&NodeTls>,
        stopped: watch::Receiver<bool>,
    ) -> Result<Self, ServerSetupError> {
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(floret_proto::PUBLIC_FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| ServerSetupError::Reflection(e.to_string()))?;
        let floret = FloretServer::new(services.floret)
            .max_decoding_message_size(services.max_request_bytes);
        let admin = AdminServer::from_arc(services.admin);
        let client_tls = tls.map(NodeTls::client_port);
        let request_ids = RequestIds::default();
        let client_port = builder("client", client_tls)?
            .layer(request_ids.clone())
            .add_service(health_service)
            .add_service(reflection)
            .add_service(InterceptedService::new(
                floret,
                services.authenticate.clone(),
            ))
            .add_service(InterceptedService::new(admin, services.authenticate))
            .serve_with_incoming_shutdown(
                cap(
                    incoming(listeners.client),
                    services.max_client_connections,
                    "client",
                ),
                node_stops(stopped.clone()),
            );
        let peer_tls = tls.and_then(NodeTls::peer_port);
        let identify = identify_members(services.members, peer_tls.is_some());
        let peer_port = match listeners.peer {
            Some(listener) => {
                let peer = PeerServer::new(services.peer)
                    .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
                Some(
                    builder("peer", peer_tls)?
                        .layer(request_ids)
                        .add_service(InterceptedService::new(peer, identify))
                        .serve_with_incoming_shutdown(
                            cap(incoming(listener), MAX_PEER_CONNECTIONS, "peer"),
                            node_stops(stopped),
                        ),
                )
            }
            None => None,
        };
        let task = tokio::spawn(async move {
            match peer_port {
                Some(peer_port) => tokio::try_join!(client_port, peer_port).map(|_| ()),
                None => client_port.await,
            }
        });
        Ok(Self {
            health,
            task: Some(task),
        })
    }

    /// Health answers SERVING.
    pub async fn report_serving(&self) {
        serving(&self.health).await;
    }

    /// Health answers NOT_SERVING.
    pub async fn report_not_serving(&self) {
        not_serving(&self.health).await;
    }

    /// The health reporter, for what turns the node NOT_SERVING on its own.
    pub fn health(&self) -> HealthReporter {
        self.health.clone()
    }

    /// Resolves if a server stops by itself (it failed), saying how.
    pub async fn failed(&mut self) {
        let Some(task) = &mut self.task else {
            return std::future::pending().await;
        };
        let ended = task.await;
        self.task = None;
        match ended {
            Ok(Ok(())) => tracing::warn!("gRPC server stopped by itself"),
            Ok(Err(error)) => tracing::error!(%error, "gRPC server failed"),
            Err(error) => tracing::error!(%error, "gRPC server task failed"),
        }
    }

    /// Waits up to `drain` for open calls to end once the node's stop was
    /// signalled, then closes what is left; nothing to wait for if the
    /// server already ended by itself ([`Server::failed`]).
    pub async fn drain(self, drain: Duration) {
        let Some(task) = self.task else {
            return;
        };
        let abort = task.abort_handle();
        match tokio::time::timeout(drain, task).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "gRPC server task did not end cleanly"),
            Err(_) => {
                tracing::warn!(
                    ?drain,
                    "calls still open after the drain timeout; closing them"
                );
                abort.abort();
            }
        }
    }
}

/// Turns the node's health, and its services', SERVING.
pub async fn serving(health: &HealthReporter) {
    health.set_service_status("", ServingStatus::Serving).await;
    health.set_serving::<FloretServer<FloretService>>().await;
    health.set_serving::<AdminServer<AdminService>>().await;
}

/// Turns the node's health, and its services', NOT_SERVING.
pub async fn not_serving(health: &HealthReporter) {
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    health
        .set_not_serving::<FloretServer<FloretService>>()
        .await;
    health.set_not_serving::<AdminServer<AdminService>>().await;
}

/// Both ports' settings, and the `port`'s TLS if it has any.
fn builder(
    port: &'static str,
    tls: Option<ServerTlsConfig>,
) -> Result<tonic::transport::Server, ServerSetupError> {
    let builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE))
        .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS));
    match tls {
        Some(tls) => builder
            .tls_config(tls)
            .map_err(|error| ServerSetupError::Tls {
                port,
                reason: floret_cluster::tls_error_chain(&error),
            }),
        None => Ok(builder),
    }
}

/// Resolves once the node starts to stop (or is gone).
async fn node_stops(mut stopped: watch::Receiver<bool>) {
    let _sender_gone = stopped.wait_for(|stopping| *stopping).await;
}

/// Accepted connections with Nagle off (a produce answer must not wait for
/// the peer's delayed ACK: that alone costs ~40 ms per round trip) and TCP keepalive on.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(TCP_KEEPALIVE))
}
