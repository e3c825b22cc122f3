//! Where a noisy-neighbor run's messages go in and come out, by `--sink`:
//! in through floret, or straight into RabbitMQ; out through consumers,
//! through the queue's floret sink into a gRPC sink or RabbitMQ, or out of
//! RabbitMQ alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use floret_client::{AmqpSink, Client, GrpcSink, Message, sink_spec};
use tokio::sync::watch;

use super::super::pushed::{PushedSink, RabbitPublisher};
use super::super::sink::{Counters, Received, Sink};
use super::NoisyArgs;

/// The share of `--sink-rate` floret's sink is capped at when it pushes into
/// RabbitMQ, so RabbitMQ's own queue stays short and the waiting, in fair
/// order, happens in floret.
const AMQP_CAP_SHARE: f64 = 0.95;

/// The producer of the message that shows the sink pumps before the run
/// starts (not the run's: it is not counted).
const PROBE_PRODUCER: &str = "floret-bench-probe";
/// How long the queue's sink may take to start pumping (nodes read the
/// sinks once a second).
const PUMP_START_DEADLINE: Duration = Duration::from_secs(30);

/// What the sink of a run is.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SinkKind {
    /// Consumers pulling from floret.
    Consumers,
    /// The queue's floret sink, pushing into a gRPC sink served here.
    Grpc,
    /// The queue's floret sink, pushing into a RabbitMQ queue.
    Amqp,
    /// Producers publishing straight into a RabbitMQ queue: no floret.
    RabbitmqAlone,
}

impl SinkKind {
    /// As `--sink` names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Consumers => "consumers",
            Self::Grpc => "grpc",
            Self::Amqp => "amqp",
            Self::RabbitmqAlone => "rabbitmq-alone",
        }
    }
}

/// Where the run's messages come out.
pub enum Outlet {
    Consumers(Sink),
    /// Pushed by the queue's floret sink, which the run set.
    Pushed(PushedSink),
    /// Published straight into RabbitMQ.
    RabbitAlone(PushedSink),
}

impl Outlet {
    /// For `--sink grpc`, `amqp` or `rabbitmq-alone`: starts the receiving
    /// end and, for the first two, sets the queue's floret sink to it.
    pub async fn pushed(
        args: &NoisyArgs,
        client: &Client,
        queue: &str,
        (run_tag, run_start): (&str, Instant),
        counters: Arc<Counters>,
        target: watch::Receiver<Option<u64>>,
    ) -> anyhow::Result<Self> {
        let (sink, floret_target, cap) = match args.sink {
            SinkKind::Grpc => {
                let (sink, address) = PushedSink::grpc(run_tag, run_start, counters, target)?;
                let grpc = sink_spec::Target::Grpc(GrpcSink { address });
                (sink, Some(grpc), args.sink_rate)
            }
            SinkKind::Amqp | SinkKind::RabbitmqAlone => {
                let sink = PushedSink::amqp(
                    &args.amqp_uri,
                    queue,
                    args.sink_rate,
                    (run_tag, run_start),
                    counters,
                    target,
                )
                .await?;
                let amqp = (args.sink == SinkKind::Amqp).then(|| {
                    sink_spec::Target::Amqp(AmqpSink {
                        uri: args.amqp_uri.clone(),
                        exchange: String::new(),
                        routing_key: queue.to_owned(),
                    })
                });
                (sink, amqp, args.sink_rate * AMQP_CAP_SHARE)
            }
            SinkKind::Consumers => anyhow::bail!("consumers are not a pushed sink"),
        };
        let Some(floret_target) = floret_target else {
            return Ok(Self::RabbitAlone(sink));
        };
        let spec = floret_client::SinkSpec {
            target: Some(floret_target),
            batch_max: args.sink_batch_max,
            linger_ms: args.sink_linger_ms,
            max_in_flight: args.sink_max_in_flight,
            rate: args.sink_cap.unwrap_or(cap.max(0.0) as u32),
            ..Default::default()
        };
        client.set_sink(queue, spec).await?;
        let probe = Message {
            payload: b"probe".to_vec(),
            headers: Default::default(),
        };
        client.produce(queue, PROBE_PRODUCER, vec![probe]).await?;
        anyhow::ensure!(
            sink.any_arrived_by(Instant::now() + PUMP_START_DEADLINE)
                .await,
            "the queue's sink did not push a probe message within {PUMP_START_DEADLINE:?}"
        );
        Ok(Self::Pushed(sink))
    }

    /// Waits for the run's messages to come out (until `deadline`), stops
    /// the receiving end, removes a floret sink the run set, and returns
    /// every arrival.
    pub async fn finish_by(
        self,
        client: &Client,
        queue: &str,
        deadline: Instant,
    ) -> anyhow::Result<Vec<Received>> {
        match self {
            Self::Consumers(sink) => sink.finish_by(deadline).await,
            Self::RabbitAlone(sink) => sink.finish_by(deadline).await,
            Self::Pushed(sink) => {
                let received = sink.finish_by(deadline).await?;
                client.remove_sink(queue).await?;
                Ok(received)
            }
        }
    }
}

/// Where the run's producers send.
#[derive(Clone)]
pub enum Front {
    Floret(Box<Client>),
    /// Straight into RabbitMQ, for `--sink rabbitmq-alone`.
    Rabbit(RabbitPublisher),
}

impl Front {
    /// floret, or RabbitMQ's queue `queue` for `--sink rabbitmq-alone`.
    pub async fn for_run(args: &NoisyArgs, client: &Client, queue: &str) -> anyhow::Result<Self> {
        Ok(match args.sink {
            SinkKind::RabbitmqAlone => {
                Self::Rabbit(RabbitPublisher::connect(&args.amqp_uri, queue).await?)
            }
            _ => Self::Floret(Box::new(client.clone())),
        })
    }

    /// One produce call: acknowledged once durable (floret: on a majority;
    /// RabbitMQ: confirmed).
    pub async fn produce(
        &self,
        queue: &str,
        producer: &str,
        messages: Vec<Message>,
    ) -> Result<(), String> {
        match self {
            Self::Floret(client) => client
                .produce(queue, producer, messages)
                .await
                .map(drop)
                .map_err(|error| error.to_string()),
            Self::Rabbit(publisher) => publisher.publish(producer, messages).await,
        }
    }
}
