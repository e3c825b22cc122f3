//! floret's cluster layer: where producers and shards live (placement), the
//! members and the channels between them ([`Peers`]), the raft group of every
//! shard this node holds ([`Shards`]) and the raft network over gRPC.
//!
//! The server asks this crate which shard holds a producer, which node leads
//! it, and proposes commands to the raft groups it holds.
//!
//! IMPLEMENTATION CAVEATS
//! - No gossip view yet: leaders are read from this node's own replicas.

mod network;
mod peers;
mod placement;
mod shards;

pub use network::{PeerLink, PeerNetwork, decode, encode};
pub use peers::{MAX_PEER_MESSAGE_BYTES, Peers, PeersError};
pub use placement::{ReplicaPlacement, ShardPlacement, VIRTUAL_POINTS_PER_SHARD};
pub use shards::{RaftTuning, ShardGroup, Shards, ShardsError};
