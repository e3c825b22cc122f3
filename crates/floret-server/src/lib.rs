//! A floret node: the gRPC services, the per-shard proposers that fold
//! produces and acks into raft entries, the fair dispatcher, and the typed
//! configuration.
//!
//! `floret serve` builds a [`Config`], binds a listener and runs a [`Node`]:
//! produce requests go down the produce path ([`produce`]): checked, placed
//! on a shard, admitted, folded into a raft entry by that shard's proposer
//! and answered once applied; the state machines report new messages to
//! the dispatcher ([`deliver`]), which hands them to consumers in
//! deficit-round-robin order across producers. Failures below the gRPC
//! services are [`error::RequestError`]s, turned into statuses in one place.
//!
//! In a cluster any node takes any request: the [`router`] sends produces,
//! commits and acks to their shard's leader, consumers get every node's
//! deliveries, and [`leadership`] returns leaderships to their preferred
//! replicas.
//!
//! Nodes of a cluster publish their load over gossip ([`load_view`]) and
//! split each consumer's credits between nodes by backlogged weight.
//!
//! Producer policies (weights, tiers, limits, TTL, attempts, rates) are
//! replicated with the queues; [`policy`] maps them onto the scheduler and
//! the produce path, and the Admin service sets them and manages dead letters.
//! A node short of room throttles the producers over their fair share
//! ([`produce::admission`]).
//!
//! Messages may be delayed (held back at dispatch without blocking others),
//! and producers that stay idle have their counters forgotten ([`idle`]).

pub mod auth;
pub mod config;
mod console;
#[cfg(test)]
mod decode_properties;
pub mod deliver;
pub mod delivery_id;
pub mod disk_room;
pub mod error;
pub mod faults;
mod gossip_reach;
mod idle;
pub mod leadership;
mod listeners;
mod load_view;
pub mod metric_catalog;
mod node;
pub mod policy;
pub mod produce;
pub mod raft_inputs;
pub mod request;
pub mod router;
pub mod service;
pub mod settle;
mod sink;
pub mod telemetry;
pub mod tls;

pub use config::Config;
pub use floret_cluster::member_name;
pub use floret_store::failpoints;
pub use listeners::bind_listeners;
pub use node::{Node, NodeError};
pub use produce::proposer::ProposeError;
