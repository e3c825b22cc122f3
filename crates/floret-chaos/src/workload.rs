//! The workload of a chaos run: producers sending one message per call
//! through a client of every node, and one consumer per node reading and
//! acking in small batches (so a killed consumer holds leases), every step
//! recorded in the [`Recorder`].
//!
//! While the faults run, the consumers are capped below the producers'
//! rate so the producers stay backlogged (which the fairness figure needs);
//! the drain lifts the cap and reads until the cluster holds nothing.
//!
//! On a cluster that takes tokens the producers are several tenants
//! (producer `p` is tenant `p % tenants`'s, stored as `tenant/chaos-p`) and
//! the consumers one more; the history names producers without the tenant.
//!
//! IMPLEMENTATION CAVEATS
//! - One queue; producers do not use idempotency sequences (each attempt is
//!   a new message, so a retry shows up as its own attempt).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use floret_client::{Client, ClientTls, Message};
use tokio::sync::watch;
use tokio::task::JoinHandle;

mod consume;

use crate::history::{Event, MessageId, Outcome, Payload, Recorder, encode_payload, producer_name};
use consume::consume;

/// The queue the workload uses.
pub const QUEUE: &str = "chaos";
/// A produce call that takes longer has an unknown outcome.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed produce or a broken consume stream.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// A consumer acks after this many deliveries, or when idle this long.
const ACK_BATCH: usize = 16;
const ACK_IDLE: Duration = Duration::from_millis(50);
/// How long the cluster must report an empty queue before a drain gives up
/// on acknowledged messages it never delivered.
const EMPTY_FOR: Duration = Duration::from_secs(5);
/// Deliveries a consume stream may have unacked.
const CREDITS: u32 = 64;

/// Sizes of a workload.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    /// Producer tasks.
    pub producers: u32,
    /// Payload bytes per message.
    pub payload_bytes: usize,
    /// Deliveries per second each consumer takes while capped.
    pub capped_consume_rate: u32,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        Self {
            producers: 6,
            payload_bytes: 64,
            capped_consume_rate: 150,
        }
    }
}

/// The tokens a workload's clients send to a cluster that takes tokens.
#[derive(Debug, Clone)]
pub struct WorkloadTokens {
    /// The producing tenants and their tokens: producer `p` is the
    /// `p % len`th's.
    pub producing: Vec<(String, String)>,
    /// The consumers' token.
    pub consuming: String,
}

impl WorkloadTokens {
    fn of_producer(&self, producer: u32) -> &(String, String) {
        &self.producing[producer as usize % self.producing.len()]
    }
}

/// A consumer task and the node it reads through.
struct ConsumerTask {
    address: String,
    task: JoinHandle<()>,
}

/// Producers and consumers running against a cluster.
pub struct Workload {
    recorder: Recorder,
    spec: WorkloadSpec,
    stop_producing: watch::Sender<bool>,
    stop_consuming: watch::Sender<bool>,
    capped: watch::Sender<bool>,
    producers: Vec<JoinHandle<()>>,
    consumers: Vec<ConsumerTask>,
    /// Index the next consumer task gets (a replacement gets a new one).
    next_consumer: u32,
    /// How clients trust the nodes, when the cluster serves TLS.
    tls: Option<ClientTls>,
    /// What clients send, when the cluster takes tokens.
    tokens: Option<WorkloadTokens>,
}

impl Workload {
    /// Starts `spec.producers` producers over `all_addresses` and one
    /// consumer per address in `consumer_addresses`, over TLS with `tls`,
    /// as tenants with `tokens`.
    pub fn start(
        spec: WorkloadSpec,
        recorder: Recorder,
        all_addresses: &str,
        consumer_addresses: &[String],
        tls: Option<ClientTls>,
        tokens: Option<WorkloadTokens>,
    ) -> anyhow::Result<Self> {
        let (stop_producing, _) = watch::channel(false);
        let (stop_consuming, _) = watch::channel(false);
        let (capped, _) = watch::channel(true);
        let mut workload = Self {
            recorder,
            spec,
            stop_producing,
            stop_consuming,
            capped,
            producers: Vec::new(),
            consumers: Vec::new(),
            next_consumer: 0,
            tls,
            tokens,
        };
        for producer in 0..workload.spec.producers {
            let token = workload
                .tokens
                .as_ref()
                .map(|tokens| tokens.of_producer(producer).1.as_str());
            let client = Client::connect_lazy_as(all_addresses, workload.tls.as_ref(), token)?;
            workload.producers.push(tokio::spawn(produce(
                producer,
                client,
                workload.spec.payload_bytes,
                workload.recorder.clone(),
                workload.stop_producing.subscribe(),
            )));
        }
        for address in consumer_addresses {
            let task = workload.spawn_consumer(address)?;
            workload.consumers.push(ConsumerTask {
                address: address.clone(),
                task,
            });
        }
        Ok(workload)
    }

