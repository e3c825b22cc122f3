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
//! With a rate cap, the pump spends its part of the cap (`rate_split.rs`,
//! recomputed every [`super::WEIGHT_POLL`] from every node's backlogged
//! weight; a part grows only after two polls, it shrinks at once), or the
//! share of it `aimd.rs` leaves while the sink pushes back, from a token
//! bucket, cuts its batches to what the bucket holds,
//! and takes from the dispatcher only two such batches ahead, so the
//! messages it holds are the next ones in fair order, not a hoard.
//!
//! IMPLEMENTATION CAVEATS
//! - One batch at the sink at a time per node and queue; a second one forms
//!   meanwhile.
//! - A message handed back after a sink outage counts an attempt, so a
//!   queue with `max_attempts` dead-letters messages during a long outage.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::Shards;
use floret_proto::sink::v1::SinkMessage;
use floret_store::SinkSpec;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::aimd::Aimd;
use super::backoff;
use super::batcher::Batcher;
use super::rate_split::{TokenBucket, node_rate};
use super::target::{MessageOutcome, Target};
use super::weights::{self, LocalSinkWeights};
use crate::deliver::{
    ConsumerEvent, Delivered, DispatcherHandle, SettleKind, SettledBy, StreamKey, StreamOwner,
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
    /// The cluster, for the other nodes' weights.
    pub shards: Arc<Shards>,
    /// This node's pumps' weights, which the other nodes ask for.
    pub weights: LocalSinkWeights,
}

/// A batch being sent and settled; resolves to what the sink did with it.
type InFlight = Pin<Box<dyn Future<Output = BatchEnd> + Send>>;

/// What became of a batch.
struct BatchEnd {
    /// Messages the sink asked for again, handed back after a back-off.
    asked_again: usize,
    /// Whether the sink pushed back: a failed call, or messages asked again.
    pushed_back: bool,
}

/// The messages a pump holds: taken from the dispatcher and not yet settled.
#[derive(Default)]
struct Held {
    /// In the batcher, or waiting for tokens.
    waiting: usize,
    /// At the sink.
    in_flight: usize,
    /// Asked for again, waiting for their back-off to hand them back.
    handing_back: usize,
}

impl Held {
    fn total(&self) -> usize {
        self.waiting + self.in_flight + self.handing_back
    }
}

