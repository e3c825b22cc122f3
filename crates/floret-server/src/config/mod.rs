//! A node's configuration: defaults, then a TOML file, then `FLORET_*`
//! environment variables, then command-line flags (applied by the CLI), then
//! [`Config::validate`] (`validate.rs`). The sections and their defaults are
//! in `sections.rs`.
//!
//! IMPLEMENTATION CAVEATS
//! - The member list is static: every node must be started with the same one.

mod error;
mod origins;
mod sections;
mod set_flag;
mod shards;
mod units;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use floret_cluster::RaftTuning;
use serde::{Deserialize, Serialize};

pub use error::ConfigError;
pub use origins::SettingOrigin;
pub use sections::*;
pub use shards::{DEFAULT_SHARDS, DEFAULT_SHARDS_PER_NODE, default_shards};

/// Everything a node needs to start.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The cluster's name: its gossip ignores nodes of another name.
    pub cluster_name: String,
    /// This node's id in every raft group (> 0).
    pub node_id: u64,
    /// The client port: the public gRPC API (Floret, Admin, health,
    /// reflection). Port 0 picks a free port (the chosen one is logged and
    /// printed).
    pub listen: SocketAddr,
    /// The peer port: node-to-node calls only (raft, forwarded produces and
    /// settles, each node's own dispatcher and figures). By default the
    /// port of this node's own entry in `peers`, on `listen`'s interface;
    /// a one-node cluster has none.
    pub peer_listen: Option<SocketAddr>,
    /// The address clients are told to dial for this node (in produce
    /// answers that name a shard's leader, and in cluster status). By
    /// default the client port's bound address, with the host of this
    /// node's `peers` entry when it listens on an unspecified address.
    pub advertise: Option<String>,
    /// Where the node keeps its sled database and snapshots.
    pub data_dir: PathBuf,
    /// Number of shards (raft groups); fixed for the life of the data dir.
    /// A few per node: every shard pays raft's per-entry costs, so fewer
    /// shards carry more messages per entry. None: the count the data dir
    /// was created with, or for a new one [`default_shards`] of the
    /// founding members.
    pub shards: Option<u32>,
    /// Every member of the cluster, this node included, with its peer
    /// address (the one the other nodes dial). Empty: a one-node cluster.
    pub peers: Vec<PeerConfig>,
    /// Members of a running cluster to ask, when this node joins it
    /// (`floret cluster add-node` made it a member): the shard count, the
    /// replication factor and the members come from them, not from
    /// `shards`, `replication_factor` and `peers`. Ignored once this node's
    /// data dir holds the cluster's member list.
    pub join: Vec<PeerConfig>,
    /// Replicas of each shard (every node when the cluster is smaller).
    pub replication_factor: usize,
    /// The operations HTTP port: Prometheus metrics at `/metrics` and the
    /// web console at `/`; none when absent.
    pub metrics_listen: Option<SocketAddr>,
    /// Producers per queue with their own metric series (the largest
    /// backlogs); the rest are summed in one `producer="other"` series.
    pub metrics_top_producers: usize,
    /// TLS on the client port and mutual TLS on the peer port.
    pub tls: TlsSettings,
    /// Bearer tokens on the client port.
    pub auth: AuthSettings,
    /// Serve plaintext on an address other than loopback: anyone who
    /// reaches it could read messages and, on the peer port, rewrite raft
    /// state. Refused without this, so only a deliberate choice does it.
    pub insecure: bool,
    /// Storage tunables.
    pub storage: StorageConfig,
    /// Request limits.
    pub limits: Limits,
    /// Delivery tunables.
    pub delivery: DeliveryConfig,
    /// Folding of produces and acks into raft entries.
    pub batching: BatchingConfig,
    /// Raft timing.
    pub raft: RaftConfig,
    /// The gossip view.
    pub gossip: GossipSettings,
    /// Fairness across nodes.
    pub fairness: FairnessConfig,
    /// Node-level backpressure.
    pub backpressure: BackpressureConfig,
    /// Producers' durable state.
    pub producers: ProducersConfig,
    /// Stopping.
    pub shutdown: ShutdownConfig,
    /// Following changes of members.
    pub membership: MembershipConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster_name: "floret".into(),
            node_id: 1,
            listen: SocketAddr::from(([127, 0, 0, 1], 7701)),
            peer_listen: None,
            advertise: None,
            data_dir: PathBuf::from("floret-data"),
            shards: None,
            peers: Vec::new(),
            join: Vec::new(),
            replication_factor: 3,
            metrics_listen: None,
            metrics_top_producers: 10,
            tls: TlsSettings::default(),
            auth: AuthSettings::default(),
            insecure: false,
            storage: StorageConfig::default(),
            limits: Limits::default(),
            delivery: DeliveryConfig::default(),
            batching: BatchingConfig::default(),
            raft: RaftConfig::default(),
            gossip: GossipSettings::default(),
            fairness: FairnessConfig::default(),
            backpressure: BackpressureConfig::default(),
            producers: ProducersConfig::default(),
            shutdown: ShutdownConfig::default(),
            membership: MembershipConfig::default(),
        }
    }
}

