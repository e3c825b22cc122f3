//! A cluster of real `floret serve` processes on loopback whose peer links
//! run through [`Link`] proxies, and the faults the schedules inject into
//! it: SIGKILL, SIGSTOP/SIGCONT, restarts (with fault points switched on
//! through `FAILPOINTS`), partitions, and damage to a stopped node's data dir.
//!
//! The faults themselves are `faults.rs`; adding and removing members is
//! `members.rs`; cutting gossip and checking the view is `gossip.rs`; waiting on and checking the shards' raft state
//! (catch-up, leaders, replica digests) is `raft_state.rs`.
//!
//! Node `i` dials node `j`'s peer port through its own proxy `i→j`;
//! clients dial the nodes' client ports directly. With `tls` the nodes
//! serve TLS and mutual TLS with certificates from `floret certs` (the
//! proxies pass the encrypted bytes through). With `tenants` they take
//! tokens (`floret token keygen`): the cluster's own clients are an admin
//! tenant, the workload's producers and consumers tenants of their own
//! ([`Cluster::workload_tokens`]). Every process is killed when the cluster drops.
//!
//! IMPLEMENTATION CAVEATS
//! - Ports are picked by binding port 0 and releasing it; another process
//!   could take one in between.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use floret_client::Client;

use crate::workload::{QUEUE, WorkloadTokens};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::process::{
    ClusterCerts, ClusterTokens, LOG_FILTER, START_DEADLINE, ServeArgs, TEST_MIN_FREE_BYTES,
    peers_flag, ready_address,
};
use crate::proxy::Link;

mod faults;
mod gossip;
mod members;
mod raft_state;

pub use faults::flip_bit;

/// Node ids are 1..=size.
pub type NodeId = u64;

/// How long a started cluster's gossip may take to see every node alive.
pub const FULL_VIEW_DEADLINE: Duration = Duration::from_secs(30);

/// What a run's nodes are started with.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The `floret` binary.
    pub binary: PathBuf,
    /// Where the data dirs, logs and config go.
    pub root: PathBuf,
    /// Nodes (3 for every schedule here).
    pub size: u64,
    /// Extra lines for the nodes' config file (TOML).
    pub config: String,
    /// `FAILPOINTS` for the first start of every node (restarts get their own).
    pub start_failpoints: String,
    /// Serve TLS on the client ports and mutual TLS between the nodes.
    pub tls: bool,
    /// Cut every node's gossip for the whole run (else the view must be
    /// complete before the run goes on).
    pub gossip_cut: bool,
    /// Give the nodes token keys: every call names a tenant.
    pub tenants: bool,
}

/// One node's process, when it runs.
struct Node {
    /// Its client port.
    address: SocketAddr,
    /// Its peer port, which the other nodes reach through their links.
    peer_address: SocketAddr,
    child: Option<Child>,
    paused: bool,
}

/// A running cluster with proxied peer links.
pub struct Cluster {
    spec: ClusterSpec,
    nodes: BTreeMap<NodeId, Node>,
    links: BTreeMap<(NodeId, NodeId), Link>,
    certs: Option<ClusterCerts>,
    /// The tokens' signing key, and the admin token the cluster's own
    /// clients send, when the nodes take tokens.
    tokens: Option<(ClusterTokens, String)>,
    /// Nodes that joined the running cluster (started with `--join`).
    joined: BTreeSet<NodeId>,
}

