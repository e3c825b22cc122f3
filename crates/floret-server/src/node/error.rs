//! Why a node could not start.

use std::time::Duration;

use floret_cluster::{PeersError, ShardsError};
use floret_store::OpenError;

use crate::service::server::ServerSetupError;
use crate::tls::TlsFileError;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configuration is not valid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The data dir could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The member list is not usable.
    #[error(transparent)]
    Peers(#[from] PeersError),
    /// The shards could not start.
    #[error(transparent)]
    Shards(#[from] ShardsError),
    /// Gossip could not start.
    #[error(transparent)]
    Gossip(#[from] floret_cluster::GossipError),
    /// The metrics recorder could not be installed.
    #[error("cannot export metrics: {0}")]
    Metrics(String),
    /// The servers could not be set up.
    #[error(transparent)]
    Server(#[from] ServerSetupError),
    /// A TLS file could not be read.
    #[error(transparent)]
    TlsFile(#[from] TlsFileError),
    /// The gossip secret is missing or too short.
    #[error("{0}")]
    GossipSecret(String),
    /// A token key file cannot be read or is not a public key, or a client
    /// certificate mapping names no valid tenant.
    #[error("{0}")]
    Auth(String),
    /// The listener's address is unknown.
    #[error("cannot read the listen address: {0}")]
    Listener(std::io::Error),
    /// A port could not be bound.
    #[error("cannot listen on {address} ({port} port): {source}")]
    Bind {
        /// Which port: client or peer.
        port: &'static str,
        /// The address.
        address: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The cluster to join did not take this node.
    #[error("cannot join the cluster: {0}")]
    Join(String),
    /// Some shard elected no leader in time.
    #[error("shard {shard} has no leader after {waited:?}")]
    NotReady {
        /// The shard.
        shard: u32,
        /// How long we waited.
        waited: Duration,
    },
}
