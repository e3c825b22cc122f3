//! `floret consume`: one JSON line per delivery on stdout, acks in batches,
//! credits refilled as acks go out; `--count` stops after that many.

use std::time::{Duration, Instant};

use floret_client::ConsumerEvent;

use crate::DEFAULT_ADDRESS;

/// Acks sent in one request.
const ACK_BATCH: usize = 64;
/// How long to wait for the last acks' outcomes before exiting.
const FINAL_ACK_WAIT: Duration = Duration::from_secs(10);

#[derive(clap::Args)]
pub struct ConsumeArgs {
    /// Node to consume from.
    #[arg(long, default_value = DEFAULT_ADDRESS)]
    addr: String,
    /// Queue to consume.
    #[arg(long, default_value = "default")]
    queue: String,
    /// Stop after this many deliveries.
    #[arg(long)]
    count: Option<u64>,
    /// Deliveries the server may send ahead of acks.
    #[arg(long, default_value_t = 256)]
    credits: u32,
    /// Print only a summary line (rate) instead of one line per delivery.
    #[arg(long)]
    quiet: bool,
}

pub async fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let client = crate::dial(&args.addr)?;
    let mut consumer = client.consume(&args.queue, args.credits).await?;
    let started = Instant::now();
    let mut received = 0u64;
    let mut to_ack = Vec::with_capacity(ACK_BATCH);
    let mut acks_in_flight = 0usize;
    while args.count.is_none_or(|count| received < count) {
        match consumer.next().await? {
            Some(ConsumerEvent::Delivery(delivery)) => {
                received += 1;
                if !args.quiet {
                    println!(
                        "{}",
                        serde_json::json!({
                            "delivery_id": delivery.delivery_id,
                            "queue": delivery.queue,
                            "producer_id": delivery.producer_id,
                            "sequence": delivery.sequence,
                            "attempt": delivery.attempt,
                            "enqueued_at_unix_ms": delivery.enqueued_at_unix_ms,
                            "headers": delivery.headers,
                            "payload": String::from_utf8_lossy(&delivery.payload),
                        })
                    );
                }
                to_ack.push(delivery.delivery_id);
                if to_ack.len() >= ACK_BATCH {
                    acks_in_flight += 1;
                    consumer.credit(to_ack.len() as u32).await?;
                    consumer.ack(std::mem::take(&mut to_ack)).await?;
                }
            }
            Some(ConsumerEvent::Settled(outcomes)) => {
                acks_in_flight = acks_in_flight.saturating_sub(1);
                report_failed_acks(&outcomes);
            }
            None => break,
        }
    }
    if !to_ack.is_empty() {
        acks_in_flight += 1;
        consumer.ack(to_ack).await?;
    }
    let deadline = Instant::now() + FINAL_ACK_WAIT;
    while acks_in_flight > 0 {
        match tokio::time::timeout_at(deadline.into(), consumer.next()).await {
            Ok(Ok(Some(ConsumerEvent::Settled(outcomes)))) => {
                acks_in_flight -= 1;
                report_failed_acks(&outcomes);
            }
            Ok(Ok(Some(ConsumerEvent::Delivery(_)))) => {}
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                tracing::warn!(
                    acks_in_flight,
                    "stream ended before every ack was confirmed"
                );
                break;
            }
        }
    }
    if args.quiet {
        let seconds = started.elapsed().as_secs_f64().max(f64::EPSILON);
        println!(
            "consumed {received} messages in {seconds:.2} s: {:.0} msg/s",
            received as f64 / seconds
        );
    }
    Ok(())
}

fn report_failed_acks(outcomes: &[floret_client::SettleOutcome]) {
    for outcome in outcomes.iter().filter(|o| o.code != 0) {
        tracing::warn!(delivery_id = %outcome.delivery_id, code = outcome.code, message = %outcome.message, "ack failed");
    }
}
