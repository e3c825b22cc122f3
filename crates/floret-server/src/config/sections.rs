//! The sections of a node's configuration, each with its defaults and a
//! comment on every choice. Checked by `validate.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use floret_cluster::RaftTuning;
use serde::{Deserialize, Serialize};

/// TLS on both ports. With a certificate the client port serves TLS, and
/// the peer port mutual TLS: every member presents a certificate of the
/// cluster's CA naming it (`node-<id>.floret`; `floret certs` makes them).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// This node's certificate chain (PEM), presented on both ports and to
    /// the peers it dials.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
    /// The cluster's CA (PEM): the peer port takes only members' certificates
    /// signed by it, and this node trusts its peers by it.
    pub ca: Option<PathBuf>,
}

impl TlsSettings {
    /// Whether TLS is configured.
    pub fn enabled(&self) -> bool {
        self.cert.is_some()
    }
}

/// Who may call the client port. With token keys, every Floret and Admin
/// call must carry a bearer token signed by one of them (`floret token
/// create`); without, every call is the one anonymous tenant, which may do
/// everything (loopback only, unless `insecure`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// Public keys (Ed25519 `PUBLIC KEY` PEM files; `floret certs` writes
    /// token.pub) that tokens may be signed with. Two at once let a new key
    /// be rolled out before the old one is retired.
    pub token_keys: Vec<PathBuf>,
    /// The CA that signs clients' certificates (PEM). With it the client
    /// port (which then needs `tls.cert`) asks clients for a certificate; a
    /// client may still send a token instead.
    pub client_ca: Option<PathBuf>,
    /// The client certificates that stand for tenants, each by a DNS name
    /// it carries.
    pub client_certificates: Vec<CertificateTenant>,
}

impl AuthSettings {
    /// Whether every call must name its tenant (by a token or a client
    /// certificate).
    pub fn enabled(&self) -> bool {
        !self.token_keys.is_empty() || !self.client_certificates.is_empty()
    }
}

/// A client certificate that stands for a tenant: one signed by
/// `auth.client_ca` and carrying the DNS name `name` (a subject
/// alternative name; `floret certs --tenant acme` makes one carrying
/// `acme.tenant.floret`) calls as `tenant`, with `roles` on `queues`, as a
/// token with those claims would.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateTenant {
    /// The DNS name the certificate carries.
    pub name: String,
    /// The tenant it stands for.
    pub tenant: String,
    /// What it may do.
    pub roles: Vec<crate::auth::Role>,
    /// The queues it may use (patterns, `*` any run of characters).
    pub queues: Vec<String>,
}

/// How the node gossips its load (clusters of more than one node only).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct GossipSettings {
    /// UDP address to gossip on; by default the gRPC address's IP and port.
    pub listen: Option<SocketAddr>,
    /// Pause between gossip rounds, and between two publications of this
    /// node's load, in ms.
    #[serde(deserialize_with = "super::units::millis")]
    pub interval_ms: u64,
    /// Phi-accrual threshold above which a silent node is declared dead.
    pub phi_threshold: f64,
    /// A file holding the cluster's gossip secret (at least 16 bytes; `floret
    /// certs` writes one as gossip.key): every datagram is sealed with it,
    /// and datagrams that fail it are dropped.
    pub secret_file: Option<PathBuf>,
    /// The gossip secret itself, instead of a file (`FLORET_GOSSIP_SECRET`).
    pub secret: Option<SecretText>,
}

impl Default for GossipSettings {
    fn default() -> Self {
        Self {
            listen: None,
            interval_ms: 200,
            phi_threshold: 8.0,
            secret_file: None,
            secret: None,
        }
    }
}

impl GossipSettings {
    /// Whether a gossip secret is configured.
    pub fn sealed(&self) -> bool {
        self.secret_file.is_some() || self.secret.is_some()
    }
}

/// A secret given in the configuration; never printed.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct SecretText(pub String);

