//! The shared sink of a benchmark when floret pushes into it, or when the
//! producers publish straight into RabbitMQ: what arrived and when, in the
//! records the consumers' sink (`sink.rs`) keeps.
//!
//! - [`PushedSink::grpc`]: a `floret.sink.v1.Sink` served here on loopback,
//!   which takes every batch at once; floret's cap on the queue's sink is
//!   the sink's capacity.
//! - [`PushedSink::amqp`]: a RabbitMQ queue drained here by one consumer at
//!   the sink's rate (the capacity of the queue a team pays for). floret
//!   pushes into it, or the producers publish into it straight
//!   ([`RabbitPublisher`], for the FIFO figure).
//!
//! Both run on a runtime of their own, on one thread, as the consumers do.
//!
//! IMPLEMENTATION CAVEATS
//! - A RabbitMQ consumer that loses its connection ends the run's arrivals
//!   with a warning rather than reconnecting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floret_client::Message;
use floret_proto::sink::v1::sink_server::{Sink, SinkServer};
use floret_proto::sink::v1::{DeliverRequest, DeliverResponse, MessageResult, Outcome};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::sink::{Counters, Received};
use super::stamp;

/// Messages the RabbitMQ consumer may hold unacked.
const AMQP_PREFETCH: u16 = 32;
/// How far behind its pace an idle RabbitMQ consumer may fall, and catch up
/// at once: a consumer drains at its rate, it does not save up idle time.
const AMQP_IDLE_CREDIT: Duration = Duration::from_millis(10);
/// How often the end of the run is checked for.
const TARGET_POLL: Duration = Duration::from_millis(20);

/// Records arrivals the way the consumers' sink does.
#[derive(Clone)]
struct Recorder {
    run_tag: String,
    run_start: Instant,
    counters: Arc<Counters>,
    received: Arc<Mutex<Vec<Received>>>,
    /// Every message that arrived, the run's or not.
    arrived: Arc<AtomicU64>,
}

impl Recorder {
    fn new(run_tag: &str, run_start: Instant, counters: Arc<Counters>) -> Self {
        Self {
            run_tag: run_tag.to_owned(),
            run_start,
            counters,
            received: Arc::default(),
            arrived: Arc::default(),
        }
    }

    fn record(&self, producer_id: &str, attempt: u32, payload: &[u8], at: Duration) {
        self.arrived.fetch_add(1, Ordering::Relaxed);
        let Some(producer) = producer_id.strip_prefix(&self.run_tag) else {
            return;
        };
        self.counters.delivered(producer, attempt.max(1));
        self.received
            .lock()
            .expect("never poisoned")
            .push(Received {
                producer: producer.to_owned(),
                attempt: attempt.max(1),
                at,
                produced_at: stamp::read(payload),
                bytes: payload.len(),
            });
    }
}

#[tonic::async_trait]
impl Sink for Recorder {
    async fn deliver(
        &self,
        request: tonic::Request<DeliverRequest>,
    ) -> Result<tonic::Response<DeliverResponse>, tonic::Status> {
        let at = self.run_start.elapsed();
        let messages = request.into_inner().messages;
        for message in &messages {
            self.record(&message.producer_id, message.attempt, &message.payload, at);
        }
        let taken = MessageResult {
            outcome: Outcome::Ok as i32,
            reason: String::new(),
        };
        Ok(tonic::Response::new(DeliverResponse {
            results: vec![taken; messages.len()],
        }))
    }
}

/// A sink floret pushes into, or RabbitMQ the producers publish into.
pub struct PushedSink {
    /// Its own runtime (shut down when the sink is finished or dropped).
    runtime: Option<tokio::runtime::Runtime>,
    task: JoinHandle<()>,
    recorder: Recorder,
    target: watch::Receiver<Option<u64>>,
    /// A RabbitMQ queue to delete once the run is over.
    amqp_queue: Option<(String, String)>,
}

