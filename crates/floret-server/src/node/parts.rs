//! The gRPC services of a node, built from its parts.

use std::sync::Arc;

use floret_cluster::Shards;
use tokio::sync::watch;

use crate::auth::Authenticate;
use crate::config::Config;
use crate::deliver::DispatcherHandle;
use crate::disk_room::DiskRoom;
use crate::faults::NodeFault;
use crate::leadership::hand_back::HandBack;
use crate::load_view::GossipStatus;
use crate::produce::ProducePipeline;
use crate::produce::backpressure::Backpressure;
use crate::produce::proposer::Proposers;
use crate::produce::tenant_limits::TenantLimits;
use crate::router::ShardRouter;
use crate::service::admin::AdminService;
use crate::service::fan_in;
use crate::service::floret::FloretService;
use crate::service::peer::{PeerService, ThisNode};
use crate::service::server::Services;
use crate::settle::Settler;
use crate::sink::LocalSinkWeights;

/// What the services are built from.
pub(super) struct NodeParts<'a> {
    pub(super) config: &'a Config,
    /// The node's fault, which cluster status reports.
    pub(super) fault: NodeFault,
    /// Where clients are told to dial this node.
    pub(super) advertised: String,
    pub(super) shards: &'a Arc<Shards>,
    pub(super) proposers: &'a Proposers,
    pub(super) dispatcher: DispatcherHandle,
    /// This node's gossip, for cluster status (none on a one-node cluster).
    pub(super) gossip: Option<GossipStatus>,
    /// The data dir's free space.
    pub(super) disk: DiskRoom,
    /// The tenants' limits over all their producers.
    pub(super) tenant_limits: Arc<TenantLimits>,
    /// The backlogged weights of this node's sink pumps, for the peers.
    pub(super) sink_weights: LocalSinkWeights,
}

impl NodeParts<'_> {
    /// The Floret, Admin and Peer services over this node's parts.
    pub(super) fn services(
        self,
        stopped: watch::Receiver<bool>,
        authenticate: Authenticate,
    ) -> Services {
        let (config, shards, proposers) = (self.config, self.shards, self.proposers);
        let router = ShardRouter::new(shards.clone(), proposers.clone());
        let settler = Settler::new(
            self.dispatcher.clone(),
            proposers.clone(),
            shards.clone(),
            router.clone(),
        );
        let produce = Arc::new(ProducePipeline::new(
            shards.clone(),
            router.clone(),
            config.limits.clone(),
            Backpressure::new(
                config.backpressure.clone(),
                shards.clone(),
                self.disk,
                config.storage.min_free_bytes,
            ),
            self.advertised.clone(),
            config.auth.enabled().then_some(self.tenant_limits),
        ));
        let consumers = fan_in::Sources {
            dispatcher: self.dispatcher.clone(),
            settler: settler.clone(),
            peers: shards.peers().clone(),
            max_credits: config.limits.max_credits,
            cross_node_split: config.fairness.cross_node_split,
        };
        let hand_back = HandBack::new(shards.clone(), proposers.clone(), self.dispatcher.clone());
        let admin = Arc::new(AdminService::new(
            shards.clone(),
            self.dispatcher,
            router,
            self.advertised,
            self.gossip,
            self.fault,
            config.auth.enabled(),
        ));
        Services {
            floret: FloretService::new(produce.clone(), consumers.clone(), stopped.clone()),
            admin: admin.clone(),
            peer: PeerService::new(
                shards.clone(),
                proposers.clone(),
                hand_back,
                ThisNode {
                    produce,
                    sources: consumers,
                    admin,
                    sink_weights: self.sink_weights,
                },
                config.raft.max_snapshot_bytes,
                stopped,
            ),
            max_request_bytes: config.limits.max_request_bytes,
            members: shards.peers().clone(),
            max_client_connections: config.limits.max_connections,
            authenticate,
        }
    }
}
