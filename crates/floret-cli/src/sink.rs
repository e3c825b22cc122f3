//! `floret sink set|get|remove|serve`: where a queue's messages are pushed,
//! shown as JSON; and a development sink that records what it gets.

use std::time::Instant;

use floret_client::dev_sink::{DevSink, DevSinkBehaviour};
use floret_client::{AmqpSink, GrpcSink, SinkSpec, WebhookSink, sink_spec};

use crate::QueueTarget;

#[derive(clap::Args)]
pub struct SinkArgs {
    #[command(subcommand)]
    command: SinkCommand,
}

#[derive(clap::Subcommand)]
enum SinkCommand {
    /// Push the queue's messages into a sink, a gRPC service or a webhook
    /// (replacing its sink, if any).
    Set(SetArgs),
    /// Show the queue's sink.
    Get(QueueTarget),
    /// Stop pushing the queue's messages.
    Remove(QueueTarget),
    /// Run a gRPC sink that logs what it gets, for demos and tests.
    Serve(ServeArgs),
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).multiple(false)))]
struct SetArgs {
    #[command(flatten)]
    queue: QueueTarget,
    /// A floret.sink.v1.Sink gRPC service: http://host:port.
    #[arg(long, group = "target")]
    grpc: Option<String>,
    /// An HTTP endpoint POSTed a JSON batch: http://host:port/path.
    #[arg(long, group = "target")]
    webhook: Option<String>,
    /// An AMQP 0.9.1 broker (RabbitMQ): amqp://user:password@host:port/vhost.
    #[arg(long, group = "target")]
    amqp: Option<String>,
    /// With --amqp: the exchange ("" is the default one, which routes by queue name).
    #[arg(long, default_value = "")]
    exchange: String,
    /// With --amqp: the routing key; {producer}, {tenant} and {queue} are replaced.
    #[arg(long, default_value = "")]
    routing_key: String,
    /// A batch closes at this many messages [100].
    #[arg(long, default_value_t = 0)]
    batch_max: u32,
    /// A batch closes before its payloads pass this many bytes [1 MiB].
    #[arg(long, default_value_t = 0)]
    batch_max_bytes: u64,
    /// A batch closes once its oldest message has waited this long, ms [5].
    #[arg(long, default_value_t = 0)]
    linger_ms: u32,
    /// A batch not answered within this is sent again, ms [10000].
    #[arg(long, default_value_t = 0)]
    timeout_ms: u32,
    /// Most messages a second the sink gets from the whole cluster [0: no cap].
    #[arg(long, default_value_t = 0)]
    rate: u32,
    /// Most batches the sink has from the whole cluster at once [0: one per node].
    #[arg(long, default_value_t = 0)]
    max_in_flight: u32,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:7900")]
    listen: String,
    /// Most messages a second it takes (0: no limit).
    #[arg(long, default_value_t = 0)]
    rate: u32,
    /// Percent of messages it rejects (always the same ones).
    #[arg(long, default_value_t = 0)]
    reject_percent: u32,
    /// Percent of deliveries it asks for again.
    #[arg(long, default_value_t = 0)]
    retry_percent: u32,
    /// How long it holds each batch before answering, ms.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
}

pub async fn run(args: SinkArgs) -> anyhow::Result<()> {
    match args.command {
        SinkCommand::Set(set) => {
            let client = crate::dial(&set.queue.addr)?;
            let sink = SinkSpec {
                target: Some(match (set.grpc, set.webhook, set.amqp) {
                    (Some(address), _, _) => sink_spec::Target::Grpc(GrpcSink { address }),
                    (None, Some(url), _) => sink_spec::Target::Webhook(WebhookSink { url }),
                    (None, None, Some(uri)) => sink_spec::Target::Amqp(AmqpSink {
                        uri,
                        exchange: set.exchange,
                        routing_key: set.routing_key,
                    }),
                    (None, None, None) => anyhow::bail!("give --grpc, --webhook or --amqp"),
                }),
                batch_max: set.batch_max,
                batch_max_bytes: set.batch_max_bytes,
                linger_ms: set.linger_ms,
                timeout_ms: set.timeout_ms,
                rate: set.rate,
                max_in_flight: set.max_in_flight,
            };
            let stored = client.set_sink(&set.queue.queue, sink).await?;
            println!("{}", serde_json::json!({ "stored": sink_json(&stored) }));
        }
        SinkCommand::Get(target) => {
            let client = crate::dial(&target.addr)?;
            let sink = client.get_sink(&target.queue).await?;
            println!(
                "{}",
                serde_json::json!({ "queue": target.queue, "sink": sink.as_ref().map(sink_json) })
            );
        }
        SinkCommand::Remove(target) => {
            let client = crate::dial(&target.addr)?;
            let removed = client.remove_sink(&target.queue).await?;
            println!(
                "{}",
                serde_json::json!({ "queue": target.queue, "removed": removed })
            );
        }
        SinkCommand::Serve(serve) => serve_dev_sink(serve).await?,
    }
    Ok(())
}

fn sink_json(sink: &SinkSpec) -> serde_json::Value {
    let target = match &sink.target {
        Some(sink_spec::Target::Grpc(grpc)) => serde_json::json!({ "grpc": grpc.address }),
        Some(sink_spec::Target::Webhook(webhook)) => serde_json::json!({ "webhook": webhook.url }),
        Some(sink_spec::Target::Amqp(amqp)) => serde_json::json!({
            "amqp": amqp.uri, "exchange": amqp.exchange, "routing_key": amqp.routing_key
        }),
        None => serde_json::Value::Null,
    };
    serde_json::json!({
        "target": target,
        "batch_max": sink.batch_max,
        "batch_max_bytes": sink.batch_max_bytes,
        "linger_ms": sink.linger_ms,
        "timeout_ms": sink.timeout_ms,
        "rate": sink.rate,
        "max_in_flight": sink.max_in_flight,
    })
}

/// Serves a [`DevSink`] and prints one JSON line a second with what it got.
async fn serve_dev_sink(args: ServeArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    let sink = DevSink::new(DevSinkBehaviour {
        rate: (args.rate > 0).then_some(args.rate),
        reject_percent: args.reject_percent,
        retry_percent: args.retry_percent,
        latency: std::time::Duration::from_millis(args.latency_ms),
    });
    eprintln!("dev sink listening on http://{}", listener.local_addr()?);
    let recorded = sink.clone();
    let serving = tokio::spawn(sink.serve(listener));
    let started = Instant::now();
    let mut reported = 0;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
        if serving.is_finished() {
            break;
        }
        let received = recorded.received();
        let new = &received[reported..];
        if !new.is_empty() {
            let batches = new.last().map_or(0, |r| r.batch) + 1 - new[0].batch;
            let producers: std::collections::BTreeSet<&str> =
                new.iter().map(|r| r.message.producer_id.as_str()).collect();
            println!(
                "{}",
                serde_json::json!({
                    "seconds": started.elapsed().as_secs(),
                    "messages": new.len(),
                    "batches": batches,
                    "producers": producers.len(),
                    "total": received.len(),
                })
            );
            reported = received.len();
        }
    }
    serving.abort();
    Ok(())
}
