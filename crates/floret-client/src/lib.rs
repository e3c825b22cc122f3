//! Rust client for floret.
//!
//! [`Client::produce`] sends one batch (concurrent calls to the same node,
//! of any producers, travel together in one `ProduceMany` request, each
//! answered on its own: the `coalesce` module); [`Producer`] adds an increasing
//! idempotency sequence to every batch so it can retry UNAVAILABLE answers
//! (no leader, shutting down) with back-off and never store a batch twice.
//! [`Client::consume`] opens a [`Consumer`] stream with credits and acks.
//! A produce the server throttles (RESOURCE_EXHAUSTED with a retry-after
//! hint: over the producer's rate or limits, or the node short of room) is
//! retried with back-off and jitter, so a flooding producer slows down
//! instead of failing. [`Client::set_policy`] and the dead-letter calls
//! govern a queue's producers.
//!
//! Any node of a cluster takes any call (it forwards to shard leaders), so a
//! client may be given several nodes' addresses: calls are spread over the
//! ones that answer, and a produce that hit a node as it died is retried on
//! another. Given several nodes, the client sends a producer's produces
//! straight to its shard's leader once an answer has named it
//! (the `routes` module), saving the cluster the forwarding hop.
//!
//! A cluster that serves TLS is dialled with [`Client::connect_lazy_tls`]
//! and the cluster's CA ([`ClientTls`]).
//!
//! A [`Consumer`] of a client given several nodes subscribes through one
//! of them and moves to another when that node's stream breaks or ends
//! (the `consumer` module).
//! A cluster that maps client certificates to tenants is dialled with one
//! ([`ClientTls::with_client_certificate`]); otherwise calls carry a
//! tenant's bearer token ([`Client::connect_lazy_as`]).

mod admin;
mod bearer;
mod coalesce;
mod connect;
mod consumer;
pub mod dev_sink;
mod node_health;
mod retry;
mod routes;

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use floret_proto::v1;
use tonic::transport::Channel;

use crate::bearer::Bearer;
pub(crate) use crate::bearer::Transport;
use crate::coalesce::Coalescer;
use crate::routes::{Routes, host_port};

pub use coalesce::ProduceCoalescing;
pub use connect::ClientTls;
use connect::endpoint;
use consumer::ConsumeNode;
pub use consumer::{Consumer, ConsumerEvent};
pub use floret_proto::v1::{
    AckResponse, AmqpSink, ClusterStatusResponse, DeadLetter, Delivery, Expiry, GetPolicyResponse,
    GrpcSink, Membership, Message, Overflow, Policy, ProduceResponse, QueueStatsResponse,
    SettleOutcome, SinkSpec, WebhookSink, sink_spec,
};
pub use retry::{RETRY_AFTER_MS, RetryPolicy, is_retryable, is_throttled};

/// Largest response the client accepts: a delivery of a 1 MiB payload plus headers fits easily.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// What can go wrong talking to floret.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not a valid endpoint.
    #[error("invalid address {address:?}: {reason}")]
    InvalidAddress {
        /// What was given.
        address: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The server answered with an error status.
    #[error("{}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    /// The consume stream is closed.
    #[error("the consume stream is closed")]
    StreamClosed,
    /// The TLS settings cannot be used.
    #[error("TLS: {0}")]
    Tls(String),
    /// The token cannot be sent as gRPC metadata (it must be printable ASCII).
    #[error("the token is not printable ASCII: give it as `floret token create` printed it")]
    InvalidToken,
}

/// A connection to one floret node.
#[derive(Clone)]
pub struct Client {
    floret: v1::floret_client::FloretClient<Transport>,
    /// Produce calls through any node, folded together.
    produces: Arc<Coalescer>,
    admin: v1::admin_client::AdminClient<Transport>,
    health: tonic_health::pb::health_client::HealthClient<Transport>,
    retry: RetryPolicy,
    /// Leaders of producers, when the client was given several nodes.
    routes: Option<Arc<Routes>>,
    /// Every node the client was given, for consumers to subscribe through.
    consume_nodes: Arc<Vec<ConsumeNode>>,
}

impl Client {
    /// A lazily connecting client for `address` (`host:port` or
    /// `http://host:port`), or for several nodes separated by commas. Must
    /// be called inside a tokio runtime when several are given.
    pub fn connect_lazy(address: &str) -> Result<Self, ClientError> {
        Self::connect_lazy_with(address, None)
    }

