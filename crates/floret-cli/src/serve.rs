//! `floret serve`: configuration from defaults, file, environment and flags;
//! then a node until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use floret_server::{Config, Node};

/// How long a starting node waits for its shards to have leaders (a node
/// of a cluster keeps waiting, and says so, while its peers are down).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(clap::Args)]
#[command(
    after_help = "Every setting (`floret config print` lists them) can also be given by a \
variable named after its path: FLORET_, then its sections and key upper-cased and joined by __ \
(FLORET_RAFT__ELECTION_TIMEOUT_MIN_MS=300), or by --set path=value. Flags go over variables, \
variables over the file. Sizes take units (64MiB), durations too (30s)."
)]
pub struct ServeArgs {
    /// TOML configuration file (flags and FLORET_* variables override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The cluster's name: gossip ignores nodes of another name.
    #[arg(long, env = "FLORET_CLUSTER_NAME", hide_env_values = true)]
    cluster_name: Option<String>,
    /// This node's id (> 0).
    #[arg(long, env = "FLORET_NODE_ID", hide_env_values = true)]
    node_id: Option<u64>,
    /// The client port's address (the public gRPC API); port 0 picks a free one.
    #[arg(long, env = "FLORET_LISTEN", hide_env_values = true)]
    listen: Option<SocketAddr>,
    /// The peer port's address (node-to-node calls only; default: the port
    /// of this node's own entry in --peers, on --listen's interface).
    #[arg(long, env = "FLORET_PEER_LISTEN", hide_env_values = true)]
    peer_listen: Option<SocketAddr>,
    /// The address clients are told to dial for this node (default: the
    /// client port's, with this node's --peers host when listening on 0.0.0.0).
    #[arg(long, env = "FLORET_ADVERTISE", hide_env_values = true)]
    advertise: Option<String>,
    /// Data directory.
    #[arg(long, env = "FLORET_DATA_DIR", hide_env_values = true)]
    data_dir: Option<PathBuf>,
    /// Number of shards (fixed when the data dir is created).
    #[arg(long, env = "FLORET_SHARDS", hide_env_values = true)]
    shards: Option<u32>,
    /// Every member of the cluster, this node included, by its peer port:
    /// `1=host:port,2=host:port,...`.
    #[arg(long, env = "FLORET_PEERS", hide_env_values = true)]
    peers: Option<String>,
    /// Join a running cluster instead (after `floret cluster add-node`):
    /// members to ask, `1=host:port,...` by their peer ports. The shard
    /// count, replication factor and members come from them.
    #[arg(
        long,
        env = "FLORET_JOIN",
        hide_env_values = true,
        conflicts_with = "peers"
    )]
    join: Option<String>,
    /// Replicas of each shard.
    #[arg(long, env = "FLORET_REPLICATION_FACTOR", hide_env_values = true)]
    replication_factor: Option<usize>,
    /// UDP address for gossip (default: the peer port's address, UDP).
    #[arg(long, env = "FLORET_GOSSIP_LISTEN", hide_env_values = true)]
    gossip_listen: Option<SocketAddr>,
    /// A file holding the cluster's gossip secret (`floret certs` writes
    /// gossip.key): gossip datagrams are sealed with it.
    #[arg(long, env = "FLORET_GOSSIP_SECRET_FILE", hide_env_values = true)]
    gossip_secret_file: Option<PathBuf>,
    /// Serve Prometheus metrics (`/metrics`) and the web console (`/`) on
    /// this address.
    #[arg(long, env = "FLORET_METRICS_LISTEN", hide_env_values = true)]
    metrics_listen: Option<SocketAddr>,
    /// Lease timeout of a delivery before it is redelivered, in ms.
    #[arg(long)]
    lease_timeout_ms: Option<u64>,
    /// This node's certificate (PEM): the client port serves TLS with it,
    /// and the peer port mutual TLS (with --tls-ca, the cluster's CA).
    #[arg(long, env = "FLORET_TLS_CERT", hide_env_values = true)]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "FLORET_TLS_KEY", hide_env_values = true)]
    tls_key: Option<PathBuf>,
    /// Public keys tenants' tokens are signed with (`floret certs` writes
    /// token.pub; comma-separated, two at once while a key is rotated).
    /// With them every Floret and Admin call needs a token.
    #[arg(
        long,
        value_delimiter = ',',
        env = "FLORET_TOKEN_KEYS",
        hide_env_values = true
    )]
    token_keys: Vec<PathBuf>,
    /// Serve plaintext, or without token keys, on an address other than
    /// loopback (only on a network that the cluster and its clients alone
    /// can reach).
    #[arg(long, env = "FLORET_INSECURE", hide_env_values = true)]
    insecure: bool,
    /// Any setting by its path, as in `floret config print`
    /// (`--set raft.election_timeout_min_ms=300 --set shutdown.drain_timeout_ms=45s`);
    /// over the file and the variables, under the flags above.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    settings: Vec<String>,
}

