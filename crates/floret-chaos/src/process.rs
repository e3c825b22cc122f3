//! What every test that starts real `floret serve` processes shares: the
//! command line of a node, its ready line, how long it may take to start,
//! the certificates of a cluster that runs over TLS ([`ClusterCerts`]), and
//! asking a node who leads a shard. The black-box tests' harness
//! (`tests/harness`, blocking) and the chaos [`Cluster`](crate::cluster::Cluster)
//! (async, with proxied peer links) both start their nodes with it.

use std::ffi::OsString;
use std::fmt::Display;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use floret_client::{Client, ClientError, ClientTls};
use floret_proto::v1::ClusterStatusResponse;

/// How long a node may take to print its ready line.
pub const START_DEADLINE: Duration = Duration::from_secs(60);

/// What a node's ready line says before its address.
const READY_MARKER: &str = " serving on ";

/// The `RUST_LOG` of test nodes, as `floret serve`'s default: floret's own
/// info, the libraries' warnings but for openraft's core, which warns at
/// every election about the vote that arrives after the quorum.
pub const LOG_FILTER: &str = "info,openraft=warn,openraft::core::raft_core=error,sled=warn";

/// `FLORET_MIN_FREE_BYTES` of the nodes tests start: 1 MiB. Under the
/// default watermark (256 MiB) every produce of a test is refused on a
/// machine with less free space than that, though a test writes far less;
/// the watermark's own test sets its free space through a fault point.
pub const TEST_MIN_FREE_BYTES: &str = "1048576";

/// The address a node serves on, if `line` of its stdout is its ready line.
pub fn ready_address(line: &str) -> Option<&str> {
    line.split_once(READY_MARKER)
        .map(|(_, address)| address.trim())
}