    /// Like [`Client::connect_lazy`], to a cluster serving TLS.
    pub fn connect_lazy_tls(address: &str, tls: &ClientTls) -> Result<Self, ClientError> {
        Self::connect_lazy_with(address, Some(tls))
    }

    /// [`Client::connect_lazy`] over TLS when `tls` is given.
    pub fn connect_lazy_with(address: &str, tls: Option<&ClientTls>) -> Result<Self, ClientError> {
        Self::connect_lazy_as(address, tls, None)
    }

    /// [`Client::connect_lazy_with`], sending `token` (from `floret token
    /// create`) as `authorization: Bearer <token>` on every call: what a
    /// node with token keys needs to know the tenant.
    pub fn connect_lazy_as(
        address: &str,
        tls: Option<&ClientTls>,
        token: Option<&str>,
    ) -> Result<Self, ClientError> {
        let bearer = Bearer::new(token)?;
        let nodes: Vec<&str> = address
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .collect();
        let endpoints = nodes
            .iter()
            .map(|node| endpoint(node, tls))
            .collect::<Result<Vec<_>, _>>()?;
        let (channel, routes, consume_nodes) = match endpoints.as_slice() {
            [] => {
                return Err(ClientError::InvalidAddress {
                    address: address.to_owned(),
                    reason: "no address given".into(),
                });
            }
            [one] => {
                let channel = one.connect_lazy();
                let node = (
                    host_port(nodes[0]).to_owned(),
                    floret_client(channel.clone(), &bearer),
                );
                (channel, None, vec![node])
            }
            _ => {
                let each_node: Vec<ConsumeNode> = nodes
                    .iter()
                    .zip(&endpoints)
                    .map(|(node, endpoint)| {
                        let client = floret_client(endpoint.connect_lazy(), &bearer);
                        (host_port(node).to_owned(), client)
                    })
                    .collect();
                let routes = Routes::new(each_node.clone(), ProduceCoalescing::default());
                (
                    Channel::balance_list(endpoints.into_iter()),
                    Some(Arc::new(routes)),
                    each_node,
                )
            }
        };
        let floret = floret_client(channel.clone(), &bearer);
        Ok(Self {
            produces: Arc::new(Coalescer::new(floret.clone(), ProduceCoalescing::default())),
            floret,
            admin: v1::admin_client::AdminClient::with_interceptor(channel.clone(), bearer.clone()),
            health: tonic_health::pb::health_client::HealthClient::with_interceptor(
                channel, bearer,
            ),
            retry: RetryPolicy::default(),
            routes,
            consume_nodes: Arc::new(consume_nodes),
        })
    }

    /// Replaces how concurrent produce calls are folded into one request
    /// (`max_produces: 1` sends every call alone).
    pub fn with_produce_coalescing(mut self, coalescing: ProduceCoalescing) -> Self {
        self.produces = Arc::new(Coalescer::new(self.floret.clone(), coalescing));
        self.routes = self
            .routes
            .map(|routes| Arc::new(routes.with_coalescing(coalescing)));
        self
    }

    /// Replaces the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sends one batch. Retried only when the server throttled it (nothing
    /// was stored), honouring its retry-after hint; not after other
    /// failures, since without an idempotency sequence a retry after a lost
    /// answer could store it twice.
    pub async fn produce(
        &self,
        queue: &str,
        producer_id: &str,
        messages: Vec<Message>,
    ) -> Result<ProduceResponse, ClientError> {
        self.produce_at(queue, producer_id, messages, 0).await
    }

    /// Like [`Self::produce`], for messages to be delivered no earlier than
    /// `deliver_at_unix_ms` (ms since the Unix epoch; at most 30 days ahead).
    pub async fn produce_at(
        &self,
        queue: &str,
        producer_id: &str,
        messages: Vec<Message>,
        deliver_at_unix_ms: i64,
    ) -> Result<ProduceResponse, ClientError> {
        let request = v1::ProduceRequest {
            queue: queue.to_owned(),
            producer_id: producer_id.to_owned(),
            messages,
            producer_sequence: None,
            deliver_at_unix_ms,
        };
        self.send_produce(request, is_throttled).await
    }