    fn spawn_consumer(&mut self, address: &str) -> anyhow::Result<JoinHandle<()>> {
        self.next_consumer += 1;
        let token = self.tokens.as_ref().map(|tokens| tokens.consuming.as_str());
        Ok(tokio::spawn(consume(
            self.next_consumer,
            Client::connect_lazy_as(address, self.tls.as_ref(), token)?,
            self.tokens.clone(),
            self.spec.capped_consume_rate,
            self.recorder.clone(),
            self.stop_consuming.subscribe(),
            self.capped.subscribe(),
        )))
    }

    /// Consumer tasks.
    pub fn consumer_count(&self) -> usize {
        self.consumers.len()
    }

    /// Kills consumer `index` where it stands, leases and unsent acks
    /// included, and starts a new one in its place.
    pub async fn kill_consumer(&mut self, index: usize) -> anyhow::Result<()> {
        self.consumers[index].task.abort();
        let address = self.consumers[index].address.clone();
        let task = self.spawn_consumer(&address)?;
        let old = std::mem::replace(&mut self.consumers[index].task, task);
        let _aborted = old.await;
        Ok(())
    }

    /// Stops the producers and waits for their last calls to end.
    pub async fn stop_producing(&mut self) {
        self.stop_producing.send_replace(true);
        for producer in self.producers.drain(..) {
            let _ = producer.await;
        }
    }

    /// Lifts the consumers' rate cap and reads until `holds_nothing` says
    /// the cluster has nothing left and either every acknowledged message
    /// was delivered or it has said so for [`EMPTY_FOR`] (what is missing
    /// then is lost), up to `within`; then stops the consumers. False when
    /// time ran out.
    pub async fn drain<F, Fut>(&mut self, within: Duration, mut holds_nothing: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        self.capped.send_replace(false);
        let until = Instant::now() + within;
        let mut empty_since = None;
        let mut done = false;
        while Instant::now() < until {
            if holds_nothing().await {
                let since = *empty_since.get_or_insert_with(Instant::now);
                if every_acknowledged_delivered(&self.recorder) || since.elapsed() >= EMPTY_FOR {
                    done = true;
                    break;
                }
            } else {
                empty_since = None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.stop_consuming.send_replace(true);
        for consumer in self.consumers.drain(..) {
            let _ = consumer.task.await;
        }
        done
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        for task in &self.producers {
            task.abort();
        }
        for consumer in &self.consumers {
            consumer.task.abort();
        }
    }
}

/// Whether every acknowledged attempt has a delivery in the history so far
/// (a delivery may be recorded before its producer heard the ack).
fn every_acknowledged_delivered(recorder: &Recorder) -> bool {
    recorder.read(|history| {
        let mut acknowledged = Vec::new();
        let mut delivered = std::collections::HashSet::new();
        for record in history {
            match &record.event {
                Event::Completed {
                    id,
                    outcome: Outcome::Acknowledged { .. },
                } => acknowledged.push(*id),
                Event::Delivered {
                    payload: Payload::Intact(id),
                    ..
                } => {
                    delivered.insert(*id);
                }
                _ => {}
            }
        }
        acknowledged.iter().all(|id| delivered.contains(id))
    })
}

/// Waits `pause` or until `stop` turns true; true when it did.
async fn stopped_within(stop: &mut watch::Receiver<bool>, pause: Duration) -> bool {
    let _ = tokio::time::timeout(pause, stop.wait_for(|stop| *stop)).await;
    *stop.borrow()
}

/// One producer: one message per call, one call at a time, until stopped.
async fn produce(
    producer: u32,
    client: Client,
    payload_bytes: usize,
    recorder: Recorder,
    mut stop: watch::Receiver<bool>,
) {
    let name = producer_name(producer);
    let mut counter = 0;
    while !*stop.borrow() {
        counter += 1;
        let id = MessageId { producer, counter };
        let message = Message {
            payload: encode_payload(id, payload_bytes),
            headers: HashMap::new(),
        };
        recorder.record(Event::Invoked(id));
        let call = client.produce(QUEUE, &name, vec![message]);
        let outcome = match tokio::time::timeout(PRODUCE_TIMEOUT, call).await {
            Ok(Ok(response)) => match response.sequences.first() {
                Some(&sequence) => Outcome::Acknowledged { sequence },
                None => Outcome::Unknown {
                    error: "acknowledged without a sequence".into(),
                },
            },
            Ok(Err(floret_client::ClientError::Status(status))) => classify(&status),
            Ok(Err(other)) => Outcome::Unknown {
                error: other.to_string(),
            },
            Err(_) => Outcome::Unknown {
                error: format!("no answer within {PRODUCE_TIMEOUT:?}"),
            },
        };
        let failed = !matches!(outcome, Outcome::Acknowledged { .. });
        recorder.record(Event::Completed { id, outcome });
        if failed && stopped_within(&mut stop, RETRY_PAUSE).await {
            return;
        }
    }
}

/// A refusal that means nothing was stored is a failure; anything else
/// leaves the outcome open.
fn classify(status: &tonic::Status) -> Outcome {
    use tonic::Code;
    let error = format!("{:?}: {}", status.code(), status.message());
    match status.code() {
        Code::InvalidArgument
        | Code::ResourceExhausted
        | Code::FailedPrecondition
        | Code::NotFound
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::OutOfRange
        | Code::AlreadyExists => Outcome::Failed { error },
        _ => Outcome::Unknown { error },
    }
}
