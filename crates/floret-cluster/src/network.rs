//! The raft network between nodes: openraft's RPCs carried by the
//! `floret.peer.v1.Peer` service, one channel per peer shared by every shard.
//! Appends and heartbeats, nearly all the traffic, share one stream per peer
//! ([`crate::append_stream`]); votes and snapshot chunks are unary calls.
//!
//! A request names its shard and carries the openraft request encoded with
//! postcard; the answer carries openraft's `Result`, so a remote raft error
//! comes back as the error it was. A peer that cannot be reached (refused,
//! timed out, or not serving the shard yet) is `Unreachable`, which makes
//! openraft back off and retry. Snapshots travel in openraft's chunks
//! (`RaftTuning::snapshot_chunk_bytes`), never as one message.
//!
//! An append larger than [`APPEND_TARGET_BYTES`] is not sent: openraft is
//! told the payload is too large, with how many entries would fit, and
//! sends fewer. openraft gives each append only the heartbeat interval, so
//! a lagging follower catches up in bounded steps instead of timing out on
//! one huge message forever.
//!
//! [`encode`] and [`decode`] are shared with the serving side.
//!
//! IMPLEMENTATION CAVEATS
//! - Each group still sends its own heartbeats; the stream only carries
//!   them together.

use std::sync::Arc;

use floret_proto::peer::v1::RaftMessage;
use floret_store::{NodeId, ShardId, TypeConfig};
use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::append_stream::AppendCallError;
use crate::peers::Peers;

/// Largest encoded append-entries request sent in one call.
pub const APPEND_TARGET_BYTES: usize = 4 * 1024 * 1024;

/// Encodes an openraft value for the wire.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("in-memory postcard encoding cannot fail")
}

/// Decodes an openraft value from the wire.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// Network of one shard's raft group.
#[derive(Debug, Clone)]
pub struct PeerNetwork {
    shard: ShardId,
    peers: Arc<Peers>,
}

impl PeerNetwork {
    /// The network `shard`'s group uses to reach the other members.
    pub fn new(shard: ShardId, peers: Arc<Peers>) -> Self {
        Self { shard, peers }
    }
}

/// The link of one shard's group to one peer.
#[derive(Debug, Clone)]
pub struct PeerLink {
    shard: ShardId,
    target: NodeId,
    peers: Arc<Peers>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerLink;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> PeerLink {
        PeerLink {
            shard: self.shard,
            target,
            peers: self.peers.clone(),
        }
    }
}

/// Which openraft RPC a call carries.
#[derive(Debug, Clone, Copy)]
enum RaftRpc {
    Vote,
    InstallSnapshot,
}

impl PeerLink {
    fn unreachable<E: std::error::Error>(&self, why: String) -> RPCError<NodeId, BasicNode, E> {
        let reason = std::io::Error::other(format!(
            "shard {} cannot reach node {}: {why}",
            self.shard, self.target
        ));
        RPCError::Unreachable(Unreachable::new(&reason))
    }

    async fn call<Resp, E>(
        &self,
        rpc: RaftRpc,
        payload: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let Some(mut client) = self.peers.peer_client(self.target) else {
            return Err(self.unreachable("not a member".into()));
        };
        let message = RaftMessage {
            shard_id: self.shard,
            payload,
        };
        let call = async {
            match rpc {
                RaftRpc::Vote => client.vote(message).await,
                RaftRpc::InstallSnapshot => client.install_snapshot(message).await,
            }
        };
        let answer = match tokio::time::timeout(option.hard_ttl(), call).await {
            Ok(Ok(answer)) => answer.into_inner(),
            Ok(Err(status)) => {
                return Err(self.unreachable(format!("{}: {}", status.code(), status.message())));
            }
            Err(_) => {
                return Err(self.unreachable(format!("no answer within {:?}", option.hard_ttl())));
            }
        };
        self.result(&answer.payload)
    }

    /// openraft's result, as the peer encoded it.
    #[expect(
        clippy::result_large_err,
        reason = "RaftNetwork's methods return openraft's RPCError as it is"
    )]
    fn result<Resp, E>(
        &self,
        payload: &[u8],
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        match decode::<Result<Resp, RaftError<NodeId, E>>>(payload) {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(remote)) => Err(RPCError::RemoteError(RemoteError::new(self.target, remote))),
            Err(error) => Err(self.unreachable(format!("undecodable answer: {error}"))),
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let payload = encode(&rpc);
        let entries = rpc.entries.len();
        if payload.len() > APPEND_TARGET_BYTES && entries > 1 {
            let fitting = (entries * APPEND_TARGET_BYTES / payload.len()).max(1);
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(fitting as u64),
            ));
        }
        let Some(stream) = self.peers.append_stream(self.target) else {
            return Err(self.unreachable("not a member".into()));
        };
        let sent = std::time::Instant::now();
        let answer = match stream.call(self.shard, payload, option.hard_ttl()).await {
            Ok(answer) => {
                metrics::histogram!("floret_raft_append_seconds")
                    .record(sent.elapsed().as_secs_f64());
                answer
            }
            // A timeout, not Unreachable: openraft backs off from an
            // unreachable node for 500 ms and sends it nothing, heartbeats
            // included, longer than a follower waits before it calls an
            // election. A slow append under load would depose its leader.
            Err(AppendCallError::TimedOut) => {
                return Err(RPCError::Timeout(Timeout {
                    action: RPCTypes::AppendEntries,
                    id: self.peers.node_id(),
                    target: self.target,
                    timeout: option.hard_ttl(),
                }));
            }
            Err(AppendCallError::Failed(why)) => return Err(self.unreachable(why)),
        };
        self.result(&answer)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(RaftRpc::InstallSnapshot, encode(&rpc), &option)
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(RaftRpc::Vote, encode(&rpc), &option).await
    }
}
