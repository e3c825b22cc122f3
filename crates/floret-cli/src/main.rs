//! The `floret` binary: run a node (`serve`) or a local cluster (`dev`), and
//! talk to one (`produce`, `consume`, `status`), govern its producers
//! (`policy`, `dead-letters`), or measure one (`bench`).

mod bench;
mod consume;
mod dead_letters;
mod dev;
mod policy;
mod produce;
mod serve;
mod status;

use clap::{Parser, Subcommand};

/// sled and the gRPC stack allocate per message; mimalloc serves that from
/// per-thread pages instead of glibc's locked arenas. It is built without
/// transparent huge pages (`no_thp`): with them every 2 MiB region it
/// touched stayed resident, and an idle node held 70 MiB instead of 18.
/// On hosts where the kernel's THP mode is `always`, `MIMALLOC_ALLOW_THP=0`
/// turns them off for the process (see the README's configuration).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Default address of a local node.
const DEFAULT_ADDRESS: &str = "127.0.0.1:7701";

/// The node and queue an admin command works on.
#[derive(clap::Args)]
struct QueueTarget {
    /// Node to ask.
    #[arg(long, default_value = DEFAULT_ADDRESS)]
    addr: String,
    /// The queue.
    #[arg(long, default_value = "default")]
    queue: String,
}

#[derive(Parser)]
#[command(
    name = "floret",
    version,
    about = "A clustered fair scheduler for multi-tenant message queues"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node.
    Serve(serve::ServeArgs),
    /// Run a local cluster (three nodes by default) in this process.
    Dev(dev::DevArgs),
    /// Send messages: from arguments, from stdin lines, or a generated load.
    Produce(produce::ProduceArgs),
    /// Receive messages, print one JSON line each, and ack them.
    Consume(consume::ConsumeArgs),
    /// Show the cluster's shards and the queues' statistics.
    Status(status::StatusArgs),
    /// Measure a running floret: noisy-neighbor, throughput, scale.
    Bench(bench::BenchArgs),
    /// Set or show a queue's or a producer's policy (weight, limits, TTL...).
    Policy(policy::PolicyArgs),
    /// List, replay or delete a queue's dead letters.
    DeadLetters(dead_letters::DeadLetterArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let default_log = match cli.command {
        Command::Serve(_) | Command::Dev(_) => "info,openraft=warn,sled=warn",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_log.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    floret_server::failpoints::configure_from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(args).await,
            Command::Dev(args) => dev::run(args).await,
            Command::Produce(args) => produce::run(args).await,
            Command::Consume(args) => consume::run(args).await,
            Command::Status(args) => status::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Policy(args) => policy::run(args).await,
            Command::DeadLetters(args) => dead_letters::run(args).await,
        }
    })
}
