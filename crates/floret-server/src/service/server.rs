//! The node's gRPC server: one listener serving health, reflection, Floret,
//! Admin and Peer; NOT_SERVING until the node reports it ready; draining
//! open calls for a bounded time when the node stops.
//!
//! IMPLEMENTATION CAVEATS
//! - Clients and peers share the one listener (the peer API is not yet on
//!   a port of its own).

use std::time::Duration;

use floret_cluster::MAX_PEER_MESSAGE_BYTES;
use floret_proto::peer::v1::peer_server::PeerServer;
use floret_proto::v1::admin_server::AdminServer;
use floret_proto::v1::floret_server::FloretServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::admin::AdminService;
use super::floret::FloretService;
use super::peer::PeerService;

/// HTTP/2 pings on idle connections, so dead peers are noticed.
const HTTP2_KEEPALIVE: Duration = Duration::from_secs(30);
/// TCP keepalive on accepted sockets.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);
/// Concurrent streams per connection, so one client cannot pin unbounded resources.
const MAX_CONCURRENT_STREAMS: u32 = 1_024;

/// The services a node serves.
pub struct Services {
    /// The data plane.
    pub floret: FloretService,
    /// Operations.
    pub admin: AdminService,
    /// Node to node.
    pub peer: PeerService,
    /// Largest request a client may send.
    pub max_request_bytes: usize,
}

/// Server reflection could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up gRPC reflection: {0}")]
pub struct ReflectionError(String);

/// The running server.
pub struct Server {
    health: HealthReporter,
    /// The serving task, until it has ended (then it must not be awaited again).
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl Server {
    /// Serves `services` on `listener` until `stopped` turns true; health
    /// answers NOT_SERVING until [`Server::report_serving`].
    pub async fn start(
        services: Services,
        listener: TcpListener,
        mut stopped: watch::Receiver<bool>,
    ) -> Result<Self, ReflectionError> {
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(floret_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| ReflectionError(e.to_string()))?;
        let floret = FloretServer::new(services.floret)
            .max_decoding_message_size(services.max_request_bytes);
        let peer = PeerServer::new(services.peer)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
        let admin = AdminServer::new(services.admin);
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .http2_keepalive_interval(Some(HTTP2_KEEPALIVE))
                .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS))
                .add_service(health_service)
                .add_service(reflection)
                .add_service(floret)
                .add_service(admin)
                .add_service(peer)
                .serve_with_incoming_shutdown(incoming(listener), async move {
                    let _sender_gone = stopped.wait_for(|stopping| *stopping).await;
                }),
        );
        Ok(Self {
            health,
            task: Some(task),
        })
    }

    /// Health answers SERVING.
    pub async fn report_serving(&self) {
        self.health
            .set_service_status("", ServingStatus::Serving)
            .await;
        self.health
            .set_serving::<FloretServer<FloretService>>()
            .await;
        self.health.set_serving::<AdminServer<AdminService>>().await;
    }

    /// Health answers NOT_SERVING.
    pub async fn report_not_serving(&self) {
        self.health
            .set_service_status("", ServingStatus::NotServing)
            .await;
    }

    /// Resolves if the server stops by itself (it failed), saying how.
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

/// Accepted connections with Nagle off (a produce answer must not wait for
/// the peer's delayed ACK: that alone costs ~40 ms per round trip) and TCP keepalive on.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(TCP_KEEPALIVE))
}
