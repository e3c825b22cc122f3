//! `floret dead-letters list|replay|delete`: a queue's dead letters, one
//! JSON line each; replay puts them back into their producers' queues,
//! delete removes them (list, then delete, consumes them).

use floret_client::DeadLetter;

use crate::QueueTarget;

/// Dead letters handled per call when working through all of them.
const PAGE: u32 = 1_000;

#[derive(clap::Args)]
pub struct DeadLetterArgs {
    #[command(subcommand)]
    command: DeadLetterCommand,
}

#[derive(clap::Subcommand)]
enum DeadLetterCommand {
    /// Print dead letters, oldest first, one JSON line each.
    List {
        #[command(flatten)]
        target: QueueTarget,
        /// Most to print.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Put dead letters back at the end of their producers' queues.
    Replay(Selection),
    /// Delete dead letters.
    Delete(Selection),
}

#[derive(clap::Args)]
struct Selection {
    #[command(flatten)]
    target: QueueTarget,
    /// Dead-letter ids as listed (`<shard>:<id>`).
    #[arg(long, value_delimiter = ',', required_unless_present = "all")]
    ids: Vec<String>,
    /// Every dead letter of the queue.
    #[arg(long, conflicts_with = "ids")]
    all: bool,
}

pub async fn run(args: DeadLetterArgs) -> anyhow::Result<()> {
    match args.command {
        DeadLetterCommand::List { target, limit } => {
            let client = crate::dial(&target.addr)?;
            for dead in client.dead_letters(&target.queue, limit).await? {
                println!("{}", dead_letter_json(&dead));
            }
        }
        DeadLetterCommand::Replay(selection) => {
            let count = change(selection, true).await?;
            println!("{}", serde_json::json!({ "replayed": count }));
        }
        DeadLetterCommand::Delete(selection) => {
            let count = change(selection, false).await?;
            println!("{}", serde_json::json!({ "deleted": count }));
        }
    }
    Ok(())
}

/// Replays or deletes the selected dead letters, page by page for `--all`.
async fn change(selection: Selection, replay: bool) -> anyhow::Result<u64> {
    let client = crate::dial(&selection.target.addr)?;
    let queue = &selection.target.queue;
    let apply = |ids: Vec<String>| {
        let client = client.clone();
        async move {
            if replay {
                client.replay_dead_letters(queue, ids).await
            } else {
                client.delete_dead_letters(queue, ids).await
            }
        }
    };
    if !selection.all {
        return Ok(apply(selection.ids).await?);
    }
    let mut total = 0;
    loop {
        let page: Vec<String> = client
            .dead_letters(queue, PAGE)
            .await?
            .into_iter()
            .map(|dead| dead.id)
            .collect();
        if page.is_empty() {
            return Ok(total);
        }
        let changed = apply(page).await?;
        if changed == 0 {
            anyhow::bail!(
                "dead letters are listed but none could be changed; is a shard leaderless?"
            );
        }
        total += changed;
    }
}

fn dead_letter_json(dead: &DeadLetter) -> serde_json::Value {
    serde_json::json!({
        "id": dead.id,
        "producer_id": dead.producer_id,
        "sequence": dead.sequence,
        "reason": dead.reason,
        "attempts": dead.attempts,
        "dead_lettered_at_unix_ms": dead.dead_lettered_at_unix_ms,
        "enqueued_at_unix_ms": dead.enqueued_at_unix_ms,
        "payload": String::from_utf8_lossy(&dead.payload),
        "headers": dead.headers,
    })
}
