//! Sending one batch to a queue's sink and settling its messages by the
//! sink's answers: OK acks a message (removed through raft), REJECT moves
//! it to the dead letters, RETRY hands it back after a back-off (attempt +
//! 1). A batch the sink does not answer (down, timed out, malformed answer)
//! is sent again after a back-off, holding its leases, for up to half the
//! lease timeout; then its messages are handed back.
//!
//! A batch resolves once the sink answered, with the settling of its
//! messages still to run, so the pump (`pump.rs`) can send the next batch
//! while raft commits the last one's.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use floret_proto::sink::v1::SinkMessage;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::backoff;
use super::pump::PumpParts;
use super::target::{MessageOutcome, Target};
use crate::deliver::{Delivered, SettleKind, SettledBy};

/// A batch at the sink; resolves once the sink answered (or the batch was
/// given up), to what the sink did with it.
pub(super) type InFlight = Pin<Box<dyn Future<Output = BatchEnd> + Send>>;

/// A batch's answers being settled through raft (removed, dead-lettered,
/// or handed back after a failed call).
pub(super) type Settling = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What became of a batch at the sink.
pub(super) struct BatchEnd {
    /// Messages it held.
    pub(super) sent: usize,
    /// Messages the sink asked for again, handed back after a back-off.
    pub(super) asked_again: usize,
    /// Whether the sink pushed back: a failed call, or messages asked again.
    pub(super) pushed_back: bool,
    /// How long the sink took to answer it (None: it never did).
    pub(super) answered_in: Option<Duration>,
    /// Settles the rest of its messages.
    pub(super) settle: Settling,
}

/// Sends batches and settles their messages.
#[derive(Clone)]
pub(super) struct BatchSender {
    pub(super) queue: String,
    pub(super) target: Target,
    pub(super) parts: PumpParts,
    pub(super) by: SettledBy,
    /// Told how many messages asked for again have been handed back.
    pub(super) handed_back: mpsc::UnboundedSender<usize>,
}

impl BatchSender {
    /// Sends `batch` (again after failures, while its leases are young);
    /// resolves once the sink answered, to the settling of what it answered
    /// and how many messages it asked for again, which are handed back
    /// after a back-off (and then counted on `handed_back`).
    pub(super) async fn send(self, batch: Vec<Delivered>) -> BatchEnd {
        let started = Instant::now();
        let hold_at_most = self.parts.lease_timeout / 2;
        let ids: Vec<String> = batch.iter().map(|d| d.ticket.to_string()).collect();
        let attempts: Vec<u32> = batch.iter().map(|d| d.ticket.id.attempt).collect();
        let messages: Vec<SinkMessage> = batch.into_iter().map(sink_message).collect();
        let mut failures = 0;
        metrics::histogram!("floret_sink_batch_messages").record(messages.len() as f64);
        let (outcomes, answered_in) = loop {
            let sent_at = Instant::now();
            let answer = self.target.deliver(&messages).await;
            let result = if answer.is_ok() { "answered" } else { "failed" };
            metrics::counter!("floret_sink_batches_total", "queue" => self.queue.clone(), "result" => result).increment(1);
            match answer {
                Ok(outcomes) => {
                    let answered_in = sent_at.elapsed();
                    metrics::histogram!("floret_sink_batch_seconds")
                        .record(answered_in.as_secs_f64());
                    break (outcomes, answered_in);
                }
                Err(error) => {
                    failures += 1;
                    let wait = backoff::wait(failures, backoff::jitter())
                        .max(error.retry_after().unwrap_or_default());
                    if started.elapsed() + wait >= hold_at_most {
                        tracing::warn!(queue = %self.queue, %error, failures, messages = ids.len(), "the sink did not take the batch; its messages are handed back");
                        let sent = ids.len();
                        return BatchEnd {
                            sent,
                            asked_again: 0,
                            pushed_back: true,
                            answered_in: None,
                            settle: Box::pin(async move {
                                self.settle(SettleKind::Nack, ids).await;
                            }),
                        };
                    }
                    tracing::warn!(queue = %self.queue, %error, failures, retry_in_ms = wait.as_millis() as u64, "the sink did not take the batch; sending it again");
                    tokio::time::sleep(wait).await;
                }
            }
        };
        let sent = ids.len();
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
        BatchEnd {
            sent,
            asked_again,
            pushed_back: failures > 0 || asked_again > 0,
            answered_in: Some(answered_in),
            settle: Box::pin(async move {
                tokio::join!(
                    self.settle(SettleKind::Ack, taken),
                    self.settle(SettleKind::DeadLetter, rejected),
                );
            }),
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
