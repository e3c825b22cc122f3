//! Changing a [`Cluster`]'s members the way an operator does: a new node
//! (with a certificate of the cluster's CA, over TLS) made a member
//! through the admin API and started with `--join`, a member
//! removed (alive or killed first) or replaced by a new node in its seat
//! and, once it has left, forgotten here; and waiting until every shard's
//! replicas are where the members place them.
//!
//! IMPLEMENTATION CAVEATS
//! - A joined node's peer links do not run through proxies: the other
//!   nodes dial it at its own peer port, and it dials them at the
//!   addresses the membership group holds (node 1's links, from the
//!   founding). No schedule cuts links while members change.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use floret_client::ClusterStatusResponse;

use super::{Cluster, Node, NodeId};
use crate::process::poll;

impl Cluster {
    /// Makes node `id` (a new id) a member through a serving node, starts
    /// it with `--join` and waits until it serves.
    pub async fn add_member(&mut self, id: NodeId) -> anyhow::Result<()> {
        let (node, peer_address) = self.new_node(id)?;
        self.serving_client()?
            .add_node(id, &peer_address)
            .await
            .with_context(|| format!("add node {id}"))?;
        self.start_joined(id, node).await
    }

    /// Removes member `id` through a serving node (it may be down), waits
    /// until it has left the membership group, and forgets it: it is
    /// stopped if it runs and is no longer one of [`Cluster::ids`] (a
    /// founding node's proxies stay: the founders' `--peers` name it still).
    pub async fn remove_member(&mut self, id: NodeId, within: Duration) -> anyhow::Result<()> {
        self.serving_client_except(id)?
            .remove_node(id)
            .await
            .with_context(|| format!("remove node {id}"))?;
        self.forget_once_left(id, within).await
    }

    /// Replaces member `id` (it may be down) by node `with` (a new id) in
    /// its seat through a serving node, starts `with` with `--join`, waits
    /// until it serves, and forgets `id` once it has left as
    /// [`Cluster::remove_member`] does.
    pub async fn replace_member(
        &mut self,
        id: NodeId,
        with: NodeId,
        within: Duration,
    ) -> anyhow::Result<()> {
        let (node, peer_address) = self.new_node(with)?;
        self.serving_client_except(id)?
            .replace_node(id, with, &peer_address)
            .await
            .with_context(|| format!("replace node {id} by node {with}"))?;
        self.start_joined(with, node).await?;
        self.forget_once_left(id, within).await
    }

    /// A node `id` (a new id, with a certificate over TLS) on free loopback
    /// ports, not started, and its peer address.
    fn new_node(&self, id: NodeId) -> anyhow::Result<(Node, String)> {
        if self.nodes.contains_key(&id) {
            bail!("node {id} is already one of the cluster's");
        }
        if let Some(certs) = &self.certs {
            certs
                .add_node(&self.spec.binary, id)
                .map_err(anyhow::Error::msg)?;
        }
        let ports = crate::ports::free_loopback_ports(2)?;
        let node = Node {
            address: SocketAddr::from(([127, 0, 0, 1], ports[0])),
            peer_address: SocketAddr::from(([127, 0, 0, 1], ports[1])),
            child: None,
            paused: false,
        };
        let peer_address = node.peer_address.to_string();
        Ok((node, peer_address))
    }

    /// Starts `node`, a member now, as node `id` with `--join` and waits
    /// until it serves.
    async fn start_joined(&mut self, id: NodeId, node: Node) -> anyhow::Result<()> {
        self.joined.insert(id);
        self.nodes.insert(id, node);
        self.spawn(id, "")?;
        self.wait_ready(id).await
    }

    /// Waits until member `id` has left the membership group, then stops it
    /// if it runs and forgets it.
    async fn forget_once_left(&mut self, id: NodeId, within: Duration) -> anyhow::Result<()> {
        let left = poll(within, Duration::from_millis(200), || async {
            let status = self.status_except(id).await?;
            let membership = status.membership?;
            (!membership.members.iter().any(|m| m.node_id == id)).then_some(())
        })
        .await;
        if left.is_none() {
            bail!("node {id} did not leave the membership group within {within:?}");
        }
        if self.nodes.get(&id).is_some_and(|node| node.child.is_some()) {
            self.stop(id, within).await?;
        }
        self.kill(id).await;
        self.nodes.remove(&id);
        Ok(())
    }

    /// Waits until the members are the nodes here, none leaving, and every
    /// shard has a leader and its voters where its leader places it,
    /// three (all of them when fewer) among the members, and no learner.
    pub async fn wait_for_placement(&self, within: Duration) -> anyhow::Result<()> {
        let nodes: BTreeSet<NodeId> = self.ids().into_iter().collect();
        let settled = poll(within, Duration::from_millis(250), || async {
            let status = self.status_except(0).await?;
            placed_on(&status, &nodes).then_some(())
        })
        .await;
        if settled.is_none() {
            let status = self.status_except(0).await;
            bail!(
                "the shards did not settle on nodes {nodes:?} within {within:?}: {:?}",
                status.map(|s| s
                    .shards
                    .iter()
                    .map(|shard| (
                        shard.shard_id,
                        shard.leader_id,
                        shard.voters.clone(),
                        shard.learners.clone()
                    ))
                    .collect::<Vec<_>>())
            );
        }
        Ok(())
    }

    /// The cluster status as a serving node other than `except` gives it.
    async fn status_except(&self, except: NodeId) -> Option<ClusterStatusResponse> {
        let client = self.serving_client_except(except).ok()?;
        tokio::time::timeout(Duration::from_secs(2), client.cluster_status())
            .await
            .ok()?
            .ok()
    }

    fn serving_client(&self) -> anyhow::Result<floret_client::Client> {
        self.serving_client_except(0)
    }

    /// A client of every serving node but `except`.
    fn serving_client_except(&self, except: NodeId) -> anyhow::Result<floret_client::Client> {
        let addresses: Vec<String> = self
            .serving()
            .into_iter()
            .filter(|&id| id != except)
            .map(|id| self.nodes[&id].address.to_string())
            .collect();
        if addresses.is_empty() {
            bail!("no node serves");
        }
        self.client_of(&addresses.join(","))
    }
}

/// Whether `status` shows the members to be `nodes`, none leaving, and
/// every shard led, its voters where the placement puts it, three (or
/// every node, when fewer) among them, and no learner.
fn placed_on(status: &ClusterStatusResponse, nodes: &BTreeSet<NodeId>) -> bool {
    let Some(membership) = &status.membership else {
        return false;
    };
    let members: BTreeSet<NodeId> = membership.members.iter().map(|m| m.node_id).collect();
    if &members != nodes || membership.members.iter().any(|m| m.leaving) {
        return false;
    }
    let replicas = nodes.len().min(3);
    !status.shards.is_empty()
        && status.shards.iter().all(|shard| {
            let mut placed = shard.placed.clone();
            placed.sort_unstable();
            let mut voters = shard.voters.clone();
            voters.sort_unstable();
            shard.leader_id != 0
                && shard.learners.is_empty()
                && voters == placed
                && shard.voters.len() == replicas
                && shard.voters.iter().all(|voter| nodes.contains(voter))
        })
}
