//! A node's configuration: defaults, then a TOML file, then `FLORET_*`
//! environment variables, then command-line flags (applied by the CLI), then
//! [`Config::validate`].
//!
//! IMPLEMENTATION CAVEATS
//! - The member list is static: every node must be started with the same one.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use floret_cluster::RaftTuning;
use serde::Deserialize;

/// Everything a node needs to start.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// This node's id in every raft group (> 0).
    pub node_id: u64,
    /// gRPC listen address; port 0 picks a free port (the chosen one is logged and printed).
    pub listen: SocketAddr,
    /// Where the node keeps its sled database and snapshots.
    pub data_dir: PathBuf,
    /// Number of shards (raft groups); fixed for the life of the data dir.
    /// A few per node: every shard pays raft's per-entry costs, so fewer
    /// shards carry more messages per entry (see [`DEFAULT_SHARDS`]).
    pub shards: u32,
    /// Every member of the cluster, this node included, with the address the
    /// others dial. Empty: a one-node cluster.
    pub peers: Vec<PeerConfig>,
    /// Replicas of each shard (every node when the cluster is smaller).
    pub replication_factor: usize,
    /// Prometheus metrics listen address; none when absent.
    pub metrics_listen: Option<SocketAddr>,
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
}

/// How the node gossips its load (clusters of more than one node only).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GossipSettings {
    /// UDP address to gossip on; by default the gRPC address's IP and port.
    pub listen: Option<SocketAddr>,
    /// Pause between gossip rounds, and between two publications of this
    /// node's load, in ms.
    pub interval_ms: u64,
    /// Phi-accrual threshold above which a silent node is declared dead.
    pub phi_threshold: f64,
}

impl Default for GossipSettings {
    fn default() -> Self {
        Self {
            listen: None,
            interval_ms: 200,
            phi_threshold: 8.0,
        }
    }
}

/// Fairness across nodes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FairnessConfig {
    /// Split each consumer's credits between nodes by the backlogged weight
    /// they report, so producers get equal weighted shares wherever they
    /// are placed; off, every node gets an equal share of each consumer.
    pub cross_node_split: bool,
}

impl Default for FairnessConfig {
    fn default() -> Self {
        Self {
            cross_node_split: true,
        }
    }
}

/// When a node slows its producers down: above the high watermark of bytes
/// stored on it, producers holding more than their fair share are refused
/// with a retry hint until the node is back below the low watermark.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackpressureConfig {
    /// Stored message bytes (every shard replica on the node) at which throttling starts.
    pub high_watermark_bytes: u64,
    /// Stored message bytes below which it stops.
    pub low_watermark_bytes: u64,
    /// Wait suggested to a throttled producer.
    pub retry_after_ms: u64,
}

impl Default for BackpressureConfig {
    fn default() -> Self {
        Self {
            high_watermark_bytes: 8 * 1024 * 1024 * 1024,
            low_watermark_bytes: 6 * 1024 * 1024 * 1024,
            retry_after_ms: 200,
        }
    }
}

/// What is kept of producers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProducersConfig {
    /// A producer with nothing stored and no policy override for this long
    /// has its counters deleted (its sequences start again at 0, and
    /// idempotent retries are recognised only within this time).
    pub forget_idle_after_ms: u64,
}

impl Default for ProducersConfig {
    fn default() -> Self {
        Self {
            forget_idle_after_ms: 24 * 3600 * 1000,
        }
    }
}

/// One member of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// The member's node id.
    pub id: u64,
    /// `host:port` of its gRPC server as the other nodes reach it.
    pub address: String,
}

/// Parses a member list written `1=host:port,2=host:port,...`.
pub fn parse_peers(text: &str) -> Result<Vec<PeerConfig>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (id, address) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not id=host:port"))?;
            let id = id
                .trim()
                .parse()
                .map_err(|e| format!("{part:?}: node id {id:?}: {e}"))?;
            Ok(PeerConfig {
                id,
                address: address.trim().to_owned(),
            })
        })
        .collect()
}

/// How the node's database uses memory.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// sled's page cache, in bytes: the backlog beyond it stays on disk.
    pub cache_bytes: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            cache_bytes: floret_store::DEFAULT_CACHE_BYTES,
        }
    }
}

/// What one request may carry.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest payload of one message, in bytes (1 MiB).
    pub max_payload_bytes: usize,
    /// Most messages in one produce request.
    pub max_batch_messages: usize,
    /// Largest total of one message's header keys and values, in bytes.
    pub max_header_bytes: usize,
    /// Largest encoded gRPC request, in bytes; above it tonic answers RESOURCE_EXHAUSTED.
    pub max_request_bytes: usize,
    /// Most credits a consumer may hold at once, so one consumer cannot pin the whole backlog.
    pub max_credits: u32,
}

