//! A consumer's stream served from the whole cluster.
//!
//! Each node's dispatcher delivers only from the shards that node leads. A
//! consumer connected to one node still gets every shard's messages: that
//! node subscribes to its own dispatcher and, over the peer port, to
//! every peer's, and merges the deliveries into the consumer's stream.
//!
//! Credits: the consumer's credits not yet promised to a node are split
//! between the nodes by the backlogged weight each reports in the gossip
//! view ([`CreditSplit`]), so each node delivers in proportion to its
//! backlogged weight and every backlogged producer in the cluster gets
//! about `weight / total weight` of the consumer, wherever it is placed.
//! A live node with nothing backlogged keeps exactly one credit, so a
//! message arriving there goes out at once; the rest of what it held is
//! taken back (`Credit{set}`) and given to the backlogged nodes. Nodes the
//! view declares dead get none. With the cross-node split off every
//! backlogged node weighs the same (fair between nodes, not between
//! producers); a one-node cluster has no view and one source. Deliveries beyond the
//! consumer's credits (the one-per-node minimum can exceed them) wait here,
//! so the consumer never gets more than it granted.
//!
//! Acks and nacks on the stream go through the [`Settler`], which sends each
//! to the leader of its shard (where the lease is). A peer stream that
//! breaks is opened again after a pause; what it held is redelivered by its
//! shard's leader.
//!
//! Unread deliveries: a consumer whose stream holds 16 MiB of deliveries it
//! has not read is treated as one without credit until it reads
//! (`outbound.rs`), so one that stops reading pins at most that much here.
//!
//! IMPLEMENTATION CAVEATS
//! - A delivery waiting here for credit keeps its lease ticking on the node
//!   that made it; a consumer slower than the lease timeout with fewer
//!   credits than nodes can get a copy whose lease lapsed (its ack then
//!   fails and the message comes again: at-least-once still holds).
//! - Weights are as fresh as the view (a gossip interval or two).

mod credits;
mod merge;
mod outbound;
mod peer_source;

use std::sync::Arc;
use std::time::Duration;

use floret_cluster::{Peers, View};
use floret_proto::v1;
use tokio::sync::watch;

pub use merge::serve;
pub use outbound::{ConsumeStream, Outbound, channel};

use crate::deliver::DispatcherHandle;
use crate::settle::Settler;

/// How long opening a consume stream on a peer may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the split is checked against the view without other events.
const REBALANCE_INTERVAL: Duration = Duration::from_millis(100);
/// Pause before a broken peer stream is opened again.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);
/// Largest delivery accepted from a peer.
const MAX_DELIVERY_BYTES: usize = 32 * 1024 * 1024;

/// Index of a source: 0 is this node's dispatcher, then one per peer.
type SourceIndex = usize;

/// What a peer stream reports to the merge.
enum PeerEvent {
    Connected(SourceIndex),
    Delivery(SourceIndex, u64, v1::Delivery),
    Disconnected(SourceIndex),
}

/// A change of a peer stream's credits.
#[derive(Debug, Clone, Copy)]
enum CreditChange {
    Add(u32),
    Set(u32),
}

/// What a node merges consumers from: its own dispatcher, its settler for
/// their acks, and its peers.
#[derive(Clone)]
pub struct Sources {
    /// This node's dispatcher.
    pub dispatcher: DispatcherHandle,
    /// Routes acks and nacks to their shard's leader.
    pub settler: Settler,
    /// The other nodes.
    pub peers: Arc<Peers>,
    /// Most credits a consumer may hold.
    pub max_credits: u32,
    /// The gossip view (none on a one-node cluster).
    pub view: Option<watch::Receiver<Arc<View>>>,
    /// Split credits by backlogged weight (else equally between nodes).
    pub cross_node_split: bool,
}
