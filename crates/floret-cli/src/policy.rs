//! `floret policy set|get`: a queue's default policy, one producer's
//! override or one tenant's policy (its weight and its limits over all its
//! producers), set field by field (or
//! replaced whole) and shown as JSON.

use floret_client::{Expiry, Overflow, Policy};

use crate::QueueTarget;

#[derive(clap::Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(clap::Subcommand)]
enum PolicyCommand {
    /// Set the queue's defaults, with --producer that producer's override,
    /// or with --tenant that tenant's weight and limits.
    Set(SetArgs),
    /// Show the queue's defaults, and with --producer its override and what
    /// is in force, or with --tenant the tenant's policy.
    Get(Target),
}

#[derive(clap::Args)]
struct Target {
    #[command(flatten)]
    queue: QueueTarget,
    /// A producer of the queue (omit for the queue's defaults).
    #[arg(long, default_value = "", conflicts_with = "tenant")]
    producer: String,
    /// A tenant of the queue: its policy takes --weight (its turns among
    /// the queue's tenants on every node) and --max-messages, --max-bytes
    /// and --produce-rate over all its producers on all nodes.
    #[arg(long, default_value = "")]
    tenant: String,
}

#[derive(clap::Args)]
struct SetArgs {
    #[command(flatten)]
    target: Target,
    /// Messages per round-robin turn.
    #[arg(long)]
    weight: Option<u32>,
    /// Tier: a higher one is served first.
    #[arg(long)]
    priority: Option<u32>,
    /// Most messages stored per producer.
    #[arg(long)]
    max_messages: Option<u64>,
    /// Most bytes stored per producer.
    #[arg(long)]
    max_bytes: Option<u64>,
    /// What a produce over the limits does.
    #[arg(long, value_enum)]
    overflow: Option<OverflowArg>,
    /// Messages not delivered within this many ms expire.
    #[arg(long)]
    ttl_ms: Option<u64>,
    /// What expiry does.
    #[arg(long, value_enum)]
    expiry: Option<ExpiryArg>,
    /// Deliveries of a message before it is dead-lettered.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Messages of a producer leased at once (1 = strict order).
    #[arg(long)]
    max_in_flight: Option<u32>,
    /// Messages per second a producer may produce.
    #[arg(long)]
    produce_rate: Option<u32>,
    /// Replace the stored policy with exactly these settings (none given clears it).
    #[arg(long)]
    replace: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum OverflowArg {
    Reject,
    DropOldest,
    DeadLetterOldest,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ExpiryArg {
    DeadLetter,
    Drop,
}

pub async fn run(args: PolicyArgs) -> anyhow::Result<()> {
    match args.command {
        PolicyCommand::Set(set) => {
            let client = crate::dial(&set.target.queue.addr)?;
            let policy = Policy {
                weight: set.weight,
                priority: set.priority,
                max_messages: set.max_messages,
                max_bytes: set.max_bytes,
                overflow: set.overflow.map_or(Overflow::Unset, |o| match o {
                    OverflowArg::Reject => Overflow::Reject,
                    OverflowArg::DropOldest => Overflow::DropOldest,
                    OverflowArg::DeadLetterOldest => Overflow::DeadLetterOldest,
                }) as i32,
                ttl_ms: set.ttl_ms,
                expiry: set.expiry.map_or(Expiry::Unset, |e| match e {
                    ExpiryArg::DeadLetter => Expiry::DeadLetter,
                    ExpiryArg::Drop => Expiry::Drop,
                }) as i32,
                max_attempts: set.max_attempts,
                max_in_flight: set.max_in_flight,
                produce_rate: set.produce_rate,
            };
            let queue = &set.target.queue.queue;
            let stored = if set.target.tenant.is_empty() {
                client
                    .set_policy(queue, &set.target.producer, policy, set.replace)
                    .await?
            } else {
                client
                    .set_tenant_policy(queue, &set.target.tenant, policy, set.replace)
                    .await?
            };
            println!("{}", serde_json::json!({ "stored": policy_json(&stored) }));
        }
        PolicyCommand::Get(target) => {
            let client = crate::dial(&target.queue.addr)?;
            let json = |policy: &Option<Policy>| policy.as_ref().map(policy_json);
            if target.tenant.is_empty() {
                let answer = client
                    .get_policy(&target.queue.queue, &target.producer)
                    .await?;
                println!(
                    "{}",
                    serde_json::json!({
                        "queue_defaults": json(&answer.queue_defaults),
                        "producer_override": json(&answer.producer_override),
                        "effective": json(&answer.effective),
                    })
                );
            } else {
                let answer = client
                    .get_tenant_policy(&target.queue.queue, &target.tenant)
                    .await?;
                println!(
                    "{}",
                    serde_json::json!({
                        "queue_defaults": json(&answer.queue_defaults),
                        "tenant_policy": json(&answer.tenant_policy),
                    })
                );
            }
        }
    }
    Ok(())
}

/// The fields a policy sets, by name.
fn policy_json(policy: &Policy) -> serde_json::Value {
    let mut fields = serde_json::Map::new();
    let mut put = |name: &str, value: Option<serde_json::Value>| {
        if let Some(value) = value {
            fields.insert(name.to_owned(), value);
        }
    };
    put("weight", policy.weight.map(Into::into));
    put("priority", policy.priority.map(Into::into));
    put("max_messages", policy.max_messages.map(Into::into));
    put("max_bytes", policy.max_bytes.map(Into::into));
    put(
        "overflow",
        match policy.overflow() {
            Overflow::Unset => None,
            Overflow::Reject => Some("reject".into()),
            Overflow::DropOldest => Some("drop_oldest".into()),
            Overflow::DeadLetterOldest => Some("dead_letter_oldest".into()),
        },
    );
    put("ttl_ms", policy.ttl_ms.map(Into::into));
    put(
        "expiry",
        match policy.expiry() {
            Expiry::Unset => None,
            Expiry::DeadLetter => Some("dead_letter".into()),
            Expiry::Drop => Some("drop".into()),
        },
    );
    put("max_attempts", policy.max_attempts.map(Into::into));
    put("max_in_flight", policy.max_in_flight.map(Into::into));
    put("produce_rate", policy.produce_rate.map(Into::into));
    fields.into()
}
