//! A consume stream: subscribe once, then receive deliveries and settle
//! results, grant credits, ack and nack, all on one bidirectional stream.
//!
//! A consumer of a client given several nodes follows the cluster: when its
//! node's stream breaks or ends (the node died, was stopped or restarted:
//! the stream ended, or failed UNAVAILABLE, CANCELLED, UNKNOWN or
//! DEADLINE_EXCEEDED), it subscribes again through the next node that
//! answers, with the credits the old stream had left (none, if it had
//! used them all: the next grant reaches the new node), and goes on. Other errors (a request
//! the server refused) end it as they end a one-node consumer. What the old stream had
//! delivered and not seen acked comes again from its shard's leader with
//! `attempt + 1` (at-least-once); acks and credits sent while the stream was
//! breaking are lost with it without an error (the credits are counted here
//! and re-granted; the messages of lost acks come again). A consumer of a
//! one-node client ends when its stream does.
//!
//! IMPLEMENTATION CAVEATS
//! - A node that stops answering without closing its connection (frozen,
//!   cut off) is noticed only when TCP or HTTP/2 keepalive gives up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::Transport;
use floret_proto::v1::floret_client::FloretClient;
use floret_proto::v1::{self, consume_request, consume_response};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::ClientError;

/// Requests queued towards the server before the client waits.
const OUTBOUND_BUFFER: usize = 1_024;
/// How long subscribing through one node may take.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a consumer keeps looking for a node to move to.
const MOVE_DEADLINE: Duration = Duration::from_secs(30);
/// Pause after every node refused, before trying them all again, and
/// before a move that follows another within [`MOVES_APART`].
const MOVE_RETRY_PAUSE: Duration = Duration::from_millis(200);
/// Moves closer together than this are paused: a node that takes a
/// subscribe and ends the stream at once must not make a busy loop.
const MOVES_APART: Duration = Duration::from_secs(1);

/// What the server sends on a consume stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ConsumerEvent {
    /// A message (it used one credit).
    Delivery(v1::Delivery),
    /// Outcomes of acks or nacks sent earlier.
    Settled(Vec<v1::SettleOutcome>),
}

/// A node a consumer may subscribe through: its address as given, and a
/// client of it alone.
pub(crate) type ConsumeNode = (String, FloretClient<Transport>);

/// An open consume stream on one queue.
pub struct Consumer {
    queue: String,
    /// The nodes it may consume through.
    nodes: Vec<ConsumeNode>,
    /// Which of them it is subscribed through.
    on: usize,
    /// Credits the server may still use: the first ones and every grant,
    /// less the deliveries received.
    credits: AtomicU64,
    /// When it last moved.
    moved_at: Option<tokio::time::Instant>,
    requests: mpsc::Sender<v1::ConsumeRequest>,
    responses: Streaming<v1::ConsumeResponse>,
}

impl Consumer {
    /// Subscribes through the first of `nodes`, from `start` on, that answers.
    pub(crate) async fn open(
        nodes: Vec<ConsumeNode>,
        start: usize,
        queue: &str,
        credits: u32,
    ) -> Result<Self, ClientError> {
        let mut last_error = ClientError::StreamClosed;
        for offset in 0..nodes.len() {
            let on = (start + offset) % nodes.len();
            match subscribe(&nodes[on].1, queue, credits).await {
                Ok((requests, responses)) => {
                    return Ok(Self {
                        queue: queue.to_owned(),
                        nodes,
                        on,
                        credits: AtomicU64::new(u64::from(credits)),
                        moved_at: None,
                        requests,
                        responses,
                    });
                }
                Err(error) => last_error = error,
            }
        }
        Err(last_error)
    }

    /// The address of the node this consumer is subscribed through.
    pub fn node(&self) -> &str {
        &self.nodes[self.on].0
    }

    /// The next event; None when the server ended the stream (for a
    /// consumer of several nodes: when no node took it back within 30 s).
    pub async fn next(&mut self) -> Result<Option<ConsumerEvent>, ClientError> {
        loop {
            let ended = match self.responses.message().await {
                Ok(Some(response)) => match response.response {
                    Some(consume_response::Response::Delivery(delivery)) => {
                        let credits = self.credits.get_mut();
                        *credits = credits.saturating_sub(1);
                        return Ok(Some(ConsumerEvent::Delivery(delivery)));
                    }
                    Some(consume_response::Response::Settled(result)) => {
                        return Ok(Some(ConsumerEvent::Settled(result.outcomes)));
                    }
                    None => continue,
                },
                Ok(None) => Ok(None),
                Err(status) => Err(status),
            };
            let node_went_away = match &ended {
                Ok(_) => true,
                Err(status) => matches!(
                    status.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::Cancelled
                        | tonic::Code::Unknown
                        | tonic::Code::DeadlineExceeded
                ),
            };
            let ended = ended.map_err(ClientError::from);
            if self.nodes.len() < 2 || !node_went_away {
                return ended;
            }
            let reason = match &ended {
                Ok(_) => "the node ended the stream".to_owned(),
                Err(error) => error.to_string(),
            };
            if !self.move_on(&reason).await {
                return ended;
            }
        }
    }

