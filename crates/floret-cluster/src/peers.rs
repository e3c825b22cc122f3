//! The cluster's members and one lazily connected gRPC channel to each
//! other node, shared by the raft traffic of every shard and by the
//! node-to-node calls of the server (forwarded produces, settles, consumes),
//! and on it one [`AppendStream`] to each other node for every shard's
//! append-entries calls. With [`MemberTls`] every channel is mutual TLS:
//! this node presents its member certificate and expects the one of the
//! node it dials.
//!
//! The member list can change while the node runs ([`Peers::set_members`],
//! which the membership group drives): every read is of the list as it is
//! at that moment, and [`Peers::member_changes`] says when it changed.
//!
//! IMPLEMENTATION CAVEATS
//! - A member that leaves loses its channel here at once; calls already
//!   holding it go on until they end.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockReadGuard};
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
    tls: Option<MemberTls>,
    members: RwLock<Members>,
    /// Counts the changes of the member list.
    changes: tokio::sync::watch::Sender<u64>,
}

/// The members at one time: each one's address, and a channel and an
/// append stream to every other one.
#[derive(Debug, Default)]
struct Members {
    addresses: BTreeMap<NodeId, String>,
    dialled: BTreeMap<NodeId, Dialled>,
}

/// The way to one other member.
#[derive(Debug, Clone)]
struct Dialled {
    channel: Channel,
    append_stream: Arc<AppendStream>,
}

impl Peers {
    /// `members` maps every node id, this node's included, to the `host:port`
    /// the others dial; with `tls` every channel is mutual TLS.
    pub fn new(
        node_id: NodeId,
        members: BTreeMap<NodeId, String>,
        tls: Option<&MemberTls>,
    ) -> Result<Self, PeersError> {
        let peers = Self {
            node_id,
            tls: tls.cloned(),
            members: RwLock::new(Members::default()),
            changes: tokio::sync::watch::Sender::new(0),
        };
        peers.set_members(members)?;
        Ok(peers)
    }

    /// Makes `members` (every node id, this node's included, to its
    /// address) the member list. A member whose address is unchanged keeps
    /// its channel and its append stream; a member that left loses them,
    /// which ends its stream. Returns whether anything changed.
    pub fn set_members(&self, members: BTreeMap<NodeId, String>) -> Result<bool, PeersError> {
        if !members.contains_key(&self.node_id) {
            return Err(PeersError::NotAMember(self.node_id));
        }
        let mut dialled = BTreeMap::new();
        {
            let current = self.read();
            if current.addresses == members {
                return Ok(false);
            }
            for (&node, address) in &members {
                if node == self.node_id {
                    continue;
                }
                let kept = current
                    .dialled
                    .get(&node)
                    .filter(|_| current.addresses.get(&node) == Some(address));
                let way = match kept {
                    Some(way) => way.clone(),
                    None => self.dial(node, address)?,
                };
                dialled.insert(node, way);
            }
        }
        *self.members.write().unwrap_or_else(|p| p.into_inner()) = Members {
            addresses: members,
            dialled,
        };
        self.changes.send_modify(|changes| *changes += 1);
        Ok(true)
    }

    /// Changes whenever the member list does (for those that hold on to
    /// the members, like a consumer's fan-in over every node).
    pub fn member_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// A lazily connected channel to `node` at `address`, and the append
    /// stream on it.
    fn dial(&self, node: NodeId, address: &str) -> Result<Dialled, PeersError> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let uri = match address.split_once("://") {
            Some((_, host_port)) => format!("{scheme}://{host_port}"),
            None => format!("{scheme}://{address}"),
        };
        let mut endpoint = Endpoint::from_shared(uri).map_err(|e| PeersError::InvalidAddress {
            node,
            address: address.to_owned(),
            reason: e.to_string(),
        })?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint
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
        let append_stream = Arc::new(AppendStream::new(node, peer_client(channel.clone())));
        Ok(Dialled {
            channel,
            append_stream,
        })
    }

    fn read(&self) -> RwLockReadGuard<'_, Members> {
        self.members.read().unwrap_or_else(|p| p.into_inner())
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// Every member's id, this node's included, in order.
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.read().addresses.keys().copied().collect()
    }

    /// The other members' ids, in order, as they are now.
    pub fn others(&self) -> std::vec::IntoIter<NodeId> {
        let others: Vec<NodeId> = self.read().dialled.keys().copied().collect();
        others.into_iter()
    }

    /// The address a member is dialled on.
    pub fn address(&self, node: NodeId) -> Option<String> {
        self.read().addresses.get(&node).cloned()
    }

    /// The channel to another member (None for this node or a stranger).
    pub fn channel(&self, node: NodeId) -> Option<Channel> {
        self.read()
            .dialled
            .get(&node)
            .map(|way| way.channel.clone())
    }

    /// A `Peer` service client of another member.
    pub fn peer_client(&self, node: NodeId) -> Option<PeerClient<Channel>> {
        self.channel(node).map(peer_client)
    }

    /// The stream carrying every shard's append-entries calls to another member.
    pub(crate) fn append_stream(&self, node: NodeId) -> Option<Arc<AppendStream>> {
        self.read()
            .dialled
            .get(&node)
            .map(|way| way.append_stream.clone())
    }
}

fn peer_client(channel: Channel) -> PeerClient<Channel> {
    PeerClient::new(channel)
        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(members: &[(NodeId, &str)]) -> BTreeMap<NodeId, String> {
        members
            .iter()
            .map(|&(node, address)| (node, address.to_owned()))
            .collect()
    }

    #[tokio::test]
    async fn a_changed_member_list_redials_only_the_members_whose_address_changed() {
        let peers = Peers::new(
            1,
            list(&[(1, "127.0.0.1:1"), (2, "127.0.0.1:2"), (3, "127.0.0.1:3")]),
            None,
        )
        .unwrap();
        let stream_to_2 = peers.append_stream(2).unwrap();
        let stream_to_3 = peers.append_stream(3).unwrap();
        let changed = peers
            .set_members(list(&[
                (1, "127.0.0.1:1"),
                (2, "127.0.0.1:2"),
                (3, "127.0.0.1:33"),
                (4, "127.0.0.1:4"),
            ]))
            .unwrap();
        assert!(changed);
        assert!(Arc::ptr_eq(&stream_to_2, &peers.append_stream(2).unwrap()));
        assert!(!Arc::ptr_eq(&stream_to_3, &peers.append_stream(3).unwrap()));
        assert_eq!(peers.others().collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(peers.address(3).as_deref(), Some("127.0.0.1:33"));

        assert!(
            peers
                .set_members(list(&[(1, "127.0.0.1:1"), (3, "127.0.0.1:33")]))
                .unwrap()
        );
        assert!(peers.append_stream(2).is_none() && peers.channel(4).is_none());
        assert_eq!(peers.node_ids(), [1, 3]);
        assert!(
            !peers
                .set_members(list(&[(1, "127.0.0.1:1"), (3, "127.0.0.1:33")]))
                .unwrap()
        );
    }

    #[tokio::test]
    async fn a_member_list_without_this_node_is_refused_and_changes_nothing() {
        let peers = Peers::new(1, list(&[(1, "127.0.0.1:1"), (2, "127.0.0.1:2")]), None).unwrap();
        let refused = peers.set_members(list(&[(2, "127.0.0.1:2"), (3, "127.0.0.1:3")]));
        assert!(matches!(refused, Err(PeersError::NotAMember(1))));
        assert_eq!(peers.node_ids(), [1, 2]);
    }
}
