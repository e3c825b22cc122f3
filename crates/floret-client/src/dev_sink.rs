//! A `floret.sink.v1.Sink` that records what it gets, for demos (`floret
//! sink serve`) and tests: it can take at most a rate, reject or ask again
//! for a share of the messages, and be switched down.
//!
//! Which messages it rejects, or asks for again, follows from each
//! message's name (queue, producer, sequence; and the attempt, for asking
//! again), so a test can tell which ones must end as dead letters and a
//! message asked for again is taken on a later attempt.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floret_proto::sink::v1::sink_server::{Sink, SinkServer};
use floret_proto::sink::v1::{
    DeliverRequest, DeliverResponse, MessageResult, Outcome, SinkMessage,
};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// How a [`DevSink`] behaves.
#[derive(Debug, Clone, Default)]
pub struct DevSinkBehaviour {
    /// Most messages a second it takes: it answers a batch once the rate
    /// allows all of it. None: as fast as batches come.
    pub rate: Option<u32>,
    /// Percent of messages it rejects (always the same ones).
    pub reject_percent: u32,
    /// Percent of deliveries it asks for again (per attempt).
    pub retry_percent: u32,
    /// How long it holds each batch before answering (batches it holds at
    /// once overlap).
    pub latency: Duration,
}

/// One message as the sink got it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The message.
    pub message: SinkMessage,
    /// When its batch arrived.
    pub at: Instant,
    /// Which batch (0 for the first).
    pub batch: usize,
    /// What the sink answered for it.
    pub outcome: Outcome,
}

/// The recording sink; clones share what it recorded.
#[derive(Clone, Default)]
pub struct DevSink {
    behaviour: DevSinkBehaviour,
    received: Arc<Mutex<Vec<Received>>>,
    batches: Arc<Mutex<usize>>,
    down: Arc<AtomicBool>,
    /// Batches it holds now, and the most it ever held at once.
    in_flight: Arc<(AtomicUsize, AtomicUsize)>,
    /// When the rate lets the next message through.
    next_free: Arc<tokio::sync::Mutex<Option<Instant>>>,
}

impl DevSink {
    /// A sink that behaves as `behaviour` says.
    pub fn new(behaviour: DevSinkBehaviour) -> Self {
        Self {
            behaviour,
            ..Self::default()
        }
    }

    /// While down, every batch fails UNAVAILABLE and nothing is recorded.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Every message received so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("never poisoned").clone()
    }

    /// With a rate, how long a batch that came now would wait for the work
    /// queued before it: the sink's own queue, in time.
    pub async fn queued_for(&self) -> Duration {
        let next_free = *self.next_free.lock().await;
        next_free.map_or(Duration::ZERO, |free| {
            free.saturating_duration_since(Instant::now())
        })
    }

    /// The most batches it has held at once (received, not yet answered).
    pub fn most_in_flight(&self) -> usize {
        self.in_flight.1.load(Ordering::SeqCst)
    }

    /// Whether this sink always rejects `message`.
    pub fn rejects(&self, message: &SinkMessage) -> bool {
        let name = (&message.queue, &message.producer_id, message.sequence);
        percent_of(&name) < self.behaviour.reject_percent
    }

    fn asks_again(&self, message: &SinkMessage) -> bool {
        let name = (
            &message.queue,
            &message.producer_id,
            message.sequence,
            message.attempt,
            "again",
        );
        percent_of(&name) < self.behaviour.retry_percent
    }

    /// Serves on `listener` until the task is dropped.
    pub async fn serve(self, listener: TcpListener) -> Result<(), tonic::transport::Error> {
        tonic::transport::Server::builder()
            .add_service(SinkServer::new(self).max_decoding_message_size(usize::MAX))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
    }

    async fn wait_for_rate(&self, messages: usize) {
        let Some(rate) = self.behaviour.rate.filter(|&rate| rate > 0) else {
            return;
        };
        let until = {
            let mut next_free = self.next_free.lock().await;
            let now = Instant::now();
            let from = next_free.map_or(now, |free| free.max(now));
            let until = from + Duration::from_secs_f64(messages as f64 / f64::from(rate));
            *next_free = Some(until);
            until
        };
        tokio::time::sleep_until(until.into()).await;
    }
}

/// A batch the sink holds: counted in flight until dropped (answered, or
/// the call given up by the caller).
struct HeldBatch<'a>(&'a AtomicUsize);

impl Drop for HeldBatch<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A number in 0..100 that `name` always maps to.
fn percent_of(name: &impl Hash) -> u32 {
    let mut hasher = DefaultHasher::new();
    name.hash(&mut hasher);
    (hasher.finish() % 100) as u32
}

#[tonic::async_trait]
impl Sink for DevSink {
    async fn deliver(
        &self,
        request: Request<DeliverRequest>,
    ) -> Result<Response<DeliverResponse>, Status> {
        if self.down.load(Ordering::SeqCst) {
            return Err(Status::unavailable("the dev sink is down"));
        }
        let messages = request.into_inner().messages;
        let (now, most) = &*self.in_flight;
        most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
        let holding = HeldBatch(&self.in_flight.0);
        self.wait_for_rate(messages.len()).await;
        tokio::time::sleep(self.behaviour.latency).await;
        let at = Instant::now();
        let batch = {
            let mut batches = self.batches.lock().expect("never poisoned");
            *batches += 1;
            *batches - 1
        };
        let mut results = Vec::with_capacity(messages.len());
        let mut received = Vec::with_capacity(messages.len());
        for message in messages {
            let (outcome, reason) = if self.rejects(&message) {
                (Outcome::Reject, "rejected by the dev sink")
            } else if self.asks_again(&message) {
                (Outcome::Retry, "asked again by the dev sink")
            } else {
                (Outcome::Ok, "")
            };
            results.push(MessageResult {
                outcome: outcome as i32,
                reason: reason.to_owned(),
            });
            received.push(Received {
                message,
                at,
                batch,
                outcome,
            });
        }
        self.received
            .lock()
            .expect("never poisoned")
            .extend(received);
        drop(holding);
        Ok(Response::new(DeliverResponse { results }))
    }
}
