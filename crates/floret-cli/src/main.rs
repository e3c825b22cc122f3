//! The `floret` binary: run a node (`serve`) or a local cluster (`dev`), and
//! talk to one (`produce`, `consume`, `status`, `health`), govern its producers
//! (`policy`, `dead-letters`), measure one (`bench`), make a cluster's
//! certificates (`certs`) or tenants' tokens (`token`). Every command that talks to a cluster dials it
//! through [`dial`], over TLS when `--tls-ca` is given.

mod bench;
mod certs;
mod cluster;
mod config;
mod consume;
mod dead_letters;
mod dev;
mod health;
mod heap_trim;
mod policy;
mod produce;
mod serve;
mod sink;
mod status;
mod table;
mod token;

use std::path::PathBuf;
use std::sync::OnceLock;

use clap::{Parser, Subcommand};
use floret_client::{Client, ClientTls};

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
    /// The cluster's CA (PEM, `floret certs` makes one): commands dial the
    /// nodes over TLS and trust them by it; `serve` takes its peers by it.
    #[arg(long, global = true, env = "FLORET_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// The tenant's token (`floret token create`), sent on every call to a
    /// cluster whose nodes have token keys.
    #[arg(long, global = true, env = "FLORET_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A client certificate (PEM) to present to the nodes (with --tls-ca
    /// and --client-key): on nodes that map it to a tenant
    /// (`auth.client_certificates`), commands without a token act as it.
    #[arg(
        long,
        global = true,
        env = "FLORET_CLIENT_CERT",
        requires = "client_key"
    )]
    client_cert: Option<PathBuf>,
    /// The private key of --client-cert (PEM).
    #[arg(
        long,
        global = true,
        env = "FLORET_CLIENT_KEY",
        requires = "client_cert"
    )]
    client_key: Option<PathBuf>,
    /// How logs are written to stderr: `text` (coloured on a terminal) or
    /// `json` (one object per line, for log collectors).
    #[arg(long, global = true, env = "FLORET_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
}

/// The CA this process's commands trust the nodes by: set once from `--tls-ca`.
static CLUSTER_CA: OnceLock<Option<PathBuf>> = OnceLock::new();
/// The token this process's commands send: set once from `--token`.
static TENANT_TOKEN: OnceLock<Option<String>> = OnceLock::new();
/// The client certificate and key this process's commands present: set
/// once from `--client-cert` and `--client-key`.
static CLIENT_CERTIFICATE: OnceLock<Option<(PathBuf, PathBuf)>> = OnceLock::new();

/// This process's environment variables that are text (others are
/// skipped, not a panic), for the settings named by their path.
pub(crate) fn environment() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
}

/// A client of the nodes at `address` (one or several, comma-separated),
/// over TLS when `--tls-ca` was given.
pub(crate) fn dial(address: &str) -> anyhow::Result<Client> {
    let mut tls = CLUSTER_CA
        .get()
        .and_then(Option::as_ref)
        .map(ClientTls::from_ca_file)
        .transpose()?;
    if let Some((cert, key)) = CLIENT_CERTIFICATE.get().and_then(Option::as_ref) {
        let Some(cluster_tls) = tls else {
            anyhow::bail!(
                "--client-cert needs --tls-ca: a client certificate is presented over TLS"
            );
        };
        tls = Some(cluster_tls.with_client_certificate_files(cert, key)?);
    }
    let token = TENANT_TOKEN.get().and_then(Option::as_deref);
    Ok(Client::connect_lazy_as(address, tls.as_ref(), token)?)
}

#[derive(Subcommand)]
enum Command {
    /// Run a node.
    Serve(Box<serve::ServeArgs>),
    /// Run a local cluster (three nodes by default) in this process.
    Dev(dev::DevArgs),
    /// Send messages: from arguments, from stdin lines, or a generated load.
    Produce(produce::ProduceArgs),
    /// Receive messages, print one JSON line each, and ack them.
    Consume(consume::ConsumeArgs),
    /// Show the cluster's shards and the queues' statistics.
    Status(status::StatusArgs),
    /// Add or remove a member while the cluster serves.
    Cluster(cluster::ClusterArgs),
    /// Exit 0 if a node serves (gRPC health), 1 if not.
    Health(health::HealthArgs),
    /// Measure a running floret: noisy-neighbor, throughput, scale.
    Bench(bench::BenchArgs),
    /// Set or show a queue's or a producer's policy (weight, limits, TTL...).
    Policy(policy::PolicyArgs),
    /// List, replay or delete a queue's dead letters.
    DeadLetters(dead_letters::DeadLetterArgs),
    /// Push a queue's messages into a sink (a gRPC service), or run a
    /// development sink.
    Sink(sink::SinkArgs),
    /// Make a CA and certificates for a cluster's nodes and clients.
    Certs(certs::CertsArgs),
    /// Make token signing keys, and sign tenants' tokens.
    Token(token::TokenArgs),
    /// Show the configuration a node started here would use, and where
    /// each setting came from.
    Config(config::ConfigArgs),
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A node's default `RUST_LOG`: floret's own info, the libraries'
/// warnings, except openraft's core, which warns at every election about
/// the vote that arrives after the quorum (and about replication sessions
/// it replaced); its errors still show.
const NODE_LOG: &str = "info,openraft=warn,openraft::core::raft_core=error,sled=warn";

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let default_log = match cli.command {
        Command::Serve(_) | Command::Dev(_) => NODE_LOG,
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_log.into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().init(),
    }
    floret_server::failpoints::configure_from_env();
    CLUSTER_CA.get_or_init(|| cli.tls_ca.clone());
    TENANT_TOKEN.get_or_init(|| cli.token.clone());
    CLIENT_CERTIFICATE.get_or_init(|| cli.client_cert.clone().zip(cli.client_key.clone()));
    if matches!(cli.command, Command::Serve(_) | Command::Dev(_)) {
        if !heap_trim::limit_arenas() {
            tracing::debug!("malloc arenas not capped (no glibc, or glibc refused the setting)");
        }
        heap_trim::spawn(heap_trim::TRIM_INTERVAL)
            .map_err(|error| anyhow::anyhow!("cannot start the heap-trim thread: {error}"))?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(*args, cli.tls_ca).await,
            Command::Dev(args) => dev::run(args).await,
            Command::Produce(args) => produce::run(args).await,
            Command::Consume(args) => consume::run(args).await,
            Command::Status(args) => status::run(args).await,
            Command::Cluster(args) => cluster::run(args).await,
            Command::Health(args) => health::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Policy(args) => policy::run(args).await,
            Command::DeadLetters(args) => dead_letters::run(args).await,
            Command::Sink(args) => sink::run(args).await,
            Command::Certs(args) => certs::run(args),
            Command::Token(args) => token::run(args),
            Command::Config(args) => config::run(args),
        }
    })
}