impl PushedSink {
    /// Serves a recording gRPC sink on loopback; returns it and its address
    /// for the queue's sink (`http://127.0.0.1:port`).
    pub fn grpc(
        run_tag: &str,
        run_start: Instant,
        counters: Arc<Counters>,
        target: watch::Receiver<Option<u64>>,
    ) -> anyhow::Result<(Self, String)> {
        let runtime = own_runtime()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let address = format!("http://{}", listener.local_addr()?);
        let recorder = Recorder::new(run_tag, run_start, counters);
        let service = SinkServer::new(recorder.clone()).max_decoding_message_size(usize::MAX);
        let task = runtime.spawn(async move {
            let served = match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => {
                    tonic::transport::Server::builder()
                        .add_service(service)
                        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(
                            listener,
                        ))
                        .await
                }
                Err(error) => {
                    tracing::warn!(%error, "the bench's sink cannot listen");
                    return;
                }
            };
            if let Err(error) = served {
                tracing::warn!(%error, "the bench's sink stopped serving");
            }
        });
        let sink = Self {
            runtime: Some(runtime),
            task,
            recorder,
            target,
            amqp_queue: None,
        };
        Ok((sink, address))
    }

    /// Declares `queue` at the RabbitMQ `uri` (durable; a new one per run) and drains
    /// it at `rate` messages/s (0: as fast as it goes).
    pub async fn amqp(
        uri: &str,
        queue: &str,
        rate: f64,
        (run_tag, run_start): (&str, Instant),
        counters: Arc<Counters>,
        target: watch::Receiver<Option<u64>>,
    ) -> anyhow::Result<Self> {
        let runtime = own_runtime()?;
        let (uri_owned, queue_owned) = (uri.to_owned(), queue.to_owned());
        let channel = runtime.spawn(async move {
            let (uri, queue) = (uri_owned, queue_owned);
            let connection = Connection::connect(&uri, ConnectionProperties::default()).await?;
            let channel = connection.create_channel().await?;
            channel
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions::durable(),
                    FieldTable::default(),
                )
                .await?;
            channel
                .basic_qos(AMQP_PREFETCH, BasicQosOptions::default())
                .await?;
            Ok::<_, lapin::Error>(channel)
        });
        let channel = channel.await??;
        let recorder = Recorder::new(run_tag, run_start, counters);
        let draining = recorder.clone();
        let drained = queue.to_owned();
        let task = runtime.spawn(async move {
            if let Err(error) = drain(channel, &drained, rate, &draining).await {
                tracing::warn!(%error, "the RabbitMQ consumer stopped; the run goes on without it");
            }
        });
        Ok(Self {
            runtime: Some(runtime),
            task,
            recorder,
            target,
            amqp_queue: Some((uri.to_owned(), queue.to_owned())),
        })
    }

    /// Waits until any message at all arrived, the run's or not; false if
    /// none did by `deadline`.
    pub async fn any_arrived_by(&self, deadline: Instant) -> bool {
        while self.recorder.arrived.load(Ordering::Relaxed) == 0 {
            if Instant::now() >= deadline || self.task.is_finished() {
                return false;
            }
            tokio::time::sleep(TARGET_POLL).await;
        }
        true
    }

    /// Waits until the target number of first deliveries arrived (or the
    /// receiver ended, or `deadline` passed) and returns every arrival.
    pub async fn finish_by(mut self, deadline: Instant) -> anyhow::Result<Vec<Received>> {
        let done = async {
            loop {
                let reached = self.target.borrow().is_some_and(|target| {
                    self.recorder
                        .counters
                        .first_deliveries
                        .load(Ordering::Relaxed)
                        >= target
                });
                if reached || self.task.is_finished() {
                    return;
                }
                tokio::time::sleep(TARGET_POLL).await;
            }
        };
        let _ = tokio::time::timeout_at(deadline.into(), done).await;
        self.task.abort();
        if let (Some((uri, queue)), Some(runtime)) = (self.amqp_queue.take(), &self.runtime) {
            let deleted = runtime.spawn(async move {
                let connection = Connection::connect(&uri, ConnectionProperties::default()).await?;
                let channel = connection.create_channel().await?;
                channel
                    .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                    .await?;
                Ok::<_, lapin::Error>(())
            });
            if let Ok(Err(error)) = deleted.await {
                tracing::warn!(%error, "could not delete the run's RabbitMQ queue");
            }
        }
        let received = std::mem::take(&mut *self.recorder.received.lock().expect("never poisoned"));
        Ok(received)
    }
}

impl Drop for PushedSink {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn own_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-sink")
        .enable_all()
        .build()
}

/// Consumes `queue` one message per `1 / rate` seconds (an idle consumer
/// saves up at most [`AMQP_IDLE_CREDIT`]), recording each:
/// its producer and attempt from floret's headers (or the publisher's).
async fn drain(
    channel: Channel,
    queue: &str,
    rate: f64,
    recorder: &Recorder,
) -> Result<(), lapin::Error> {
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "floret-bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let pace = (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate));
    let mut next = tokio::time::Instant::now();
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery?;
        let at = recorder.run_start.elapsed();
        let header = |name: &str| -> Option<String> {
            let headers = delivery.properties.headers().as_ref()?;
            match headers.inner().get(name)? {
                AMQPValue::LongString(value) => Some(value.to_string()),
                _ => None,
            }
        };
        let producer = header("x-floret-producer").unwrap_or_default();
        let attempt = header("x-floret-attempt")
            .and_then(|attempt| attempt.parse().ok())
            .unwrap_or(1);
        recorder.record(&producer, attempt, &delivery.data, at);
        delivery.ack(BasicAckOptions::default()).await?;
        if let Some(pace) = pace {
            next = next.max(tokio::time::Instant::now() - AMQP_IDLE_CREDIT) + pace;
            tokio::time::sleep_until(next).await;
        }
    }
    Ok(())
}

/// Publishes produce calls straight into a RabbitMQ queue (no floret), each
/// message persistent and confirmed, with the producer in the header floret
/// sets, so the consumer tells producers apart the same way.
#[derive(Clone)]
pub struct RabbitPublisher {
    channel: Channel,
    queue: String,
}

impl RabbitPublisher {
    /// A publisher into `queue` (which [`PushedSink::amqp`] declares) at `uri`.
    pub async fn connect(uri: &str, queue: &str) -> Result<Self, lapin::Error> {
        let connection = Connection::connect(uri, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            channel,
            queue: queue.to_owned(),
        })
    }

    /// Publishes `messages` as `producer` and waits until RabbitMQ confirmed
    /// every one.
    pub async fn publish(&self, producer: &str, messages: Vec<Message>) -> Result<(), String> {
        let mut headers = FieldTable::default();
        headers.insert(
            ShortString::from("x-floret-producer"),
            AMQPValue::LongString(LongString::from(producer)),
        );
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers);
        let mut confirms = Vec::with_capacity(messages.len());
        for message in messages {
            let confirm = self
                .channel
                .basic_publish(
                    "".into(),
                    self.queue.as_str().into(),
                    BasicPublishOptions::default(),
                    &message.payload,
                    properties.clone(),
                )
                .await
                .map_err(|error| error.to_string())?;
            confirms.push(confirm);
        }
        for confirm in confirms {
            let confirmation = confirm.await.map_err(|error| error.to_string())?;
            if confirmation.is_nack() {
                return Err("RabbitMQ refused a message (nack)".to_owned());
            }
        }
        Ok(())
    }
}
