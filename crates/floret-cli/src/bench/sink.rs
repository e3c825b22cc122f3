//! The shared sink of a benchmark: consumers that read, ack and return
//! credits, together held to a total rate (the sink's capacity), recording
//! when each delivery arrived.
//!
//! A capped consumer models a downstream that takes a fixed time per
//! message: each delivery is "processed" one interval after the previous one
//! (or on arrival, if later), and only then acked and its credit returned, so
//! the server can never run ahead of the cap by more than the credit window.
//! Arrival times are taken as the delivery is read off the stream, so the
//! processing queue in the consumer does not count as latency.
//!
//! The consumers run on a runtime of their own, on one thread: a real sink
//! is another process, and a flood's thousand producer tasks in this one
//! would otherwise delay every delivery the consumers read and pace.
//!
//! IMPLEMENTATION CAVEATS
//! - A consumer that cannot open its stream, or loses it, ends with a
//!   warning; the run then reports fewer deliveries rather than reconnecting.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floret_client::{Client, ClientError, ConsumerEvent};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::stamp;

/// How long an ack may wait for more to batch with when the consumer is idle.
const ACK_LINGER: Duration = Duration::from_millis(5);
/// How long a stopping consumer waits for its last acks to be confirmed, so
/// that the next run does not get this run's messages again.
const FINAL_ACK_WAIT: Duration = Duration::from_secs(5);

/// How the sink consumes.
#[derive(Debug, Clone)]
pub struct SinkSpec {
    /// Nodes to connect the consumers to, in turn.
    pub addresses: Vec<String>,
    pub queue: String,
    /// Only producers whose id starts with this are the run's own; other
    /// deliveries are acked and not counted.
    pub run_tag: String,
    pub consumers: usize,
    /// Total messages per second over all consumers; 0 is uncapped.
    pub rate_cap: f64,
    /// Credits each consumer grants at first, and keeps granted.
    pub credits: u32,
    /// Acks sent in one request (and credits returned with them).
    pub ack_batch: usize,
}

/// One delivery as a consumer saw it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The producer id without the run tag.
    pub producer: String,
    pub attempt: u32,
    /// Arrival, from the start of the run.
    pub at: Duration,
    /// When the produce call of this message started, from the payload.
    pub produced_at: Option<Duration>,

    pub bytes: usize,
}

/// Producers named so (noisy-neighbor's flooders) have their first
/// deliveries counted apart too.
pub const FLOOD_PRODUCER_PREFIX: &str = "flooder-";

/// Live counts shared with the progress line and the stop condition.
#[derive(Debug, Default)]
pub struct Counters {
    pub produced: AtomicU64,
    pub produce_failures: AtomicU64,
    /// Why the first failed produce call failed.
    pub first_produce_failure: std::sync::OnceLock<String>,
    pub first_deliveries: AtomicU64,
    /// Of the first deliveries, those of [`FLOOD_PRODUCER_PREFIX`] producers.
    pub flood_first_deliveries: AtomicU64,
    pub redeliveries: AtomicU64,
}

