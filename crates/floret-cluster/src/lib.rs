//! floret's cluster layer: where producers live ([`ShardPlacement`]), the
//! raft group of every shard ([`Shards`]) and the network between groups.
//!
//! The server asks this crate which shard holds a producer and whether this
//! node leads it, and proposes commands to that shard's raft group.
//!
//! IMPLEMENTATION CAVEATS
//! - One node only: groups have a single member and the network has no peers.
//! - No gossip view yet.

mod network;
mod placement;
mod shards;

pub use network::{NoLink, NoPeers};
pub use placement::{ShardPlacement, VIRTUAL_POINTS_PER_SHARD};
pub use shards::{RaftTuning, ShardGroup, Shards, ShardsError};
