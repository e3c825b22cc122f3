//! The raft network between nodes.
//!
//! Every shard is a one-member group for now, so openraft never sends an RPC:
//! there is nobody to send it to. The factory still has to exist, and answers
//! any call with `Unreachable`, which makes openraft back off rather than fail.
//!
//! IMPLEMENTATION CAVEATS
//! - No transport between nodes yet: the tonic raft service (one channel per
//!   peer, shard id in every request, chunked snapshots) comes with the
//!   three-node cluster.

use floret_store::{NodeId, TypeConfig};
use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

/// Network of a node that has no peers.
#[derive(Debug, Clone, Default)]
pub struct NoPeers;

/// The (never connected) link to a peer.
#[derive(Debug, Clone)]
pub struct NoLink {
    target: NodeId,
}

impl NoLink {
    fn unreachable<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        let reason = std::io::Error::other(format!(
            "node {} is not reachable: this node has no peers",
            self.target
        ));
        RPCError::Unreachable(Unreachable::new(&reason))
    }
}

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoLink;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> NoLink {
        NoLink { target }
    }
}

impl RaftNetwork<TypeConfig> for NoLink {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(self.unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }
}