/// How deliveries are leased.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliveryConfig {
    /// How long a delivery stays leased without an ack before it is redelivered, in ms.
    pub lease_timeout_ms: u64,
}

/// How the leader folds concurrent operations into one raft entry.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BatchingConfig {
    /// Most operations (produce batches, ack batches) in one entry.
    pub max_entry_ops: usize,
    /// Payload bytes after which an entry is closed (one larger op still goes alone).
    pub max_entry_bytes: usize,
    /// Entries a shard may have proposed and not yet committed; while they are
    /// in flight the next entry fills up.
    pub proposals_in_flight: usize,
    /// How long a produce or ack waits for its entry to commit before it is
    /// answered UNAVAILABLE (outcome unknown: no majority reachable), in ms.
    pub commit_timeout_ms: u64,
}

/// Raft timing, in milliseconds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftConfig {
    /// Leader heartbeat.
    pub heartbeat_ms: u64,
    /// Election timeout lower bound.
    pub election_timeout_min_ms: u64,
    /// Election timeout upper bound.
    pub election_timeout_max_ms: u64,
    /// Entries between two snapshots of a shard.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot.
    pub logs_kept_after_snapshot: u64,
    /// Bytes of a snapshot sent to a lagging replica in one message.
    pub snapshot_chunk_bytes: u64,
}

/// Shards of a cluster whose configuration names none: two per node of a
/// three-node cluster, so that each node leads two and a failed node's two
/// go one to each survivor. Against 16, on three nodes on one 2-core
/// machine (BENCHMARKS.md): single-message produce 1.2-1.45x, batched
/// 1.05x, a quiet producer's latency under a flood unchanged.
pub const DEFAULT_SHARDS: u32 = 6;

impl Default for Config {
    fn default() -> Self {
        Self {
            node_id: 1,
            listen: SocketAddr::from(([127, 0, 0, 1], 7701)),
            data_dir: PathBuf::from("floret-data"),
            shards: DEFAULT_SHARDS,
            peers: Vec::new(),
            replication_factor: 3,
            metrics_listen: None,
            storage: StorageConfig::default(),
            limits: Limits::default(),
            delivery: DeliveryConfig::default(),
            batching: BatchingConfig::default(),
            raft: RaftConfig::default(),
            gossip: GossipSettings::default(),
            fairness: FairnessConfig::default(),
            backpressure: BackpressureConfig::default(),
            producers: ProducersConfig::default(),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 1024 * 1024,
            max_batch_messages: 10_000,
            max_header_bytes: 64 * 1024,
            max_request_bytes: 16 * 1024 * 1024,
            max_credits: 100_000,
        }
    }
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            lease_timeout_ms: 30_000,
        }
    }
}

impl Default for BatchingConfig {
    fn default() -> Self {
        Self {
            max_entry_ops: 1_024,
            // Entries of a flood stay small enough to commit quickly, so a
            // quiet producer on the same shard waits behind two short
            // entries, not two long ones (noisy-neighbor bench: quiet p99
            // 101 -> 77 ms against 1 MiB, flood accepted faster too), and
            // their state-machine writes mostly stay under the size at which
            // floret-store falls back to sled's costlier atomic batch.
            max_entry_bytes: 64 * 1024,
            proposals_in_flight: 2,
            commit_timeout_ms: 5_000,
        }
    }
}

impl Default for RaftConfig {
    fn default() -> Self {
        let tuning = RaftTuning::default();
        Self {
            heartbeat_ms: tuning.heartbeat.as_millis() as u64,
            election_timeout_min_ms: tuning.election_timeout_min.as_millis() as u64,
            election_timeout_max_ms: tuning.election_timeout_max.as_millis() as u64,
            snapshot_every_entries: tuning.snapshot_every_entries,
            logs_kept_after_snapshot: tuning.logs_kept_after_snapshot,
            snapshot_chunk_bytes: tuning.snapshot_chunk_bytes,
        }
    }
}