/// Runs a node; `tls_ca` is the cluster's CA given to the whole command.
pub async fn run(args: ServeArgs, tls_ca: Option<PathBuf>) -> anyhow::Result<()> {
    let mut config = Config::load_overlaid(
        args.config.as_deref(),
        |name| std::env::var(name).ok(),
        crate::environment(),
    )?
    .with_settings(&args.settings)?;
    if let Some(cluster_name) = args.cluster_name {
        config.cluster_name = cluster_name;
    }
    if let Some(node_id) = args.node_id {
        config.node_id = node_id;
    }
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(peer_listen) = args.peer_listen {
        config.peer_listen = Some(peer_listen);
    }
    if let Some(advertise) = args.advertise {
        config.advertise = Some(advertise);
    }
    if let Some(data_dir) = args.data_dir {
        config.data_dir = data_dir;
    }
    if let Some(shards) = args.shards {
        config.shards = Some(shards);
    }
    if let Some(peers) = args.peers {
        config.peers = floret_server::config::parse_peers(&peers)
            .map_err(|message| anyhow::anyhow!("--peers: {message}"))?;
    }
    if let Some(join) = args.join {
        config.join = floret_server::config::parse_peers(&join)
            .map_err(|message| anyhow::anyhow!("--join: {message}"))?;
    }
    if let Some(replication_factor) = args.replication_factor {
        config.replication_factor = replication_factor;
    }
    if let Some(gossip_listen) = args.gossip_listen {
        config.gossip.listen = Some(gossip_listen);
    }
    if let Some(secret_file) = args.gossip_secret_file {
        config.gossip.secret_file = Some(secret_file);
        config.gossip.secret = None;
    }
    if let Some(metrics_listen) = args.metrics_listen {
        config.metrics_listen = Some(metrics_listen);
    }
    if let Some(lease_timeout_ms) = args.lease_timeout_ms {
        config.delivery.lease_timeout_ms = lease_timeout_ms;
    }
    if let Some(cert) = args.tls_cert {
        config.tls.cert = Some(cert);
    }
    if let Some(key) = args.tls_key {
        config.tls.key = Some(key);
    }
    if let Some(ca) = tls_ca {
        config.tls.ca = Some(ca);
    }
    if !args.token_keys.is_empty() {
        config.auth.token_keys = args.token_keys;
    }
    if args.insecure {
        config.insecure = true;
    }
    config.validate()?;
    let listeners = floret_server::bind_listeners(&config).await?;
    let node_id = config.node_id;
    let node = Node::start(config, listeners).await?;
    loop {
        match node.wait_ready(READY_TIMEOUT).await {
            Ok(()) => break,
            Err(error) if node.has_peers() => {
                tracing::warn!(%error, "still waiting for shard leaders; are a majority of the peers up?");
            }
            Err(error) => return Err(error.into()),
        }
    }
    println!("floret node {node_id} serving on {}", node.address());
    node.serve_until(shutdown_signal()).await;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(error) => {
                    tracing::warn!(%error, "cannot watch SIGTERM; only Ctrl-C stops the node");
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