impl Serialize for SecretText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("<redacted>")
    }
}

impl std::fmt::Debug for SecretText {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("<redacted>")
    }
}

/// Fairness across nodes.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackpressureConfig {
    /// Stored message bytes (every shard replica on the node) at which throttling starts.
    #[serde(deserialize_with = "super::units::bytes")]
    pub high_watermark_bytes: u64,
    /// Stored message bytes below which it stops.
    #[serde(deserialize_with = "super::units::bytes")]
    pub low_watermark_bytes: u64,
    /// Wait suggested to a throttled producer.
    #[serde(deserialize_with = "super::units::millis")]
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
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProducersConfig {
    /// A producer with nothing stored and no policy override for this long
    /// has its counters deleted (its sequences start again at 0, and
    /// idempotent retries are recognised only within this time).
    #[serde(deserialize_with = "super::units::millis")]
    pub forget_idle_after_ms: u64,
}

impl Default for ProducersConfig {
    fn default() -> Self {
        Self {
            forget_idle_after_ms: 24 * 3600 * 1000,
        }
    }
}

/// How the shards follow a change of members.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct MembershipConfig {
    /// Shards a leader moves at once after a change of members (each
    /// copies its state to a new replica).
    pub moves_at_once: usize,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        Self { moves_at_once: 2 }
    }
}

/// How a node stops (SIGTERM, or the end of `serve_until`'s future).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// The most a stop takes: handing the shards it leads to other
    /// replicas, then letting open calls finish; what is still open after
    /// it is closed. Keep it under the supervisor's grace period
    /// (Kubernetes' terminationGracePeriodSeconds, systemd's TimeoutStopSec).
    #[serde(deserialize_with = "super::units::millis")]
    pub drain_timeout_ms: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            drain_timeout_ms: 20_000,
        }
    }
}

/// One member of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// sled's page cache, in bytes: the backlog beyond it stays on disk.
    #[serde(deserialize_with = "super::units::bytes")]
    pub cache_bytes: u64,
    /// The raft log starts a new segment file past this size; a segment is
    /// deleted once its entries are purged and no stored message points into it.
    #[serde(deserialize_with = "super::units::bytes")]
    pub log_segment_bytes: u64,
    /// Below this much free space on the data dir's filesystem produces are
    /// refused (RESOURCE_EXHAUSTED, reason disk) until space returns; acks
    /// and consumes go on in the room left.
    #[serde(deserialize_with = "super::units::bytes")]
    pub min_free_bytes: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        let defaults = floret_store::StoreOptions::default();
        Self {
            cache_bytes: defaults.cache_bytes,
            log_segment_bytes: defaults.log_segment_bytes,
            min_free_bytes: 256 * 1024 * 1024,
        }
    }
}

/// What one request may carry.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest payload of one message, in bytes (1 MiB).
    #[serde(deserialize_with = "super::units::bytes")]
    pub max_payload_bytes: usize,
    /// Most messages in one produce request.
    pub max_batch_messages: usize,
    /// Largest total of one message's header keys and values, in bytes.
    #[serde(deserialize_with = "super::units::bytes")]
    pub max_header_bytes: usize,
    /// Largest encoded gRPC request, in bytes; above it tonic answers RESOURCE_EXHAUSTED.
    #[serde(deserialize_with = "super::units::bytes")]
    pub max_request_bytes: usize,
    /// Most credits a consumer may hold at once, so one consumer cannot pin the whole backlog.
    pub max_credits: u32,
    /// Most connections open at once on the client port; more are closed
    /// as soon as they are accepted (each may carry 1,024 streams).
    pub max_connections: usize,
}

/// How deliveries are leased.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliveryConfig {
    /// How long a delivery stays leased without an ack before it is redelivered, in ms.
    #[serde(deserialize_with = "super::units::millis")]
    pub lease_timeout_ms: u64,
}

