//! One queue's sink pump on one node: a consumer of this node's own
//! dispatcher (so it gets the messages of the shards this node leads, in
//! the same fair order, under the same policies as consumer streams), which
//! batches what it gets (`batcher.rs`), sends each batch to the sink, and
//! settles every message by the sink's answer: OK acks it (removed through
//! raft), REJECT moves it to the dead letters, RETRY hands it back after a
//! back-off (attempt + 1).
//!
//! A batch the sink does not answer (down, timed out, malformed answer) is
//! sent again after a back-off, holding its leases, for up to half the
//! lease timeout; then its messages are handed back and taken again.
//!
//! IMPLEMENTATION CAVEATS
//! - One batch at the sink at a time per node and queue; a second one forms
//!   meanwhile (the pump's credits are two batches).
//! - No rate cap yet: a pump sends as fast as its sink answers.
//! - A message handed back after a sink outage counts an attempt, so a
//!   queue with `max_attempts` dead-letters messages during a long outage.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use floret_proto::sink::v1::SinkMessage;
use floret_store::SinkSpec;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::backoff;
use super::batcher::Batcher;
use super::target::{GrpcTarget, MessageOutcome};
use crate::deliver::{
    ConsumerEvent, ConsumerId, Delivered, DispatcherHandle, SettleKind, SettledBy, StreamKey,
    StreamOwner,
};
use crate::settle::Settler;

/// What every pump of a node shares.
#[derive(Clone)]
pub struct PumpParts {
    /// This node's dispatcher.
    pub dispatcher: DispatcherHandle,
    /// Settles what the sink answered.
    pub settler: Settler,
    /// How long a delivery stays leased: a batch is held at most half of it.
    pub lease_timeout: Duration,
}

/// A batch being sent and settled; resolves to the credits it gives back now.
type InFlight = Pin<Box<dyn Future<Output = u32> + Send>>;

/// Pumps `queue` into `sink` until `stop` turns true (or its sender goes):
/// the batch at the sink is finished and settled first.
pub async fn run(queue: String, sink: SinkSpec, parts: PumpParts, mut stop: watch::Receiver<bool>) {
    let floret_store::SinkTarget::Grpc { address } = &sink.target;
    let timeout = Duration::from_millis(u64::from(sink.timeout_ms));
    let target = match GrpcTarget::new(address, timeout) {
        Ok(target) => target,
        Err(error) => {
            tracing::error!(%queue, %error, "the sink cannot be dialled; not pumping");
            return;
        }
    };
    let owner = StreamOwner {
        tenant: Arc::from(""),
        stream: StreamKey::random(),
    };
    let (events, mut deliveries) = mpsc::unbounded_channel();
    let credits = sink.batch_max.saturating_mul(2);
    let Ok(consumer) = parts
        .dispatcher
        .subscribe(queue.clone(), credits, events, false, owner.clone())
        .await
    else {
        return;
    };
    tracing::info!(%queue, %address, batch_max = sink.batch_max, linger_ms = sink.linger_ms, "pumping the queue into its sink");
    let sender = BatchSender {
        queue: queue.clone(),
        target,
        parts: parts.clone(),
        consumer,
        by: SettledBy::Stream(owner),
    };
    let mut batcher = Batcher::new(
        sink.batch_max as usize,
        sink.batch_max_bytes,
        Duration::from_millis(u64::from(sink.linger_ms)),
    );
    let mut in_flight: Option<InFlight> = None;
    loop {
        let linger_ends = batcher.deadline().filter(|_| in_flight.is_none());
        tokio::select! {
            event = deliveries.recv() => match event {
                Some(ConsumerEvent::Delivery(delivered)) => {
                    let bytes = delivered.message.payload.len() as u64;
                    batcher.push(*delivered, bytes, std::time::Instant::now());
                }
                Some(ConsumerEvent::Settled(_) | ConsumerEvent::Backlog(_)) => {}
                None => break,
            },
            returned = settled(&mut in_flight) => {
                in_flight = None;
                if parts.dispatcher.credit(consumer, returned).is_err() {
                    break;
                }
            }
            () = sleep_until(linger_ends), if linger_ends.is_some() => {}
            _ = stop.changed() => break,
        }
        if in_flight.is_none()
            && let Some(batch) = batcher.take(std::time::Instant::now())
        {
            in_flight = Some(Box::pin(sender.clone().send_and_settle(batch)));
        }
    }
    if let Some(batch) = in_flight {
        batch.await;
    }
    parts.dispatcher.consumer_gone(consumer);
    tracing::info!(%queue, "stopped pumping the queue into its sink");
}

/// Waits for the batch in flight; never resolves without one.
async fn settled(in_flight: &mut Option<InFlight>) -> u32 {
    match in_flight {
        Some(batch) => batch.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(Instant::from_std(deadline)).await,
        None => std::future::pending().await,
    }
}