/// The `--peers` value naming every member: `1=host:port,2=host:port`.
pub fn peers_flag<A: Display>(members: impl IntoIterator<Item = (u64, A)>) -> String {
    members
        .into_iter()
        .map(|(id, address)| format!("{id}={address}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A cluster's CA and member certificates, made by `floret certs`.
#[derive(Debug, Clone)]
pub struct ClusterCerts {
    dir: PathBuf,
}

impl ClusterCerts {
    /// Runs `floret certs` (the binary at `floret`) for nodes 1 to `nodes`,
    /// writing into `dir`.
    pub fn make(floret: &Path, dir: &Path, nodes: usize) -> Result<Self, String> {
        run_certs(floret, dir, &nodes.to_string())?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// Runs `floret certs` again for nodes up to `id`, which makes the
    /// certificates missing from the folder (node `id`'s, for a node that
    /// joins) with the CA already there.
    pub fn add_node(&self, floret: &Path, id: u64) -> Result<(), String> {
        run_certs(floret, &self.dir, &id.to_string())
    }

    /// A file `floret certs` wrote (`ca.pem`, `node-1.key`, `client.pem`...).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The `floret serve` flags that make node `id` serve TLS and mutual
    /// TLS, and seal its gossip.
    pub fn serve_flags(&self, id: u64) -> Vec<String> {
        let path = |name: String| self.file(&name).display().to_string();
        vec![
            "--tls-cert".into(),
            path(format!("node-{id}.pem")),
            "--tls-key".into(),
            path(format!("node-{id}.key")),
            "--tls-ca".into(),
            path("ca.pem".into()),
            "--gossip-secret-file".into(),
            path("gossip.key".into()),
        ]
    }

    /// How clients trust the cluster's nodes.
    pub fn client_tls(&self) -> ClientTls {
        ClientTls::from_ca_file(self.file("ca.pem")).expect("floret certs wrote ca.pem")
    }

    /// A client of the nodes at `address` over TLS.
    pub fn client(&self, address: &str) -> Result<Client, ClientError> {
        Client::connect_lazy_tls(address, &self.client_tls())
    }
}

/// Runs `floret certs --out dir --nodes nodes`.
fn run_certs(floret: &Path, dir: &Path, nodes: &str) -> Result<(), String> {
    let output = Command::new(floret)
        .arg("certs")
        .arg("--out")
        .arg(dir)
        .args(["--nodes", nodes])
        .output()
        .map_err(|error| format!("cannot run {} certs: {error}", floret.display()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "floret certs failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Tenants' tokens for a cluster: a signing key `floret token keygen` made
/// for it, and tokens `floret token create` signs with it.
#[derive(Debug, Clone)]
pub struct ClusterTokens {
    floret: PathBuf,
    dir: PathBuf,
}

impl ClusterTokens {
    /// Runs `floret token keygen` (the binary at `floret`) into `dir`.
    pub fn make(floret: &Path, dir: &Path) -> Result<Self, String> {
        let tokens = Self {
            floret: floret.to_path_buf(),
            dir: dir.to_path_buf(),
        };
        tokens.run(&["token".into(), "keygen".into(), "--out".into(), dir.into()])?;
        Ok(tokens)
    }

    /// The public key every node verifies tokens with (`--token-keys`).
    pub fn public_key(&self) -> PathBuf {
        self.dir.join("token.pub")
    }

    /// A token for `tenant` with `roles` (comma-separated) on `queues`
    /// (comma-separated patterns, may be empty), valid for a day.
    pub fn token(&self, tenant: &str, roles: &str, queues: &str) -> Result<String, String> {
        let mut args: Vec<OsString> = vec![
            "token".into(),
            "create".into(),
            "--key".into(),
            self.dir.join("token.key").into(),
            "--tenant".into(),
            tenant.into(),
            "--roles".into(),
            roles.into(),
            "--ttl".into(),
            "1d".into(),
        ];
        if !queues.is_empty() {
            args.extend(["--queues".into(), queues.into()]);
        }
        self.run(&args).map(|printed| printed.trim().to_owned())
    }

    fn run(&self, args: &[OsString]) -> Result<String, String> {
        let output = Command::new(&self.floret)
            .args(args)
            .output()
            .map_err(|error| format!("cannot run {}: {error}", self.floret.display()))?;
        if !output.status.success() {
            return Err(format!(
                "floret token failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

/// The arguments of `floret serve` for one node.
#[derive(Debug, Clone, Default)]
pub struct ServeArgs {
    /// Its data dir.
    pub data_dir: PathBuf,
    /// Its id (`--node-id`), in a cluster.
    pub node_id: Option<u64>,
    /// `--listen`; the node's default when unset.
    pub listen: Option<String>,
    /// `--peers` (see [`peers_flag`]), in a cluster.
    pub peers: Option<String>,
    /// A config file (`--config`).
    pub config: Option<PathBuf>,
    /// Anything else, as given.
    pub extra: Vec<String>,
}

impl ServeArgs {
    /// The command line after the binary: `serve --data-dir ...`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["serve".into()];
        if let Some(config) = &self.config {
            args.extend(["--config".into(), config.into()]);
        }
        args.extend(["--data-dir".into(), self.data_dir.clone().into()]);
        let flags = [
            ("--node-id", self.node_id.map(|id| id.to_string())),
            ("--listen", self.listen.clone()),
            ("--peers", self.peers.clone()),
        ];
        for (flag, value) in flags {
            if let Some(value) = value {
                args.extend([flag.into(), value.into()]);
            }
        }
        args.extend(self.extra.iter().map(OsString::from));
        args
    }
}

/// The leader of `shard` in a node's cluster status, once it has one.
pub fn shard_leader(status: &ClusterStatusResponse, shard: u32) -> Option<u64> {
    status
        .shards
        .iter()
        .find(|s| s.shard_id == shard && s.leader_id != 0)
        .map(|s| s.leader_id)
}

/// Asks `probe` every `interval` until it answers or `within` has passed.
pub async fn poll<T, F, Fut>(within: Duration, interval: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Some(answer) = probe().await {
            return Some(answer);
        }
        tokio::time::sleep(interval).await;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_names_the_address_and_other_lines_do_not() {
        let line = "floret node 2 serving on 127.0.0.1:41234";
        assert_eq!(ready_address(line), Some("127.0.0.1:41234"));
        assert_eq!(ready_address("floret node 2 starting"), None);
    }

    #[test]
    fn a_cluster_node_gets_every_flag_and_a_lone_node_only_its_own() {
        let peers = peers_flag([(1, "127.0.0.1:1"), (2, "127.0.0.1:2")]);
        assert_eq!(peers, "1=127.0.0.1:1,2=127.0.0.1:2");
        let node = ServeArgs {
            data_dir: "d".into(),
            node_id: Some(2),
            listen: Some("127.0.0.1:2".into()),
            peers: Some(peers),
            ..ServeArgs::default()
        };
        let args: Vec<String> = node
            .to_args()
            .into_iter()
            .map(|arg| arg.into_string().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "serve",
                "--data-dir",
                "d",
                "--node-id",
                "2",
                "--listen",
                "127.0.0.1:2",
                "--peers",
                "1=127.0.0.1:1,2=127.0.0.1:2"
            ]
        );
        let lone = ServeArgs {
            data_dir: "d".into(),
            extra: vec!["--shards".into(), "2".into()],
            ..ServeArgs::default()
        };
        assert_eq!(lone.to_args().len(), 5);
    }
}