/// How the leader folds concurrent operations into one raft entry.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BatchingConfig {
    /// Most operations (produce batches, ack batches) in one entry.
    pub max_entry_ops: usize,
    /// Payload bytes after which an entry is closed (one larger op still goes alone).
    #[serde(deserialize_with = "super::units::bytes")]
    pub max_entry_bytes: usize,
    /// Entries a shard may have proposed and not yet committed; while they are
    /// in flight the next entry fills up.
    pub proposals_in_flight: usize,
    /// How long a produce or ack waits for its entry to commit before it is
    /// answered UNAVAILABLE (outcome unknown: no majority reachable), in ms.
    #[serde(deserialize_with = "super::units::millis")]
    pub commit_timeout_ms: u64,
    /// Produce calls one producer may have waiting for an entry on this
    /// node; past it, its calls are refused RESOURCE_EXHAUSTED (others'
    /// are not).
    pub max_queued_calls_per_producer: usize,
    /// Payload bytes one producer may have waiting for an entry on this node.
    pub max_queued_bytes_per_producer: usize,
    /// Payload bytes all producers may have waiting for one shard's entries
    /// on this node; past it, producers holding at least an equal share are
    /// refused.
    pub max_queued_bytes_per_shard: usize,
}

/// Raft timing, in milliseconds.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftConfig {
    /// Leader heartbeat.
    #[serde(deserialize_with = "super::units::millis")]
    pub heartbeat_ms: u64,
    /// Election timeout lower bound.
    #[serde(deserialize_with = "super::units::millis")]
    pub election_timeout_min_ms: u64,
    /// Election timeout upper bound.
    #[serde(deserialize_with = "super::units::millis")]
    pub election_timeout_max_ms: u64,
    /// Entries between two snapshots of a shard.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot.
    pub logs_kept_after_snapshot: u64,
    /// Bytes of a snapshot sent to a lagging replica in one message.
    #[serde(deserialize_with = "super::units::bytes")]
    pub snapshot_chunk_bytes: u64,
    /// Largest snapshot this node takes from a leader (it is received in
    /// memory); a larger one is refused.
    #[serde(deserialize_with = "super::units::bytes")]
    pub max_snapshot_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 1024 * 1024,
            max_batch_messages: 10_000,
            max_header_bytes: 64 * 1024,
            max_request_bytes: 16 * 1024 * 1024,
            max_credits: 100_000,
            max_connections: 4_096,
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
            // An entry's commit takes as long as its operations take to
            // apply and answer, and a quiet producer's produce waits for the
            // entries in flight ahead of it: under a flood of one-message
            // calls, 64 operations per entry give a quiet p99 of 36 ms
            // against 82 ms with 1,024 (three nodes, median of 3), for
            // about 10% less of the flood accepted. Batched produces fill
            // entries by bytes long before 64 operations.
            max_entry_ops: 64,
            // Entries of a flood stay small enough to commit quickly, so a
            // quiet producer on the same shard waits behind two short
            // entries, not two long ones (noisy-neighbor bench: quiet p99
            // 101 -> 77 ms against 1 MiB, flood accepted faster too), and
            // their state-machine writes mostly stay under the size at which
            // floret-store falls back to sled's costlier atomic batch.
            max_entry_bytes: 64 * 1024,
            proposals_in_flight: 2,
            commit_timeout_ms: 5_000,
            max_queued_calls_per_producer: 1_024,
            max_queued_bytes_per_producer: 64 * 1024 * 1024,
            max_queued_bytes_per_shard: 256 * 1024 * 1024,
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
            max_snapshot_bytes: DEFAULT_MAX_SNAPSHOT_BYTES,
        }
    }
}

/// Largest snapshot a node takes by default: 4 GiB. Snapshots carry the
/// payloads of every stored message, so this also caps the backlog a
/// replica that fell behind can catch up on by snapshot.
pub const DEFAULT_MAX_SNAPSHOT_BYTES: u64 = 4 << 30;
