//! The cluster's members and one lazily connected gRPC channel to each
//! other node, shared by the raft traffic of every shard and by the
//! node-to-node calls of the server (forwarded produces, settles, consumes),
//! and on it one [`AppendStream`] to each other node for every shard's
//! append-entries calls. With [`MemberTls`] every channel is mutual TLS:
//! this node presents its member certificate and expects the one of the
//! node it dials.
//!
//! IMPLEMENTATION CAVEATS
//! - Members come from static configuration; no runtime membership changes.

use std::collections::BTreeMap;
use std::time::Duration;

use floret_proto::peer::v1::peer_client::PeerClient;
use floret_store::NodeId;
use tonic::transport::{Channel, Endpoint};

use crate::append_stream::AppendStream;
use crate::member_tls::{MemberTls, tls_error_chain};

/// Largest node-to-node message: a snapshot chunk or a batch of appended
/// entries, whose size openraft bounds (see `RaftTuning`).
pub const MAX_PEER_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// How long connecting to a peer may take before the call fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// HTTP/2 pings on idle peer connections, so a dead peer is noticed.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// A member list that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PeersError {
    /// This node is not in its own member list.
    #[error("node {0} is not in the member list")]
    NotAMember(NodeId),
    /// A member's address is not a valid endpoint.
    #[error("node {node} has an invalid address {address:?}: {reason}")]
    InvalidAddress {
        /// The member.
        node: NodeId,
        /// Its address.
        address: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The TLS settings do not fit a member's address.
    #[error("cannot dial node {node} over TLS: {reason}")]
    Tls {
        /// The member.
        node: NodeId,
        /// Why.
        reason: String,
    },
}

/// The members of the cluster and a channel to every other one.
#[derive(Debug)]
pub struct Peers {
    node_id: NodeId,
    addresses: BTreeMap<NodeId, String>,
    channels: BTreeMap<NodeId, Channel>,
    append_streams: BTreeMap<NodeId, AppendStream>,
}

impl Peers {
    /// `members` maps every node id, this node's included, to the `host:port`
    /// the others dial; with `tls` every channel is mutual TLS.
    pub fn new(
        node_id: NodeId,
        members: BTreeMap<NodeId, String>,
        tls: Option<&MemberTls>,
    ) -> Result<Self, PeersError> {
        if !members.contains_key(&node_id) {
            return Err(PeersError::NotAMember(node_id));
        }
        let mut channels = BTreeMap::new();
        for (&node, address) in &members {
            if node == node_id {
                continue;
            }
            let scheme = if tls.is_some() { "https" } else { "http" };
            let uri = match address.split_once("://") {
                Some((_, host_port)) => format!("{scheme}://{host_port}"),
                None => format!("{scheme}://{address}"),
            };
            let mut endpoint =
                Endpoint::from_shared(uri).map_err(|e| PeersError::InvalidAddress {
                    node,
                    address: address.clone(),
                    reason: e.to_string(),
                })?;
            if let Some(tls) = tls {
                endpoint =
                    endpoint
                        .tls_config(tls.dialling(node))
                        .map_err(|e| PeersError::Tls {
                            node,
                            reason: tls_error_chain(&e),
                        })?;
            }
            let channel = endpoint
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(KEEPALIVE)
                .keep_alive_while_idle(true)
                .connect_lazy();
            channels.insert(node, channel);
        }
        let append_streams = channels
            .iter()
            .map(|(&node, channel)| (node, AppendStream::new(node, peer_client(channel.clone()))))
            .collect();
        Ok(Self {
            node_id,
            addresses: members,
            channels,
            append_streams,
        })
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// Every member's id, this node's included, in order.
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.addresses.keys().copied().collect()
    }

    /// The other members' ids, in order.
    pub fn others(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.channels.keys().copied()
    }

    /// The address a member is dialled on.
    pub fn address(&self, node: NodeId) -> Option<&str> {
        self.addresses.get(&node).map(String::as_str)
    }

    /// The channel to another member (None for this node or a stranger).
    pub fn channel(&self, node: NodeId) -> Option<Channel> {
        self.channels.get(&node).cloned()
    }

    /// A `Peer` service client of another member.
    pub fn peer_client(&self, node: NodeId) -> Option<PeerClient<Channel>> {
        self.channel(node).map(peer_client)
    }

    /// The stream carrying every shard's append-entries calls to another member.
    pub(crate) fn append_stream(&self, node: NodeId) -> Option<&AppendStream> {
        self.append_streams.get(&node)
    }
}

fn peer_client(channel: Channel) -> PeerClient<Channel> {
    PeerClient::new(channel)
        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES)
}
