//! A consumer's stream served from the whole cluster.
//!
//! Each node's dispatcher delivers only from the shards that node leads. A
//! consumer connected to one node still gets every shard's messages: that
//! node subscribes to its own dispatcher and, over the peer port, to
//! every peer's, and merges the deliveries into the consumer's stream.
//!
//! Credits: every source reports its backlog for the queue (its
//! backlogged producer weight, and per tenant) on its own stream, when the
//! stream opens, when it changes and every second
//! (`deliver/book/backlog.rs`, `service/own_dispatcher.rs`). Each source
//! weighs what its tenants' backlogs there are of their backlogs
//! everywhere, and each source is told its tenants' shares
//! (`tenant_shares.rs`), so a tenant spread over several nodes gets its
//! weight once. The consumer's credits not yet promised to a source are
//! split between the sources by those weights ([`CreditSplit`]), so every
//! backlogged tenant in the cluster gets about `weight / total weight` of
//! the consumer, and each of its producers its part of that, wherever they
//! are placed. Nothing here reads the gossip view: a node is a source while
//! its stream is open and it is heard from, whatever gossip says.
//!
//! A new merge splits nothing until every source has reported (or
//! [`FIRST_SPLIT_WAIT`] has passed), so the first burst is split fairly
//! rather than taken by whichever node answered first. A live source with
//! nothing backlogged keeps exactly one credit, so a message arriving there
//! goes out at once; the rest of what it held is taken back
//! (`Credit{set}`) and given to the backlogged sources. A source that has
//! reported once and then is silent for [`SOURCE_SILENT_AFTER`] (a frozen
//! or cut-off node whose TCP connection has not broken yet) gets no
//! credits until it is heard again; a source that never reports (a node of
//! an older version) weighs one tenant. With the cross-node split off every
//! backlogged source weighs the same (fair between nodes, not between
//! producers). Deliveries beyond the consumer's credits (the one-per-node
//! minimum can exceed them) wait here, so the consumer never gets more
//! than it granted.
//!
//! Acks and nacks on the stream go through the [`Settler`], which sends each
//! to the leader of its shard (where the lease is). A stream may have
//! [`inbound::SETTLING_PER_STREAM`] delivery ids being settled at once;
//! past that its requests, credits too, wait (`inbound.rs`). A peer stream that
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
//! - Credits a silent source held are not counted, but it may still use
//!   them when it wakes; what it then delivers waits here for credit.

mod credits;
mod inbound;
mod merge;
mod outbound;
mod peer_source;
mod tenant_shares;

use std::sync::Arc;
use std::time::Duration;

use floret_cluster::Peers;
use floret_proto::v1;

pub(super) use inbound::{Admitted, read_requests};
pub use merge::serve;
pub use outbound::{ConsumeStream, Outbound, channel};

use crate::deliver::{BacklogReport, DispatcherHandle, TenantShare};
use crate::settle::Settler;

/// How long opening a consume stream on a peer may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the split is checked without other events (silent sources,
/// the first split's wait).
const REBALANCE_INTERVAL: Duration = Duration::from_millis(100);
/// Longest a new merge waits for every source's first backlog report
/// before it splits credits among those that reported.
const FIRST_SPLIT_WAIT: Duration = Duration::from_millis(500);
/// A source that reported once and has been silent this long (three missed
/// heartbeats) gets no credits until it is heard again.
const SOURCE_SILENT_AFTER: Duration = Duration::from_secs(3);
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
    /// The source's backlog, on the stream of that generation.
    Backlog(SourceIndex, u64, BacklogReport),
    Disconnected(SourceIndex),
}

/// A change of a peer stream's credits.
#[derive(Debug, Clone, Copy)]
enum CreditChange {
    Add(u32),
    Set(u32),
}

/// What the merge sends a peer source on its stream.
#[derive(Debug, Clone)]
enum SourceRequest {
    Credit(CreditChange),
    /// Each tenant's share on that source (`tenant_shares.rs`).
    TenantShares(Vec<TenantShare>),
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
    /// Split credits by backlogged weight (else equally between nodes).
    pub cross_node_split: bool,
}
