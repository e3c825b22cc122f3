//! Delivering messages: the node's dispatcher. Per queue, a
//! deficit-round-robin scheduler over the backlogged producers of the shards
//! this node leads, and the consumers subscribed to that queue with their
//! credits.
//!
//! - [`book`]: the pure core, [`book::DispatchBook`]. Every decision
//!   (credits, leases, holders, held messages, redeliveries, discards) is
//!   made there, from events and the time passed in.
//! - `actor.rs`: the task around the book, driven by [`DispatcherHandle`]
//!   commands: applied events from the state machines, leadership changes,
//!   subscriptions, credits, acks and nacks, and its own timer.
//! - [`fairness`]: recent deliveries and dwell times per producer.
//!
//! Payloads are read from the shard's state machine at dispatch; memory holds
//! counters per backlogged producer and one lease per message in flight.
//! An ack is checked against its lease here; [`crate::settle`] then removes
//! the message through raft and only then ends the lease.
//!
//! Ordering matters: state-machine events and consumer commands share one
//! channel, so an event applied before a rebuild is handled before any ack of
//! a message the rebuild delivered.
//!
//! IMPLEMENTATION CAVEATS
//! - The channels to consumer streams are unbounded; a consumer's credits
//!   bound what it is sent, redeliveries included.
//! - Consumers of a queue get deliveries from this node's book only; the
//!   fan-in (`service/fan_in/`) merges the nodes.

mod actor;
pub mod book;
pub mod fairness;
pub mod owner;
use std::collections::HashMap;

use floret_store::records::StoredMessage;
use floret_store::{AppliedEvent, ShardId};
use tokio::sync::{mpsc, oneshot};

use crate::delivery_id::{DeliveryId, DeliveryTicket};

pub(crate) use actor::{channel, spawn};
pub use owner::{SettledBy, StreamKey, StreamOwner};

/// Names a consumer stream for the dispatcher.
pub type ConsumerId = u64;

/// A message handed to a consumer.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// How the consumer names this delivery when it settles it.
    pub ticket: DeliveryTicket,
    /// The message as stored.
    pub message: StoredMessage,
}

/// Whether a consumer processed a delivery or hands it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleKind {
    /// Processed: remove the message.
    Ack,
    /// Not processed: deliver it again (attempt + 1).
    Nack,
    /// Not processed and not to be delivered again: move it to the dead letters.
    DeadLetter,
}

/// How settling one delivery id ended; the gRPC services map it onto a status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleCode {
    /// Settled (or, for an ack, already acked).
    Ok,
    /// The id is malformed.
    InvalidArgument,
    /// No such shard or message, or no replica here.
    NotFound,
    /// The caller did not get this delivery (another stream, another tenant).
    PermissionDenied,
    /// The lease is not live: it lapsed, was settled, or its leader changed.
    FailedPrecondition,
    /// The shard could not be read or its leader reached: try again.
    Unavailable,
}

/// The outcome of settling one delivery id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleOutcome {
    /// The id as the consumer sent it.
    pub delivery_id: String,
    /// Whether it was settled, and if not why.
    pub code: SettleCode,
    /// Why, when not OK.
    pub message: String,
    /// For a fresh ack (or nack to the dead letters): the delivery whose
    /// message must be removed through raft before the settle is answered.
    pub removal: Option<DeliveryId>,
}

/// What a consumer stream receives from the dispatcher.
#[derive(Debug, Clone)]
pub enum ConsumerEvent {
    /// A delivery (it cost one credit).
    Delivery(Box<Delivered>),
    /// Outcomes of acks or nacks sent on the stream.
    Settled(Vec<SettleOutcome>),
    /// The backlog of the consumer's queue on this node: sent at subscribe
    /// and when it changes, so a merge splits credits by it.
    Backlog(BacklogReport),
}

/// What a node tells the merges of a queue's consumers about the queue's
/// backlog in the shards it leads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BacklogReport {
    /// The sum of the weights of the backlogged producers.
    pub weight: u64,
    /// Per backlogged tenant, by name; empty on a node without token keys
    /// (one anonymous tenant, whose producer weight is `weight`).
    pub tenants: Vec<TenantBacklog>,
}

/// One backlogged tenant of a queue on one node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TenantBacklog {
    /// The tenant.
    pub tenant: String,
    /// The sum of the weights of its backlogged producers on this node.
    pub producer_weight: u64,
    /// The tenant's weight.
    pub weight: u32,
}

/// A tenant's share of its weight on one node, in parts per million of
/// [`floret_sched::WHOLE_SHARE`]: what a merge tells each node it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantShare {
    /// The tenant.
    pub tenant: String,
    /// Its share.
    pub share: u32,
}

/// Delivery counters of one queue on this node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueActivity {
    /// Messages leased to consumers now.
    pub in_flight: u64,
    /// Messages of led shards ready to be delivered (not in flight).
    pub ready: u64,
    /// Producers of led shards with messages ready.
    pub backlogged_producers: u64,
    /// The sum of those producers' weights.
    pub backlogged_weight: u64,
    /// Deliveries since the node started (redeliveries included).
    pub delivered: u64,
    /// Acks since the node started.
    pub acked: u64,
    /// Deliveries with attempt > 1 since the node started.
    pub redelivered: u64,
    /// In flight per producer.
    pub in_flight_by_producer: HashMap<String, u64>,
    /// Consumer streams subscribed to the queue on this node.
    pub consumers: u64,
    /// Per backlogged or recently delivered producer of led shards.
    pub producers: HashMap<String, ProducerActivity>,
}