impl Counters {
    /// Counts a delivery of `producer` (without the run tag).
    pub fn delivered(&self, producer: &str, attempt: u32) {
        if attempt > 1 {
            self.redeliveries.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.first_deliveries.fetch_add(1, Ordering::Relaxed);
        if producer.starts_with(FLOOD_PRODUCER_PREFIX) {
            self.flood_first_deliveries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a failed produce call, keeping the first one's reason.
    pub fn produce_failed(&self, error: &impl std::fmt::Display) {
        self.produce_failures.fetch_add(1, Ordering::Relaxed);
        let _ = self.first_produce_failure.set(error.to_string());
    }
}

/// Running consumers; [`Sink::finish`] collects what they received.
pub struct Sink {
    /// The consumers' own runtime (shut down when the sink is finished or dropped).
    runtime: Option<tokio::runtime::Runtime>,
    consumers: Vec<JoinHandle<Vec<Received>>>,
    stop: watch::Sender<bool>,
    counters: Arc<Counters>,
    target: watch::Receiver<Option<u64>>,
}

impl Sink {
    /// Starts `spec.consumers` consumers. They run until `first_deliveries`
    /// in `counters` reaches the value sent on `target`, or until stopped.
    pub fn start(
        spec: &SinkSpec,
        run_start: Instant,
        counters: Arc<Counters>,
        target: watch::Receiver<Option<u64>>,
    ) -> anyhow::Result<Self> {
        let (stop, stopped) = watch::channel(false);
        let per_consumer_interval = if spec.rate_cap > 0.0 {
            Duration::from_secs_f64(spec.consumers as f64 / spec.rate_cap)
        } else {
            Duration::ZERO
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bench-sink")
            .enable_all()
            .build()?;
        let in_sink_runtime = runtime.enter();
        let mut consumers = Vec::with_capacity(spec.consumers);
        for index in 0..spec.consumers {
            let address = &spec.addresses[index % spec.addresses.len()];
            let client = crate::dial(address)?;
            let run = ConsumerRun {
                client,
                queue: spec.queue.clone(),
                run_tag: spec.run_tag.clone(),
                credits: spec.credits.max(1),
                ack_batch: spec.ack_batch.max(1),
                interval: per_consumer_interval,
                run_start,
                counters: counters.clone(),
                target: target.clone(),
                stopped: stopped.clone(),
            };
            consumers.push(tokio::spawn(run.run()));
        }
        drop(in_sink_runtime);
        Ok(Self {
            runtime: Some(runtime),
            consumers,
            stop,
            counters,
            target,
        })
    }

    /// Stops the consumers (if they have not reached the target) and returns
    /// every delivery they received.
    pub async fn finish(mut self) -> anyhow::Result<Vec<Received>> {
        self.stop.send_replace(true);
        let mut received = Vec::new();
        for consumer in std::mem::take(&mut self.consumers) {
            received.extend(consumer.await?);
        }
        Ok(received)
    }

    /// Waits until the consumers together reached the target, or every one
    /// has ended (stream lost), or `deadline` passes; then stops and
    /// collects them. (A consumer waiting for its next delivery does not see
    /// another one reach the target.)
    pub async fn finish_by(self, deadline: Instant) -> anyhow::Result<Vec<Received>> {
        let done = async {
            loop {
                let reached = self.target.borrow().is_some_and(|target| {
                    self.counters.first_deliveries.load(Ordering::Relaxed) >= target
                });
                if reached || self.consumers.iter().all(JoinHandle::is_finished) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let _ = tokio::time::timeout_at(deadline.into(), done).await;
        self.finish().await
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

struct ConsumerRun {
    client: Client,
    queue: String,
    run_tag: String,
    credits: u32,
    ack_batch: usize,
    interval: Duration,
    run_start: Instant,
    counters: Arc<Counters>,
    target: watch::Receiver<Option<u64>>,
    stopped: watch::Receiver<bool>,
}

impl ConsumerRun {
    fn reached_target(&self) -> bool {
        self.target
            .borrow()
            .is_some_and(|target| self.counters.first_deliveries.load(Ordering::Relaxed) >= target)
    }

    /// Consumes until stopped or the target is reached; a stream that
    /// cannot be opened or breaks ends this consumer with what it received.
    async fn run(mut self) -> Vec<Received> {
        let mut received = Vec::new();
        if let Err(error) = self.consume(&mut received).await {
            tracing::warn!(%error, "a consumer lost its stream; the run goes on without it");
        }
        received
    }

    async fn consume(&mut self, received: &mut Vec<Received>) -> Result<(), ClientError> {
        let mut consumer = self.client.consume(&self.queue, self.credits).await?;
        // Deliveries waiting for their processing slot, with that slot.
        let mut processing: VecDeque<(Instant, String)> = VecDeque::new();
        let mut next_free_slot = Instant::now();
        let mut to_ack: Vec<String> = Vec::with_capacity(self.ack_batch);
        let mut ack_by: Option<Instant> = None;
        let mut unsettled = 0usize;
        loop {
            if *self.stopped.borrow() || self.reached_target() {
                break;
            }
            let now = Instant::now();
            while processing.front().is_some_and(|(slot, _)| *slot <= now) {
                let (_, id) = processing.pop_front().expect("checked above");
                to_ack.push(id);
                ack_by.get_or_insert(now + ACK_LINGER);
            }
            if to_ack.len() >= self.ack_batch || ack_by.is_some_and(|by| by <= now) {
                let count = to_ack.len();
                unsettled += count;
                consumer.ack(std::mem::take(&mut to_ack)).await?;
                consumer.credit(count as u32).await?;
                ack_by = None;
            }
            let wake = processing
                .front()
                .map(|(slot, _)| *slot)
                .into_iter()
                .chain(ack_by)
                .min();
            tokio::select! {
                changed = self.stopped.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                changed = self.target.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                () = sleep_until_or_forever(wake) => {}
                event = consumer.next() => match event? {
                    Some(ConsumerEvent::Delivery(delivery)) => {
                        let arrived = Instant::now();
                        if let Some(producer) = delivery.producer_id.strip_prefix(&self.run_tag) {
                            self.counters.delivered(producer, delivery.attempt);
                            received.push(Received {
                                producer: producer.to_owned(),
                                attempt: delivery.attempt,
                                at: arrived - self.run_start,
                                produced_at: stamp::read(&delivery.payload),
                                bytes: delivery.payload.len(),
                            });
                        }
                        let slot = next_free_slot.max(arrived);
                        next_free_slot = slot + self.interval;
                        processing.push_back((slot, delivery.delivery_id));
                    }
                    Some(ConsumerEvent::Settled(outcomes)) => {
                        unsettled = unsettled.saturating_sub(outcomes.len());
                    }
                    None => return Ok(()),
                },
            }
        }
        to_ack.extend(processing.into_iter().map(|(_, id)| id));
        let deadline = Instant::now() + FINAL_ACK_WAIT;
        loop {
            if !to_ack.is_empty() {
                unsettled += to_ack.len();
                consumer.ack(std::mem::take(&mut to_ack)).await?;
            }
            if unsettled == 0 {
                break;
            }
            match tokio::time::timeout_at(deadline.into(), consumer.next()).await {
                Ok(Ok(Some(ConsumerEvent::Settled(outcomes)))) => {
                    unsettled = unsettled.saturating_sub(outcomes.len());
                }
                Ok(Ok(Some(ConsumerEvent::Delivery(late)))) => to_ack.push(late.delivery_id),
                _ => break,
            }
        }
        Ok(())
    }
}

async fn sleep_until_or_forever(wake: Option<Instant>) {
    match wake {
        Some(wake) => tokio::time::sleep_until(wake.into()).await,
        None => std::future::pending().await,
    }
}