    /// Sends one batch with the producer's idempotency sequence, retrying
    /// UNAVAILABLE answers with back-off until the policy gives up.
    pub async fn produce_idempotent(
        &self,
        queue: &str,
        producer_id: &str,
        messages: Vec<Message>,
        producer_sequence: u64,
    ) -> Result<ProduceResponse, ClientError> {
        let request = v1::ProduceRequest {
            queue: queue.to_owned(),
            producer_id: producer_id.to_owned(),
            messages,
            producer_sequence: Some(producer_sequence),
            deliver_at_unix_ms: 0,
        };
        self.send_produce(request, is_retryable).await
    }

    /// Sends a produce, retrying the failures `retry_on` allows with
    /// back-off until the policy gives up.
    async fn send_produce(
        &self,
        request: v1::ProduceRequest,
        retry_on: fn(&tonic::Status) -> bool,
    ) -> Result<ProduceResponse, ClientError> {
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            let result = match self.routes.as_deref() {
                Some(routes) => Self::send_routed(routes, &request).await,
                None => self.produces.produce(request.clone()).await,
            };
            match result {
                Ok(response) => return Ok(response),
                Err(status)
                    if retry_on(&status) && started.elapsed() < self.retry.give_up_after =>
                {
                    let wait = self.retry.backoff(attempt, &status);
                    tracing::debug!(%status, ?wait, "produce refused for now; retrying");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(status) => return Err(status.into()),
            }
        }
    }

    /// Sends a produce once to the node `routes` choose for its producer,
    /// and learns from the answer where the producer's next ones go.
    async fn send_routed(
        routes: &Routes,
        request: &v1::ProduceRequest,
    ) -> Result<ProduceResponse, tonic::Status> {
        let (queue, producer) = (request.queue.as_str(), request.producer_id.as_str());
        let routed = routes.leader(queue, producer);
        let was_routed = routed.is_some();
        let node = routed.unwrap_or_else(|| routes.any_node(Instant::now()));
        let result = node.produces.produce(request.clone()).await;
        match &result {
            Ok(response) => routes.learn(queue, producer, &response.leader_address, node.index),
            Err(status) if is_retryable(status) && !is_throttled(status) => {
                routes.failed(node.index, Instant::now());
                if was_routed {
                    tracing::debug!(%status, "produce to the producer's last known leader failed; forgetting the route");
                    routes.forget(queue, producer);
                }
            }
            Err(_) => {}
        }
        result
    }

    /// A producer that numbers its batches for idempotent retries.
    pub fn producer(&self, queue: &str, producer_id: &str) -> Producer {
        Producer {
            client: self.clone(),
            queue: queue.to_owned(),
            producer_id: producer_id.to_owned(),
            next_sequence: now_micros(),
        }
    }

    /// Opens a consume stream on `queue` with `credits` first credits,
    /// through one of the client's nodes (a different one from call to
    /// call, so consumers spread over the cluster).
    pub async fn consume(&self, queue: &str, credits: u32) -> Result<Consumer, ClientError> {
        let nodes = self.consume_nodes.as_ref().clone();
        let start = now_micros() as usize % nodes.len();
        Consumer::open(nodes, start, queue, credits).await
    }

    /// Acks deliveries outside a consume stream.
    pub async fn ack(&self, delivery_ids: Vec<String>) -> Result<AckResponse, ClientError> {
        Ok(self
            .floret
            .clone()
            .ack(v1::AckRequest { delivery_ids })
            .await?
            .into_inner())
    }
}

fn floret_client(channel: Channel, bearer: &Bearer) -> v1::floret_client::FloretClient<Transport> {
    v1::floret_client::FloretClient::with_interceptor(channel, bearer.clone())
        .max_decoding_message_size(MAX_RESPONSE_BYTES)
}

/// One producer of one queue, numbering its batches so retries are safe.
pub struct Producer {
    client: Client,
    queue: String,
    producer_id: String,
    next_sequence: u64,
}

impl Producer {
    /// Sends a batch, retrying UNAVAILABLE with the same sequence.
    pub async fn send(&mut self, messages: Vec<Message>) -> Result<ProduceResponse, ClientError> {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.client
            .produce_idempotent(&self.queue, &self.producer_id, messages, sequence)
            .await
    }
}

/// Starting point for a producer's sequences: increasing across restarts of
/// the client process as long as the clock does not go back.
fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(1)
}
