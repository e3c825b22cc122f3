//! `floret produce`: messages from arguments or stdin lines, or a generated
//! load (`--count`) through [`crate::bench::load`].

use std::collections::HashMap;
use std::io::BufRead;

use anyhow::Context;
use floret_client::Message;

use crate::DEFAULT_ADDRESS;
use crate::bench::load::{self, LoadSpec};

#[derive(clap::Args)]
pub struct ProduceArgs {
    /// Node to send to.
    #[arg(long, default_value = DEFAULT_ADDRESS)]
    addr: String,
    /// Queue to produce into.
    #[arg(long, default_value = "default")]
    queue: String,
    /// Producer id (for a generated load: the prefix of the producer ids).
    #[arg(long, default_value = "cli")]
    producer: String,
    /// Header `key=value` added to every message (repeatable).
    #[arg(long = "header", short = 'H')]
    headers: Vec<String>,
    /// Messages to send; without them (and without --count), stdin lines are sent.
    messages: Vec<String>,
    /// Generate a load of this many messages instead.
    #[arg(long)]
    count: Option<u64>,
    /// Payload size of generated messages, in bytes.
    #[arg(long, default_value_t = 128)]
    size: usize,
    /// Producers the generated load is spread over.
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Messages per produce request (also for stdin lines).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Produce requests in flight at once (generated load).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Generated load: give each producer idempotency sequences and retry
    /// UNAVAILABLE and broken calls (concurrency is capped at --producers).
    #[arg(long)]
    idempotent: bool,
    /// Print the load summary as JSON.
    #[arg(long)]
    json: bool,
    /// Deliver the messages (from arguments or stdin) no earlier than this
    /// many ms from now.
    #[arg(long, conflicts_with = "count")]
    delay_ms: Option<u64>,
}

pub async fn run(args: ProduceArgs) -> anyhow::Result<()> {
    let client = crate::dial(&args.addr)?;
    if let Some(count) = args.count {
        let spec = LoadSpec {
            queue: args.queue,
            producer_prefix: args.producer,
            count,
            size: args.size,
            producers: args.producers.max(1),
            batch: args.batch.max(1),
            concurrency: args.concurrency.max(1),
            idempotent: args.idempotent,
            deadline: None,
            counters: Default::default(),
        };
        let report = load::produce(&client, &spec).await?;
        report.print(args.json);
        return Ok(());
    }
    let headers = parse_headers(&args.headers)?;
    let payloads: Vec<String> = if args.messages.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<_, _>>()
            .context("cannot read stdin")?
    } else {
        args.messages
    };
    let deliver_at_ms = args.delay_ms.map_or(0, |delay| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (now.as_millis() as u64).saturating_add(delay) as i64
    });
    for chunk in payloads.chunks(args.batch.max(1)) {
        let messages = chunk
            .iter()
            .map(|payload| Message {
                payload: payload.clone().into_bytes(),
                headers: headers.clone(),
            })
            .collect();
        let response = client
            .produce_at(&args.queue, &args.producer, messages, deliver_at_ms)
            .await?;
        for sequence in response.sequences {
            println!("{sequence}");
        }
    }
    Ok(())
}

fn parse_headers(headers: &[String]) -> anyhow::Result<HashMap<String, String>> {
    headers
        .iter()
        .map(|header| {
            header
                .split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .with_context(|| format!("header {header:?} is not key=value"))
        })
        .collect()
}