/// A configuration that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The TOML file is not valid.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        message: String,
    },
    /// An environment variable does not parse.
    #[error("environment variable {name}={value} is not valid: {message}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why it does not parse.
        message: String,
    },
    /// A value is out of range.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Defaults, overlaid by `file` (if given), then by `FLORET_*` variables from `env`.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut config = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
                toml::from_str(&text).map_err(|e| ConfigError::Parse {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?
            }
            None => Config::default(),
        };
        config.apply_env(env)?;
        Ok(config)
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
        if let Some(node_id) = parse(&env, "FLORET_NODE_ID")? {
            self.node_id = node_id;
        }
        if let Some(listen) = parse(&env, "FLORET_LISTEN")? {
            self.listen = listen;
        }
        if let Some(data_dir) = parse::<PathBuf>(&env, "FLORET_DATA_DIR")? {
            self.data_dir = data_dir;
        }
        if let Some(shards) = parse(&env, "FLORET_SHARDS")? {
            self.shards = shards;
        }
        if let Some(peers) = env("FLORET_PEERS") {
            self.peers = parse_peers(&peers).map_err(|message| ConfigError::Env {
                name: "FLORET_PEERS",
                value: peers.clone(),
                message,
            })?;
        }
        if let Some(replication_factor) = parse(&env, "FLORET_REPLICATION_FACTOR")? {
            self.replication_factor = replication_factor;
        }
        if let Some(gossip_listen) = parse(&env, "FLORET_GOSSIP_LISTEN")? {
            self.gossip.listen = Some(gossip_listen);
        }
        if let Some(metrics_listen) = parse(&env, "FLORET_METRICS_LISTEN")? {
            self.metrics_listen = Some(metrics_listen);
        }
        if let Some(lease_timeout_ms) = parse(&env, "FLORET_LEASE_TIMEOUT_MS")? {
            self.delivery.lease_timeout_ms = lease_timeout_ms;
        }
        Ok(())
    }

    /// Checks every value, naming the first that is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| Err(ConfigError::Invalid(message));
        if self.node_id == 0 {
            return invalid("node_id must be > 0".into());
        }
        if self.shards == 0 || self.shards > 1024 {
            return invalid(format!("shards must be in 1..=1024, not {}", self.shards));
        }
        if !self.peers.is_empty() {
            let ids: std::collections::BTreeSet<u64> = self.peers.iter().map(|p| p.id).collect();
            if ids.len() != self.peers.len() || ids.contains(&0) {
                return invalid("peers must have distinct node ids > 0".into());
            }
            if !ids.contains(&self.node_id) {
                return invalid(format!(
                    "peers must list this node (node_id {}) with the address the others dial",
                    self.node_id
                ));
            }
            if let Some(peer) = self.peers.iter().find(|p| p.address.is_empty()) {
                return invalid(format!("peer {} has no address", peer.id));
            }
        }
        if self.gossip.interval_ms == 0 || self.gossip.phi_threshold <= 0.0 {
            return invalid("gossip.interval_ms and gossip.phi_threshold must be > 0".into());
        }
        if self.replication_factor == 0 {
            return invalid("replication_factor must be > 0".into());
        }
        if self.storage.cache_bytes < 1024 * 1024 {
            return invalid("storage.cache_bytes must be at least 1 MiB".into());
        }
        if self.limits.max_payload_bytes == 0
            || self.limits.max_payload_bytes >= self.limits.max_request_bytes
        {
            return invalid(
                "limits.max_payload_bytes must be > 0 and below limits.max_request_bytes".into(),
            );
        }
        let largest_entry = self
            .limits
            .max_request_bytes
            .saturating_add(self.batching.max_entry_bytes);
        if largest_entry > floret_store::wal::MAX_FRAME_BYTES / 2 {
            return invalid(format!(
                "limits.max_request_bytes plus batching.max_entry_bytes must stay under {} bytes (a raft entry must fit a log frame with room to spare)",
                floret_store::wal::MAX_FRAME_BYTES / 2
            ));
        }
        if self.limits.max_batch_messages == 0 || self.limits.max_credits == 0 {
            return invalid("limits.max_batch_messages and limits.max_credits must be > 0".into());
        }
        if self.delivery.lease_timeout_ms == 0 || self.delivery.lease_timeout_ms > 24 * 3600 * 1000
        {
            return invalid("delivery.lease_timeout_ms must be in 1..=86400000".into());
        }
        if self.batching.max_entry_ops == 0
            || self.batching.proposals_in_flight == 0
            || self.batching.commit_timeout_ms == 0
        {
            return invalid(
                "batching.max_entry_ops, batching.proposals_in_flight and batching.commit_timeout_ms must be > 0".into(),
            );
        }
        let raft = &self.raft;
        if raft.heartbeat_ms == 0 || raft.election_timeout_min_ms <= raft.heartbeat_ms {
            return invalid(format!(
                "raft.election_timeout_min_ms ({}) must be above raft.heartbeat_ms ({})",
                raft.election_timeout_min_ms, raft.heartbeat_ms
            ));
        }
        if raft.election_timeout_max_ms <= raft.election_timeout_min_ms {
            return invalid(
                "raft.election_timeout_max_ms must be above raft.election_timeout_min_ms".into(),
            );
        }
        let backpressure = &self.backpressure;
        if backpressure.low_watermark_bytes >= backpressure.high_watermark_bytes
            || backpressure.retry_after_ms == 0
        {
            return invalid(format!(
                "backpressure.low_watermark_bytes ({}) must be below backpressure.high_watermark_bytes ({}), and retry_after_ms > 0",
                backpressure.low_watermark_bytes, backpressure.high_watermark_bytes
            ));
        }
        if self.producers.forget_idle_after_ms < 100 {
            return invalid("producers.forget_idle_after_ms must be at least 100".into());
        }
        if raft.snapshot_every_entries == 0 {
            return invalid("raft.snapshot_every_entries must be > 0".into());
        }
        if raft.snapshot_chunk_bytes < 4096
            || raft.snapshot_chunk_bytes >= floret_cluster::MAX_PEER_MESSAGE_BYTES as u64 / 2
        {
            return invalid(format!(
                "raft.snapshot_chunk_bytes must be in 4096..{}",
                floret_cluster::MAX_PEER_MESSAGE_BYTES / 2
            ));
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

    /// Every member's id and dialled address: the peers, or for a one-node
    /// cluster this node at the address it is bound to.
    pub fn members(&self, bound: SocketAddr) -> BTreeMap<u64, String> {
        if self.peers.is_empty() {
            BTreeMap::from([(self.node_id, bound.to_string())])
        } else {
            self.peers
                .iter()
                .map(|peer| (peer.id, peer.address.clone()))
                .collect()
        }
    }

    /// How long a delivery is leased.
    pub fn lease_timeout(&self) -> Duration {
        Duration::from_millis(self.delivery.lease_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn defaults_are_valid() {
        Config::load(None, no_env).unwrap().validate().unwrap();
    }

    #[test]
    fn file_then_environment_override_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("floret.toml");
        std::fs::write(
            &path,
            "node_id = 3\nshards = 4\n[delivery]\nlease_timeout_ms = 500\n",
        )
        .unwrap();
        let config = Config::load(Some(&path), |name| {
            (name == "FLORET_SHARDS").then(|| "8".to_owned())
        })
        .unwrap();
        assert_eq!(
            (
                config.node_id,
                config.shards,
                config.delivery.lease_timeout_ms
            ),
            (3, 8, 500)
        );
    }

    #[test]
    fn unknown_key_in_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("floret.toml");
        std::fs::write(&path, "shard = 4\n").unwrap();
        let error = Config::load(Some(&path), no_env).unwrap_err();
        assert!(error.to_string().contains("unknown field"), "{error}");
    }

    #[test]
    fn unparsable_environment_value_names_the_variable() {
        let error = Config::load(None, |name| {
            (name == "FLORET_NODE_ID").then(|| "two".to_owned())
        })
        .unwrap_err();
        assert!(error.to_string().contains("FLORET_NODE_ID=two"), "{error}");
    }

    #[test]
    fn election_timeout_below_heartbeat_is_refused() {
        let mut config = Config::default();
        config.raft.election_timeout_min_ms = config.raft.heartbeat_ms;
        let error = config.validate().unwrap_err();
        assert!(
            error.to_string().contains("election_timeout_min_ms"),
            "{error}"
        );
    }

    #[test]
    fn example_config_in_deploy_spells_out_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/floret.toml");
        assert_eq!(
            Config::load(Some(&path), no_env).unwrap(),
            Config::default()
        );
    }

    #[test]
    fn peers_parse_from_the_flag_form_and_must_include_this_node() {
        let peers = parse_peers("1=127.0.0.1:7701, 2=127.0.0.1:7702,3=n3:7703").unwrap();
        assert_eq!(peers.len(), 3);
        assert_eq!(peers[2].address, "n3:7703");
        let config = Config {
            node_id: 4,
            peers,
            ..Config::default()
        };
        let error = config.validate().unwrap_err();
        assert!(error.to_string().contains("node_id 4"), "{error}");
        assert!(parse_peers("1:127.0.0.1:7701").is_err());
    }

    #[test]
    fn entries_too_large_for_a_log_frame_are_refused() {
        let mut config = Config::default();
        config.limits.max_request_bytes = 40 * 1024 * 1024;
        let error = config.validate().unwrap_err();
        assert!(error.to_string().contains("max_request_bytes"), "{error}");
    }

    #[test]
    fn zero_shards_is_refused() {
        let config = Config {
            shards: 0,
            ..Config::default()
        };
        assert!(config.validate().is_err());
    }
}