/// One producer's scheduling figures on this node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProducerActivity {
    /// Deliveries in the recent window, and dwell times.
    pub fairness: fairness::ProducerFairness,
    /// Its DRR quantum.
    pub weight: u32,
    /// Credits left in its current turn.
    pub deficit: u32,
    /// Messages ready to be delivered now.
    pub ready: u64,
}

pub(crate) enum DispatcherCommand {
    Applied(AppliedEvent),
    Leadership {
        shard: ShardId,
        leader: bool,
    },
    Subscribe {
        queue: String,
        credits: u32,
        events: mpsc::UnboundedSender<ConsumerEvent>,
        for_peer: bool,
        owner: StreamOwner,
        reply: oneshot::Sender<ConsumerId>,
    },
    Credit {
        consumer: ConsumerId,
        credits: u32,
        replace: bool,
    },
    TenantShares {
        consumer: ConsumerId,
        shares: Vec<TenantShare>,
    },
    Settle {
        kind: SettleKind,
        ids: Vec<Result<DeliveryTicket, String>>,
        by: SettledBy,
        reply: oneshot::Sender<Vec<SettleOutcome>>,
    },
    RemovalCommitted {
        ids: Vec<DeliveryId>,
        acked: bool,
    },
    ConsumerGone {
        consumer: ConsumerId,
    },
    Activity {
        with_producers: bool,
        reply: oneshot::Sender<HashMap<String, QueueActivity>>,
    },
}

/// Cheap handle to the dispatcher task.
#[derive(Clone)]
pub struct DispatcherHandle {
    commands: mpsc::UnboundedSender<DispatcherCommand>,
}

/// The dispatcher task has stopped (the node is shutting down).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the dispatcher has stopped: the node is shutting down")]
pub struct DispatcherStopped;

impl DispatcherHandle {
    fn send(&self, command: DispatcherCommand) -> Result<(), DispatcherStopped> {
        self.commands.send(command).map_err(|_| DispatcherStopped)
    }

    /// Reports what a state machine applied.
    pub fn applied(&self, event: AppliedEvent) {
        let _stopping = self.send(DispatcherCommand::Applied(event));
    }

    /// Reports that this node gained or lost the leadership of `shard`.
    pub fn leadership(&self, shard: ShardId, leader: bool) {
        let _stopping = self.send(DispatcherCommand::Leadership { shard, leader });
    }

    /// Registers a consumer stream on `queue` with its first credits;
    /// `for_peer` when it feeds another node's merged consumer (such streams
    /// are not counted as consumers, the merged one is, where it connected);
    /// `owner` is the consumer's stream, which alone settles what it gets.
    pub async fn subscribe(
        &self,
        queue: String,
        credits: u32,
        events: mpsc::UnboundedSender<ConsumerEvent>,
        for_peer: bool,
        owner: StreamOwner,
    ) -> Result<ConsumerId, DispatcherStopped> {
        let (reply, id) = oneshot::channel();
        self.send(DispatcherCommand::Subscribe {
            queue,
            credits,
            events,
            for_peer,
            owner,
            reply,
        })?;
        id.await.map_err(|_| DispatcherStopped)
    }

    /// Grants a consumer more credits.
    pub fn credit(&self, consumer: ConsumerId, credits: u32) -> Result<(), DispatcherStopped> {
        self.send(DispatcherCommand::Credit {
            consumer,
            credits,
            replace: false,
        })
    }

    /// Replaces a consumer's unused credits (a node rebalancing the share it
    /// gave this node of a consumer it merges); zero is allowed.
    pub fn set_credits(&self, consumer: ConsumerId, credits: u32) -> Result<(), DispatcherStopped> {
        self.send(DispatcherCommand::Credit {
            consumer,
            credits,
            replace: true,
        })
    }

    /// The tenants' shares on this node of the queue `consumer` reads, as
    /// the merge that consumer feeds computed them from every node's
    /// backlog; tenants left out get a whole share.
    pub fn tenant_shares(
        &self,
        consumer: ConsumerId,
        shares: Vec<TenantShare>,
    ) -> Result<(), DispatcherStopped> {
        self.send(DispatcherCommand::TenantShares { consumer, shares })
    }

    /// Acks or nacks deliveries on behalf of `by`; ids that did not parse
    /// are answered INVALID_ARGUMENT, and those `by` was not given
    /// PERMISSION_DENIED.
    pub async fn settle(
        &self,
        kind: SettleKind,
        ids: Vec<Result<DeliveryTicket, String>>,
        by: SettledBy,
    ) -> Result<Vec<SettleOutcome>, DispatcherStopped> {
        let (reply, outcomes) = oneshot::channel();
        self.send(DispatcherCommand::Settle {
            kind,
            ids,
            by,
            reply,
        })?;
        outcomes.await.map_err(|_| DispatcherStopped)
    }

    /// These deliveries' removals committed (acked, or dead-lettered or
    /// dropped when not `acked`): their leases end.
    pub fn removal_committed(&self, ids: Vec<DeliveryId>, acked: bool) {
        let _stopping = self.send(DispatcherCommand::RemovalCommitted { ids, acked });
    }

    /// The consumer's stream ended: what it held is delivered again.
    pub fn consumer_gone(&self, consumer: ConsumerId) {
        let _stopping = self.send(DispatcherCommand::ConsumerGone { consumer });
    }

    /// Delivery counters of every queue; with `with_producers`, also each
    /// recently delivered producer's fairness figures (costs O(producers)).
    pub async fn activity(
        &self,
        with_producers: bool,
    ) -> Result<HashMap<String, QueueActivity>, DispatcherStopped> {
        let (reply, activity) = oneshot::channel();
        self.send(DispatcherCommand::Activity {
            with_producers,
            reply,
        })?;
        activity.await.map_err(|_| DispatcherStopped)
    }
}