/// Sends one batch and settles its messages.
#[derive(Clone)]
struct BatchSender {
    queue: String,
    target: GrpcTarget,
    parts: PumpParts,
    consumer: ConsumerId,
    by: SettledBy,
}

impl BatchSender {
    /// Sends `batch` (again after failures, while its leases are young),
    /// settles it by the sink's answers, and resolves to the credits that
    /// come back at once (messages handed back later credit themselves).
    async fn send_and_settle(self, batch: Vec<Delivered>) -> u32 {
        let started = Instant::now();
        let hold_at_most = self.parts.lease_timeout / 2;
        let ids: Vec<String> = batch.iter().map(|d| d.ticket.to_string()).collect();
        let attempts: Vec<u32> = batch.iter().map(|d| d.ticket.id.attempt).collect();
        let messages: Vec<SinkMessage> = batch.into_iter().map(sink_message).collect();
        let mut failures = 0;
        metrics::histogram!("floret_sink_batch_messages").record(messages.len() as f64);
        let outcomes = loop {
            let sent_at = Instant::now();
            let answer = self.target.deliver(messages.clone()).await;
            let result = if answer.is_ok() { "answered" } else { "failed" };
            metrics::counter!("floret_sink_batches_total", "queue" => self.queue.clone(), "result" => result).increment(1);
            match answer {
                Ok(outcomes) => {
                    metrics::histogram!("floret_sink_batch_seconds")
                        .record(sent_at.elapsed().as_secs_f64());
                    break outcomes;
                }
                Err(error) => {
                    failures += 1;
                    let wait = backoff::wait(failures, backoff::jitter());
                    if started.elapsed() + wait >= hold_at_most {
                        tracing::warn!(queue = %self.queue, %error, failures, messages = ids.len(), "the sink did not take the batch; its messages are handed back");
                        self.settle(SettleKind::Nack, ids.clone()).await;
                        return ids.len() as u32;
                    }
                    tracing::warn!(queue = %self.queue, %error, failures, retry_in_ms = wait.as_millis() as u64, "the sink did not take the batch; sending it again");
                    tokio::time::sleep(wait).await;
                }
            }
        };
        let (mut taken, mut rejected, mut again) = (Vec::new(), Vec::new(), Vec::new());
        let mut most_attempts = 0;
        for ((id, outcome), attempt) in ids.into_iter().zip(outcomes).zip(attempts) {
            match outcome {
                MessageOutcome::Ok => taken.push(id),
                MessageOutcome::Reject(reason) => {
                    tracing::debug!(queue = %self.queue, delivery = %id, %reason, "the sink rejected a message");
                    rejected.push(id);
                }
                MessageOutcome::Retry(reason) => {
                    tracing::debug!(queue = %self.queue, delivery = %id, %reason, "the sink asked for a message again");
                    most_attempts = most_attempts.max(attempt);
                    again.push(id);
                }
            }
        }
        for (outcome, count) in [
            ("ok", taken.len()),
            ("retry", again.len()),
            ("reject", rejected.len()),
        ] {
            metrics::counter!("floret_sink_messages_total", "queue" => self.queue.clone(), "outcome" => outcome)
                .increment(count as u64);
        }
        let settled_now = (taken.len() + rejected.len()) as u32;
        if !again.is_empty() {
            let later = self.clone();
            tokio::spawn(async move {
                let count = again.len() as u32;
                tokio::time::sleep(backoff::wait(most_attempts, backoff::jitter())).await;
                later.settle(SettleKind::Nack, again).await;
                let _stopping = later.parts.dispatcher.credit(later.consumer, count);
            });
        }
        tokio::join!(
            self.settle(SettleKind::Ack, taken),
            self.settle(SettleKind::DeadLetter, rejected),
        );
        settled_now
    }

    async fn settle(&self, kind: SettleKind, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        match self.parts.settler.settle_here(kind, ids, &self.by).await {
            Ok(outcomes) => {
                let unsettled = outcomes
                    .iter()
                    .filter(|o| o.code != crate::deliver::SettleCode::Ok)
                    .count();
                if let Some(first) = outcomes
                    .iter()
                    .find(|o| o.code != crate::deliver::SettleCode::Ok)
                {
                    tracing::warn!(queue = %self.queue, ?kind, unsettled, first = %first.message, "sink deliveries not settled; they will be delivered again");
                }
            }
            Err(stopped) => tracing::debug!(queue = %self.queue, %stopped, "not settled"),
        }
    }
}

/// A delivery as the sink gets it.
fn sink_message(delivered: Delivered) -> SinkMessage {
    let Delivered { ticket, message } = delivered;
    let id = ticket.id;
    SinkMessage {
        queue: id.queue,
        producer_id: id.producer,
        sequence: id.sequence,
        payload: message.payload,
        headers: message.headers.into_iter().collect(),
        attempt: id.attempt,
        enqueued_at_unix_ms: message.enqueued_at_ms,
    }
}