/// Pumps `queue` into `sink` until `stop` turns true (or its sender goes):
/// the batch at the sink is finished and settled first.
pub async fn run(queue: String, sink: SinkSpec, parts: PumpParts, mut stop: watch::Receiver<bool>) {
    let timeout = Duration::from_millis(u64::from(sink.timeout_ms));
    let target = match Target::new(&sink.target, timeout) {
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
    let (handed_back, mut handed_back_counts) = mpsc::unbounded_channel();
    let (rate_known, mut rate_changes) = watch::channel(None::<f64>);
    let rate_poll = (sink.rate > 0).then(|| {
        tokio::spawn(follow_rate(
            queue.clone(),
            f64::from(sink.rate),
            parts.clone(),
            rate_known,
        ))
    });
    let mut bucket = (sink.rate > 0).then(|| {
        let even = f64::from(sink.rate) / parts.shards.peers().node_ids().len().max(1) as f64;
        TokenBucket::new(even, std::time::Instant::now())
    });
    let batch_limit = |bucket: &Option<TokenBucket>| {
        let limit = sink.batch_max as usize;
        bucket
            .as_ref()
            .map_or(limit, |b| limit.min(b.batch_limit()))
    };
    let mut unused_credits = 2 * batch_limit(&bucket);
    let Ok(consumer) = parts
        .dispatcher
        .subscribe(
            queue.clone(),
            unused_credits as u32,
            events,
            false,
            owner.clone(),
        )
        .await
    else {
        return;
    };
    tracing::info!(%queue, target = ?sink.target, batch_max = sink.batch_max, linger_ms = sink.linger_ms, rate = sink.rate, "pumping the queue into its sink");
    let sender = BatchSender {
        queue: queue.clone(),
        target,
        parts: parts.clone(),
        by: SettledBy::Stream(owner),
        handed_back,
    };
    let mut batcher = Batcher::new(
        batch_limit(&bucket),
        sink.batch_max_bytes,
        Duration::from_millis(u64::from(sink.linger_ms)),
    );
    let mut held = Held::default();
    let mut aimd = Aimd::new(std::time::Instant::now());
    let mut rate_part: Option<f64> = None;
    let mut in_flight: Option<InFlight> = None;
    let mut next: Option<Vec<Delivered>> = None;
    let mut tokens_at: Option<std::time::Instant> = None;
    loop {
        let wake = if in_flight.is_some() {
            None
        } else if next.is_some() {
            tokens_at
        } else {
            batcher.deadline()
        };
        tokio::select! {
            event = deliveries.recv() => match event {
                Some(ConsumerEvent::Delivery(delivered)) => {
                    unused_credits = unused_credits.saturating_sub(1);
                    held.waiting += 1;
                    let bytes = delivered.message.payload.len() as u64;
                    batcher.push(*delivered, bytes, std::time::Instant::now());
                }
                Some(ConsumerEvent::Backlog(report)) => parts.weights.set(&queue, report.weight),
                Some(ConsumerEvent::Settled(_)) => {}
                None => break,
            },
            ended = settled(&mut in_flight) => {
                in_flight = None;
                held.in_flight = 0;
                held.handing_back += ended.asked_again;
                let now = std::time::Instant::now();
                if ended.pushed_back {
                    aimd.pushed_back(now);
                } else {
                    aimd.took(now);
                }
                if let (Some(bucket), Some(part)) = (bucket.as_mut(), rate_part) {
                    bucket.set_rate(part * aimd.share(), now);
                    batcher.set_batch_max(batch_limit(&Some(bucket.clone())));
                }
            }
            Some(count) = handed_back_counts.recv() => {
                held.handing_back = held.handing_back.saturating_sub(count);
            }
            Ok(()) = rate_changes.changed() => {
                rate_part = *rate_changes.borrow();
                if let (Some(bucket), Some(part)) = (bucket.as_mut(), rate_part) {
                    bucket.set_rate(part * aimd.share(), std::time::Instant::now());
                    batcher.set_batch_max(batch_limit(&Some(bucket.clone())));
                }
            }
            () = sleep_until(wake), if wake.is_some() => {}
            _ = stop.changed() => break,
        }
        if in_flight.is_none() {
            let now = std::time::Instant::now();
            if next.is_none() {
                next = batcher.take(now);
            }
            if let Some(batch) = next.take() {
                match bucket.as_mut().map_or(Ok(()), |b| b.take(batch.len(), now)) {
                    Ok(()) => {
                        tokens_at = None;
                        held.waiting -= batch.len();
                        held.in_flight = batch.len();
                        in_flight = Some(Box::pin(sender.clone().send_and_settle(batch)));
                    }
                    Err(ready) => {
                        tokens_at = Some(ready);
                        next = Some(batch);
                    }
                }
            }
        }
        let wanted = (2 * batch_limit(&bucket)).saturating_sub(held.total());
        if wanted != unused_credits {
            let granted = if wanted > unused_credits {
                parts
                    .dispatcher
                    .credit(consumer, (wanted - unused_credits) as u32)
            } else {
                parts.dispatcher.set_credits(consumer, wanted as u32)
            };
            if granted.is_err() {
                break;
            }
            unused_credits = wanted;
        }
    }
    if let Some(batch) = in_flight {
        batch.await;
    }
    if let Some(rate_poll) = rate_poll {
        rate_poll.abort();
    }
    parts.weights.forget(&queue);
    parts.dispatcher.consumer_gone(consumer);
    tracing::info!(%queue, "stopped pumping the queue into its sink");
}

/// Recomputes this node's part of `cap` every [`super::WEIGHT_POLL`] and
/// publishes the smallest of the last [`PARTS_REMEMBERED`] parts (starting
/// from an even part), so a part grows only after the other nodes have had
/// two polls to see why and shrink theirs.
async fn follow_rate(queue: String, cap: f64, parts: PumpParts, rate: watch::Sender<Option<f64>>) {
    let mut poll = tokio::time::interval(super::WEIGHT_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let even = cap / parts.shards.peers().node_ids().len().max(1) as f64;
    let mut recent: VecDeque<f64> = std::iter::repeat_n(even, PARTS_REMEMBERED).collect();
    loop {
        poll.tick().await;
        let others = weights::others(&parts.shards, &queue).await;
        recent.pop_front();
        recent.push_back(node_rate(cap, parts.weights.get(&queue), &others));
        let used = recent.iter().copied().fold(f64::INFINITY, f64::min);
        metrics::gauge!("floret_sink_rate_part", "queue" => queue.clone()).set(used);
        if rate.send(Some(used)).is_err() {
            return;
        }
    }
}

/// Parts a pump takes the smallest of.
const PARTS_REMEMBERED: usize = 3;

/// Waits for the batch in flight; never resolves without one.
async fn settled(in_flight: &mut Option<InFlight>) -> BatchEnd {
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
    target: Target,
    parts: PumpParts,
    by: SettledBy,
    /// Told how many messages asked for again have been handed back.
    handed_back: mpsc::UnboundedSender<usize>,
}

impl BatchSender {
    /// Sends `batch` (again after failures, while its leases are young) and
    /// settles it by the sink's answers; resolves to how many messages the
    /// sink asked for again, which are handed back after a back-off (and
    /// then counted on `handed_back`).
    async fn send_and_settle(self, batch: Vec<Delivered>) -> BatchEnd {
        let started = Instant::now();
        let hold_at_most = self.parts.lease_timeout / 2;
        let ids: Vec<String> = batch.iter().map(|d| d.ticket.to_string()).collect();
        let attempts: Vec<u32> = batch.iter().map(|d| d.ticket.id.attempt).collect();
        let messages: Vec<SinkMessage> = batch.into_iter().map(sink_message).collect();
        let mut failures = 0;
        metrics::histogram!("floret_sink_batch_messages").record(messages.len() as f64);
        let outcomes = loop {
            let sent_at = Instant::now();
            let answer = self.target.deliver(&messages).await;
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
                    let wait = backoff::wait(failures, backoff::jitter())
                        .max(error.retry_after().unwrap_or_default());
                    if started.elapsed() + wait >= hold_at_most {
                        tracing::warn!(queue = %self.queue, %error, failures, messages = ids.len(), "the sink did not take the batch; its messages are handed back");
                        self.settle(SettleKind::Nack, ids.clone()).await;
                        return BatchEnd {
                            asked_again: 0,
                            pushed_back: true,
                        };
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
        let asked_again = again.len();
        if !again.is_empty() {
            let later = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(backoff::wait(most_attempts, backoff::jitter())).await;
                later.settle(SettleKind::Nack, again).await;
                let _pump_gone = later.handed_back.send(asked_again);
            });
        }
        tokio::join!(
            self.settle(SettleKind::Ack, taken),
            self.settle(SettleKind::DeadLetter, rejected),
        );
        BatchEnd {
            asked_again,
            pushed_back: failures > 0 || asked_again > 0,
        }
    }

    async fn settle(&self, kind: SettleKind, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        let reason = floret_store::DeadLetterReason::SinkRejected;
        match self
            .parts
            .settler
            .settle_here_for(kind, ids, &self.by, reason)
            .await
        {
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