    /// Subscribes again through the next node that answers, trying them
    /// all until [`MOVE_DEADLINE`]; false if none did.
    async fn move_on(&mut self, reason: &str) -> bool {
        let from = self.on;
        let started = tokio::time::Instant::now();
        if self
            .moved_at
            .is_some_and(|moved| started.duration_since(moved) < MOVES_APART)
        {
            tokio::time::sleep(MOVE_RETRY_PAUSE).await;
        }
        let credits = u32::try_from(*self.credits.get_mut()).unwrap_or(u32::MAX);
        while started.elapsed() < MOVE_DEADLINE {
            for offset in 1..=self.nodes.len() {
                let on = (from + offset) % self.nodes.len();
                if let Ok((requests, responses)) =
                    subscribe(&self.nodes[on].1, &self.queue, credits).await
                {
                    tracing::info!(
                        queue = self.queue,
                        from = self.nodes[from].0,
                        to = self.nodes[on].0,
                        reason,
                        "consume stream moved to another node"
                    );
                    (self.on, self.requests, self.responses) = (on, requests, responses);
                    self.moved_at = Some(tokio::time::Instant::now());
                    return true;
                }
            }
            tokio::time::sleep(MOVE_RETRY_PAUSE).await;
        }
        false
    }

    /// Sends a request on the stream. On a stream that broke, a consumer
    /// of several nodes drops it (an ack's message comes again; credits are
    /// counted here and re-granted when it moves) and learns of the break
    /// from [`Self::next`]; a consumer of one node gets `StreamClosed`.
    async fn send(&self, request: consume_request::Request) -> Result<(), ClientError> {
        let sent = self
            .requests
            .send(v1::ConsumeRequest {
                request: Some(request),
            })
            .await;
        match sent {
            Ok(()) => Ok(()),
            Err(_) if self.nodes.len() > 1 => {
                tracing::debug!(
                    node = self.node(),
                    "request on a broken consume stream dropped"
                );
                Ok(())
            }
            Err(_) => Err(ClientError::StreamClosed),
        }
    }

    /// Lets the server send `credits` more deliveries.
    pub async fn credit(&self, credits: u32) -> Result<(), ClientError> {
        self.credits
            .fetch_add(u64::from(credits), Ordering::Relaxed);
        self.send(consume_request::Request::Credit(v1::Credit {
            credits,
            set: false,
        }))
        .await
    }

    /// Acks deliveries; their outcomes arrive later as [`ConsumerEvent::Settled`].
    pub async fn ack(&self, delivery_ids: Vec<String>) -> Result<(), ClientError> {
        self.send(consume_request::Request::Ack(v1::Settle {
            delivery_ids,
            dead_letter: false,
        }))
        .await
    }

    /// Hands deliveries back for redelivery.
    pub async fn nack(&self, delivery_ids: Vec<String>) -> Result<(), ClientError> {
        self.send(consume_request::Request::Nack(v1::Settle {
            delivery_ids,
            dead_letter: false,
        }))
        .await
    }

    /// Refuses deliveries for good: they move to the queue's dead letters
    /// instead of being delivered again.
    pub async fn dead_letter(&self, delivery_ids: Vec<String>) -> Result<(), ClientError> {
        self.send(consume_request::Request::Nack(v1::Settle {
            delivery_ids,
            dead_letter: true,
        }))
        .await
    }
}

/// Opens a consume stream of `queue` through `client` with `credits`.
async fn subscribe(
    client: &FloretClient<Transport>,
    queue: &str,
    credits: u32,
) -> Result<
    (
        mpsc::Sender<v1::ConsumeRequest>,
        Streaming<v1::ConsumeResponse>,
    ),
    ClientError,
> {
    let (requests, outbound) = mpsc::channel(OUTBOUND_BUFFER);
    let subscribe = v1::ConsumeRequest {
        request: Some(consume_request::Request::Subscribe(v1::Subscribe {
            queue: queue.to_owned(),
            credits,
        })),
    };
    requests
        .send(subscribe)
        .await
        .map_err(|_| ClientError::StreamClosed)?;
    let opened = tokio::time::timeout(
        SUBSCRIBE_TIMEOUT,
        client.clone().consume(ReceiverStream::new(outbound)),
    )
    .await
    .map_err(|_| tonic::Status::deadline_exceeded("the node did not answer the subscribe"))??;
    Ok((requests, opened.into_inner()))
}