/// What starts a variable that sets a setting by its path.
const NESTED_PREFIX: &str = "FLORET_";
/// What separates the sections and the key in such a variable.
const NESTED_SEPARATOR: &str = "__";

/// The TOML file at `path`, as a table.
fn read_table(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str::<toml::Table>(&text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// A variable's value as TOML: a number, boolean, array or table when it
/// reads as one, else the text itself.
fn toml_value(text: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("value = {text}"))
        .ok()
        .and_then(|mut table| table.remove("value"))
        .unwrap_or_else(|| toml::Value::String(text.to_owned()))
}

/// Sets `keys` (a path of tables, then a key) in `table` to `value`.
fn set_nested(table: &mut toml::Table, keys: &[String], value: toml::Value) -> Result<(), String> {
    let Some((key, sections)) = keys.split_last() else {
        return Err("names no setting".into());
    };
    let mut at = table;
    for section in sections {
        let entry = at
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        at = entry
            .as_table_mut()
            .ok_or_else(|| format!("{section} is a setting, not a section"))?;
    }
    at.insert(key.clone(), value);
    Ok(())
}

impl Config {
    /// Defaults, overlaid by `file` (if given), then by `FLORET_*` variables from `env`.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        Self::load_overlaid(file, env, std::iter::empty())
    }

    /// Like [`Config::load`], with every setting also settable by a
    /// variable in `variables` named after its path: `FLORET_` then the
    /// sections and the key, upper-cased and joined by `__`
    /// (`FLORET_RAFT__ELECTION_TIMEOUT_MIN_MS=300` sets
    /// `raft.election_timeout_min_ms`). These overlay the file; the flat
    /// variables `env` answers (`FLORET_NODE_ID`...) come last.
    pub fn load_overlaid(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        variables: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut table = match file {
            Some(path) => read_table(path)?,
            None => toml::Table::new(),
        };
        let mut overlaid = Vec::new();
        for (name, value) in variables {
            let Some(path) = name
                .strip_prefix(NESTED_PREFIX)
                .filter(|path| path.contains(NESTED_SEPARATOR))
            else {
                continue;
            };
            let keys: Vec<String> = path
                .split(NESTED_SEPARATOR)
                .map(str::to_ascii_lowercase)
                .collect();
            set_nested(&mut table, &keys, toml_value(&value)).map_err(|message| {
                ConfigError::Nested {
                    name: name.clone(),
                    message,
                }
            })?;
            overlaid.push(name);
        }
        let mut config: Config = toml::Value::Table(table).try_into().map_err(|e| {
            match (file, overlaid.is_empty()) {
                (Some(path), true) => ConfigError::Parse {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                },
                _ => ConfigError::Nested {
                    name: overlaid.join(", "),
                    message: format!(
                        "{} ({} with these variables over it)",
                        e.to_string().trim_end().replace('\n', " "),
                        file.map_or("the defaults".to_owned(), |path| path.display().to_string())
                    ),
                },
            }
        })?;
        config.apply_env(env)?;
        Ok(config)
    }

    /// Every `FLORET_*` environment variable a node reads, in the order it
    /// reads them (asked of an empty environment, so always all of them).
    pub fn environment_variables() -> Vec<String> {
        let asked = std::cell::RefCell::new(Vec::new());
        let _defaults = Config::default().apply_env(|name| {
            asked.borrow_mut().push(name.to_owned());
            None
        });
        asked.into_inner()
    }

    fn apply_env(&mut self, env: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        fn parse<T: std::str::FromStr>(
            env: &impl Fn(&str) -> Option<String>,
            name: &'static str,
        ) -> Result<Option<T>, ConfigError>
        where
            T::Err: std::fmt::Display,
        {
            env(name)
                .map(|value| {
                    value.parse().map_err(|e: T::Err| ConfigError::Env {
                        name,
                        value: value.clone(),
                        message: e.to_string(),
                    })
                })
                .transpose()
        }
        if let Some(cluster_name) = env("FLORET_CLUSTER_NAME") {
            self.cluster_name = cluster_name;
        }
        if let Some(node_id) = parse(&env, "FLORET_NODE_ID")? {
            self.node_id = node_id;
        }
        if let Some(listen) = parse(&env, "FLORET_LISTEN")? {
            self.listen = listen;
        }
        if let Some(peer_listen) = parse(&env, "FLORET_PEER_LISTEN")? {
            self.peer_listen = Some(peer_listen);
        }
        if let Some(advertise) = env("FLORET_ADVERTISE") {
            self.advertise = Some(advertise);
        }
        if let Some(data_dir) = parse::<PathBuf>(&env, "FLORET_DATA_DIR")? {
            self.data_dir = data_dir;
        }
        if let Some(shards) = parse(&env, "FLORET_SHARDS")? {
            self.shards = Some(shards);
        }
        if let Some(peers) = env("FLORET_PEERS") {
            self.peers = parse_peers(&peers).map_err(|message| ConfigError::Env {
                name: "FLORET_PEERS",
                value: peers.clone(),
                message,
            })?;
        }
        if let Some(join) = env("FLORET_JOIN") {
            self.join = parse_peers(&join).map_err(|message| ConfigError::Env {
                name: "FLORET_JOIN",
                value: join.clone(),
                message,
            })?;
        }
        if let Some(replication_factor) = parse(&env, "FLORET_REPLICATION_FACTOR")? {
            self.replication_factor = replication_factor;
        }
        if let Some(gossip_listen) = parse(&env, "FLORET_GOSSIP_LISTEN")? {
            self.gossip.listen = Some(gossip_listen);
        }
        if let Some(secret_file) = parse::<PathBuf>(&env, "FLORET_GOSSIP_SECRET_FILE")? {
            self.gossip.secret_file = Some(secret_file);
        }
        if let Some(secret) = env("FLORET_GOSSIP_SECRET") {
            self.gossip.secret = Some(SecretText(secret));
        }
        if let Some(metrics_listen) = parse(&env, "FLORET_METRICS_LISTEN")? {
            self.metrics_listen = Some(metrics_listen);
        }
        if let Some(top_producers) = parse(&env, "FLORET_METRICS_TOP_PRODUCERS")? {
            self.metrics_top_producers = top_producers;
        }
        if let Some(cert) = parse::<PathBuf>(&env, "FLORET_TLS_CERT")? {
            self.tls.cert = Some(cert);
        }
        if let Some(key) = parse::<PathBuf>(&env, "FLORET_TLS_KEY")? {
            self.tls.key = Some(key);
        }
        if let Some(ca) = parse::<PathBuf>(&env, "FLORET_TLS_CA")? {
            self.tls.ca = Some(ca);
        }
        if let Some(keys) = env("FLORET_TOKEN_KEYS") {
            let token_keys: Vec<PathBuf> = keys
                .split(',')
                .map(str::trim)
                .filter(|path| !path.is_empty())
                .map(PathBuf::from)
                .collect();
            if token_keys.is_empty() {
                return Err(ConfigError::Env {
                    name: "FLORET_TOKEN_KEYS",
                    value: keys,
                    message: "names no key file: unset it to keep the configured keys".into(),
                });
            }
            self.auth.token_keys = token_keys;
        }
        if let Some(insecure) = parse(&env, "FLORET_INSECURE")? {
            self.insecure = insecure;
        }
        let with_units = |name: &'static str, parse: fn(&str) -> Result<u64, String>| {
            env(name)
                .map(|value| {
                    parse(&value).map_err(|message| ConfigError::Env {
                        name,
                        value,
                        message,
                    })
                })
                .transpose()
        };
        if let Some(min_free_bytes) = with_units("FLORET_MIN_FREE_BYTES", units::parse_bytes)? {
            self.storage.min_free_bytes = min_free_bytes;
        }
        if let Some(lease_timeout_ms) = with_units("FLORET_LEASE_TIMEOUT_MS", units::parse_millis)?
        {
            self.delivery.lease_timeout_ms = lease_timeout_ms;
        }
        Ok(())
    }

    /// The raft tuning of every shard.
    pub fn raft_tuning(&self) -> RaftTuning {
        RaftTuning {
            heartbeat: Duration::from_millis(self.raft.heartbeat_ms),
            election_timeout_min: Duration::from_millis(self.raft.election_timeout_min_ms),
            election_timeout_max: Duration::from_millis(self.raft.election_timeout_max_ms),
            snapshot_every_entries: self.raft.snapshot_every_entries,
            logs_kept_after_snapshot: self.raft.logs_kept_after_snapshot,
            snapshot_chunk_bytes: self.raft.snapshot_chunk_bytes,
        }
    }

    /// Every member's id and peer address: the peers, or for a one-node
    /// cluster this node at its client address (which no one dials).
    pub fn members(&self, client_address: SocketAddr) -> BTreeMap<u64, String> {
        if self.peers.is_empty() {
            BTreeMap::from([(self.node_id, client_address.to_string())])
        } else {
            self.peers
                .iter()
                .map(|peer| (peer.id, peer.address.clone()))
                .collect()
        }
    }

    /// This node's own entry in `peers`: the peer address the others dial.
    pub fn own_peer_address(&self) -> Option<&str> {
        self.peers
            .iter()
            .find(|peer| peer.id == self.node_id)
            .map(|peer| peer.address.as_str())
    }

    /// The address clients are told to dial, given the client port's bound address.
    pub fn advertised_address(&self, client_bound: SocketAddr) -> String {
        if let Some(advertise) = &self.advertise {
            return advertise.clone();
        }
        if !client_bound.ip().is_unspecified() {
            return client_bound.to_string();
        }
        match self
            .own_peer_address()
            .and_then(|peer| peer.rsplit_once(':'))
        {
            Some((host, _)) => format!("{host}:{}", client_bound.port()),
            None => client_bound.to_string(),
        }
    }

    /// How long a delivery is leased.
    pub fn lease_timeout(&self) -> Duration {
        Duration::from_millis(self.delivery.lease_timeout_ms)
    }
}

#[cfg(test)]
mod tests;
