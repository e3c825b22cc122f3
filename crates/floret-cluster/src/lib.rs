//! floret's cluster layer: where producers and shards live (placement), the
//! members and the channels between them ([`Peers`]), the raft group of every
//! shard this node holds ([`Shards`]) and the raft network over gRPC.
//!
//! The server asks this crate which shard holds a producer, which node leads
//! it, and proposes commands to the raft groups it holds.
//!
//! The gossip view ([`Gossip`]) carries what every node publishes about
//! itself: its address, the shards it leads and its load per queue. It is
//! a hint for status and steering; nothing that delivers waits for it.
//!
//! Requests are routed to a shard's leader as this node's replica knows it,
//! or, for shards it does not hold, as the gossip view says.
//!
//! IMPLEMENTATION CAVEATS
//! - Leadership rebalancing is driven by each preferred replica asking for
//!   its shards back (the view only vetoes dead or suspected nodes).

mod append_stream;
mod gossip;
mod gossip_relay;
mod gossip_transport;
mod gossip_values;
mod member_tls;
mod move_steps;
mod moves;
mod network;
mod peers;
mod placement;
mod shards;

pub use append_stream::batched;
pub use gossip::{
    DEAD_AFTER_ROUNDS, Gossip, GossipConfig, GossipError, Liveness, NodeReport, NodeView,
    QueueLoad, SUSPECT_AFTER_ROUNDS, TenantLoad, View,
};
pub use gossip_transport::{GossipSecret, MIN_SECRET_BYTES, Traffic};
pub use member_tls::{
    MemberTls, certificate_carries_name, is_dns_name, member_name, member_named_by,
    pem_names_member, tls_error_chain,
};
pub use move_steps::{ChangeRefused, MoveStep, ShardRaftView, check_change, next_move_step};
pub use moves::{MoveFigures, ShardMove, least_share_copied, move_figures, shard_moves};
pub use network::{PeerLink, PeerNetwork, decode, encode};
pub use peers::{MAX_PEER_MESSAGE_BYTES, Peers, PeersError};
pub use placement::{ReplicaPlacement, ShardPlacement, VIRTUAL_POINTS_PER_SHARD};
pub use shards::{
    MAX_MEMBERSHIP_VOTERS, MEMBERSHIP_GROUP, Member, MemberChange, MemberChangeError, MembersView,
    RaftTuning, ShardGroup, Shards, ShardsError, membership_voters,
};