impl Cluster {
    /// Starts every node of `spec` at once and waits until each serves.
    pub async fn start(spec: ClusterSpec) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&spec.root)?;
        std::fs::write(spec.root.join("floret.toml"), &spec.config)?;
        let mut nodes = BTreeMap::new();
        let mut ports = crate::ports::free_loopback_ports(2 * spec.size as usize)?;
        let peer_ports = ports.split_off(spec.size as usize);
        for (id, (port, peer_port)) in (1..=spec.size).zip(ports.into_iter().zip(peer_ports)) {
            nodes.insert(
                id,
                Node {
                    address: SocketAddr::from(([127, 0, 0, 1], port)),
                    peer_address: SocketAddr::from(([127, 0, 0, 1], peer_port)),
                    child: None,
                    paused: false,
                },
            );
        }
        let mut links = BTreeMap::new();
        for from in 1..=spec.size {
            for to in 1..=spec.size {
                if from != to {
                    links.insert((from, to), Link::start(nodes[&to].peer_address).await?);
                }
            }
        }
        let certs = match spec.tls {
            true => Some(
                ClusterCerts::make(&spec.binary, &spec.root.join("certs"), spec.size as usize)
                    .map_err(anyhow::Error::msg)?,
            ),
            false => None,
        };
        let tokens = match spec.tenants {
            true => {
                let tokens = ClusterTokens::make(&spec.binary, &spec.root.join("tokens"))
                    .map_err(anyhow::Error::msg)?;
                let admin = tokens
                    .token("chaos-admin", "admin", "")
                    .map_err(anyhow::Error::msg)?;
                Some((tokens, admin))
            }
            false => None,
        };
        let mut cluster = Self {
            spec,
            nodes,
            links,
            certs,
            tokens,
            joined: BTreeSet::new(),
        };
        cluster.set_gossip_cut(cluster.spec.gossip_cut)?;
        let failpoints = cluster.spec.start_failpoints.clone();
        for id in 1..=cluster.spec.size {
            cluster.spawn(id, &failpoints)?;
        }
        for id in 1..=cluster.spec.size {
            cluster.wait_ready(id).await?;
        }
        if !cluster.spec.gossip_cut {
            cluster.wait_for_full_view(FULL_VIEW_DEADLINE).await?;
        }
        Ok(cluster)
    }

    /// An id no node of this cluster ever had: the next one after the
    /// founders and every node that joined.
    pub fn unused_id(&self) -> NodeId {
        self.joined.iter().max().copied().unwrap_or(self.spec.size) + 1
    }

    /// Node ids.
    pub fn ids(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    /// Every node's client address, comma-separated.
    pub fn addresses(&self) -> String {
        self.nodes
            .values()
            .map(|n| n.address.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A client of node `id` alone.
    pub fn client(&self, id: NodeId) -> Client {
        self.client_of(&self.nodes[&id].address.to_string())
            .expect("a socket address")
    }

    /// A client of the nodes at `addresses` (comma-separated), over TLS
    /// when the cluster serves it, as the admin tenant when it takes tokens.
    pub fn client_of(&self, addresses: &str) -> anyhow::Result<Client> {
        let admin = self.tokens.as_ref().map(|(_, admin)| admin.as_str());
        Ok(Client::connect_lazy_as(
            addresses,
            self.client_tls().as_ref(),
            admin,
        )?)
    }

    /// When the nodes take tokens: tokens for `tenants` producing tenants
    /// and one consuming tenant, on the workload's queue alone.
    pub fn workload_tokens(&self, tenants: u32) -> anyhow::Result<Option<WorkloadTokens>> {
        let Some((tokens, _)) = &self.tokens else {
            return Ok(None);
        };
        let producing = (0..tenants.max(1))
            .map(|tenant| {
                let name = format!("tenant{tenant}");
                let token = tokens
                    .token(&name, "produce", QUEUE)
                    .map_err(anyhow::Error::msg)?;
                anyhow::Ok((name, token))
            })
            .collect::<Result<_, _>>()?;
        let consuming = tokens
            .token("sink", "consume", QUEUE)
            .map_err(anyhow::Error::msg)?;
        Ok(Some(WorkloadTokens {
            producing,
            consuming,
        }))
    }

    /// How clients trust the nodes, when the cluster serves TLS.
    pub fn client_tls(&self) -> Option<floret_client::ClientTls> {
        self.certs.as_ref().map(ClusterCerts::client_tls)
    }

    /// Node `id`'s data dir.
    pub fn data_dir(&self, id: NodeId) -> PathBuf {
        self.spec.root.join(format!("node-{id}"))
    }

    /// Node `id`'s log file (every run of it, appended).
    pub fn log_path(&self, id: NodeId) -> PathBuf {
        self.spec.root.join(format!("node-{id}.log"))
    }

    /// Ids of the nodes that run and are not paused.
    pub fn serving(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.child.is_some() && !n.paused)
            .map(|(&id, _)| id)
            .collect()
    }

    fn spawn(&mut self, id: NodeId, failpoints: &str) -> anyhow::Result<()> {
        let (peers, join) = if self.joined.contains(&id) {
            let members = peers_flag(
                self.nodes
                    .iter()
                    .filter(|&(&other, _)| other != id)
                    .map(|(&other, node)| (other, node.peer_address)),
            );
            let own_peer_address = self.nodes[&id].peer_address.to_string();
            let join = vec![
                "--join".to_owned(),
                members,
                "--peer-listen".to_owned(),
                own_peer_address,
            ];
            (None, join)
        } else {
            let peers = peers_flag((1..=self.spec.size).map(|founder| {
                let address = if founder == id {
                    self.nodes[&id].peer_address
                } else {
                    self.links[&(id, founder)].address
                };
                (founder, address)
            }));
            (Some(peers), Vec::new())
        };
        let certificates = self
            .certs
            .as_ref()
            .map(|certs| certs.serve_flags(id))
            .into_iter()
            .flatten();
        let token_keys = self.tokens.as_ref().into_iter().flat_map(|(tokens, _)| {
            [
                "--token-keys".to_owned(),
                tokens.public_key().display().to_string(),
            ]
        });
        let args = ServeArgs {
            data_dir: self.data_dir(id),
            node_id: Some(id),
            listen: Some(self.nodes[&id].address.to_string()),
            peers,
            config: Some(self.spec.root.join("floret.toml")),
            extra: join
                .into_iter()
                .chain(certificates)
                .chain(token_keys)
                .collect(),
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))?;
        let mut command = Command::new(&self.spec.binary);
        command
            .args(args.to_args())
            .env("RUST_LOG", LOG_FILTER)
            .env("FLORET_MIN_FREE_BYTES", TEST_MIN_FREE_BYTES)
            .env("FAILPOINTS", self.with_gossip_cut(failpoints))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("spawn {}", self.spec.binary.display()))?;
        let node = self.nodes.get_mut(&id).expect("known node");
        node.child = Some(child);
        node.paused = false;
        Ok(())
    }

    async fn wait_ready(&mut self, id: NodeId) -> anyhow::Result<()> {
        let log_path = self.log_path(id);
        let child = self
            .nodes
            .get_mut(&id)
            .and_then(|n| n.child.as_mut())
            .context("node not started")?;
        let stdout = child.stdout.take().context("stdout already taken")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(START_DEADLINE, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if ready_address(&line).is_some() {
                    return true;
                }
            }
            false
        })
        .await;
        match ready {
            Ok(true) => {}
            Ok(false) => bail!(
                "node {id} exited before it served; its log ends:\n{}",
                log_tail(&log_path)
            ),
            Err(_) => bail!(
                "node {id} did not become ready within {START_DEADLINE:?}; its log ends:\n{}",
                log_tail(&log_path)
            ),
        }
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(())
    }

    /// SIGKILL of node `id` (no-op when it is not running).
    pub async fn kill(&mut self, id: NodeId) {
        let node = self.nodes.get_mut(&id).expect("known node");
        if let Some(mut child) = node.child.take() {
            let _already_gone = child.kill().await;
        }
        node.paused = false;
    }

    /// Starts node `id` on whatever its data dir holds, with the fault
    /// points `failpoints` (the `FAILPOINTS` syntax; empty for none), and
    /// waits until it serves.
    pub async fn restart(&mut self, id: NodeId, failpoints: &str) -> anyhow::Result<()> {
        self.kill(id).await;
        self.spawn(id, failpoints)?;
        self.wait_ready(id).await
    }

    /// SIGKILLs every node of `ids` that runs, all at once, starts them all, with the
    /// fault points `failpoints`, then waits until each serves: a node
    /// waits for its shards' leaders, so nodes that need each other for a
    /// majority must start together.
    pub async fn restart_all(&mut self, ids: &[NodeId], failpoints: &str) -> anyhow::Result<()> {
        for &id in ids {
            if let Some(child) = self.nodes.get_mut(&id).and_then(|n| n.child.as_mut()) {
                let _already_gone = child.start_kill();
            }
        }
        for &id in ids {
            self.kill(id).await;
        }
        for &id in ids {
            self.spawn(id, failpoints)?;
        }
        for &id in ids {
            self.wait_ready(id).await?;
        }
        Ok(())
    }
}

/// The last lines of a node's log, colour codes removed.
fn log_tail(log_path: &Path) -> String {
    let log = std::fs::read_to_string(log_path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    strip_colours(&lines[lines.len().saturating_sub(20)..].join("\n"))
}

/// `text` without ANSI escape sequences (the nodes' logs are coloured).
pub fn strip_colours(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            plain.push(c);
        }
    }
    plain
}
