//! `floret dev`: a local cluster in one command, for trying floret out.
//!
//! Starts `--nodes` nodes in this process on consecutive ports of
//! `--host` (client ports from `--base-port`, peer ports from
//! `--base-port` + 100), each with its own data dir under `--data-dir`,
//! all with the default configuration and the `FLORET_*` variables that
//! apply to every node alike (`FLORET_MIN_FREE_BYTES`, `FLORET_SHARDS`,
//! ...; this command picks each node's id, addresses, data dir, TLS and
//! gossip); prints where they are; stops them all on Ctrl-C.
//! Run it again on the same data dir and the same cluster comes back.
//! The nodes serve TLS and mutual TLS with certificates made by `floret
//! certs` under `--data-dir`/certs on the first run, and seal their gossip
//! with its gossip.key (`--plaintext` turns both off).
//!
//! IMPLEMENTATION CAVEATS
//! - All nodes share one process, so killing it kills the whole cluster; to
//!   kill single nodes run separate `floret serve` processes
//!   (`deploy/local-cluster.sh`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use floret_server::Node;
use floret_server::config::{Config, GossipSettings, PeerConfig, TlsSettings};
use tokio::sync::watch;

/// A node's peer port is this far above its client port.
const PEER_PORT_OFFSET: u16 = 100;

/// How long the development certificates stay valid.
const CERTIFICATE_DAYS: u32 = 365;

/// How long the cluster may take to elect every shard's leader.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(clap::Args)]
pub struct DevArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// Address the nodes listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Client port of node 1; node N listens on base_port + N - 1, and its
    /// peer port is 100 above that.
    #[arg(long, default_value_t = 7701)]
    base_port: u16,
    /// Folder holding one data dir per node (node-1, node-2, ...) and
    /// the cluster's certificates (certs).
    #[arg(long, default_value = "floret-dev")]
    data_dir: PathBuf,
    /// Serve plaintext instead of TLS: anyone who reaches the ports can
    /// read messages and drive the cluster (on --host other than loopback too).
    #[arg(long)]
    plaintext: bool,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.nodes >= 1, "--nodes must be at least 1");
    let address = |id: u16| SocketAddr::new(args.host, args.base_port + id - 1);
    let peer_address =
        |id: u16| SocketAddr::new(args.host, args.base_port + PEER_PORT_OFFSET + id - 1);
    let peers: Vec<PeerConfig> = (1..=args.nodes)
        .map(|id| PeerConfig {
            id: u64::from(id),
            address: peer_address(id).to_string(),
        })
        .collect();
    let certs = args.data_dir.join("certs");
    if !args.plaintext && certs.join("ca.pem").exists() {
        let missing = (1..=args.nodes).find(|id| !certs.join(format!("node-{id}.pem")).exists());
        if let Some(id) = missing {
            anyhow::bail!(
                "{} holds no certificate for node {id}: it was made for fewer nodes; delete that folder to make new ones",
                certs.display()
            );
        }
        if !certs.join("gossip.key").exists() {
            crate::certs::write_gossip_key(&certs)?;
        }
    } else if !args.plaintext {
        let nodes: Vec<u64> = (1..=u64::from(args.nodes)).collect();
        let names: Vec<String> = match args.host.is_loopback() {
            true => Vec::new(),
            false => vec![args.host.to_string()],
        };
        crate::certs::write(&certs, &nodes, &names, &[], CERTIFICATE_DAYS)?;
    }
    let tls = |id: u16| match args.plaintext {
        true => TlsSettings::default(),
        false => TlsSettings {
            cert: Some(certs.join(format!("node-{id}.pem"))),
            key: Some(certs.join(format!("node-{id}.key"))),
            ca: Some(certs.join("ca.pem")),
        },
    };
    let gossip = GossipSettings {
        secret_file: (!args.plaintext).then(|| certs.join("gossip.key")),
        ..GossipSettings::default()
    };
    let from_environment =
        Config::load_overlaid(None, |name| std::env::var(name).ok(), crate::environment())?;
    let mut nodes = Vec::new();
    for id in 1..=args.nodes {
        let config = Config {
            node_id: u64::from(id),
            listen: address(id),
            data_dir: args.data_dir.join(format!("node-{id}")),
            peers: peers.clone(),
            tls: tls(id),
            gossip: gossip.clone(),
            insecure: args.plaintext,
            peer_listen: None,
            advertise: None,
            metrics_listen: None,
            ..from_environment.clone()
        };
        let listeners = floret_server::bind_listeners(&config).await?;
        let data_dir = config.data_dir.clone();
        nodes.push((id, data_dir, Node::start(config, listeners).await?));
    }
    for (_, _, node) in &nodes {
        node.wait_ready(READY_TIMEOUT).await?;
    }
    println!("floret dev cluster of {} nodes is up:", args.nodes);
    for (id, data_dir, node) in &nodes {
        println!(
            "  node {id}  {}  data dir {}",
            node.address(),
            data_dir.display()
        );
    }
    let all: Vec<String> = nodes
        .iter()
        .map(|(_, _, n)| n.address().to_string())
        .collect();
    if !args.plaintext {
        println!(
            "the nodes serve TLS; let the commands trust them:\n      export FLORET_TLS_CA={}",
            certs.join("ca.pem").display()
        );
    }
    println!(
        "try:  floret produce --addr {} hello\n      floret consume --addr {} --count 1\n      floret status --addr {}\nCtrl-C stops every node.",
        all[0],
        all[all.len() - 1],
        all[0]
    );
    let (stop, stopped) = watch::channel(false);
    let running: Vec<_> = nodes
        .into_iter()
        .map(|(_, _, node)| {
            let mut stopped = stopped.clone();
            tokio::spawn(node.serve_until(async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            }))
        })
        .collect();
    crate::serve::shutdown_signal().await;
    let _ = stop.send(true);
    for node in running {
        node.await.context("a node's task failed")?;
    }
    Ok(())
}
