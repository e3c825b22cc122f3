//! One queue inside the dispatch book: its scheduler, its consumers in
//! round-robin order, who holds which lease, and its counters. With
//! [`Tenancy::Namespaced`] the scheduler takes turns between tenants first
//! (a producer `acme/p1` belongs to tenant `acme`), then between each
//! tenant's producers.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use floret_sched::{Scheduler, SchedulerConfig};
use floret_store::ShardId;

use crate::deliver::fairness::FairnessWindow;
use crate::deliver::{BacklogReport, ConsumerId};

/// A producer as the dispatcher schedules it: the shard is part of the key so
/// a message is read from the right shard without recomputing placement.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ProducerKey {
    pub shard: ShardId,
    pub producer: Arc<str>,
}

impl ProducerKey {
    pub fn new(shard: ShardId, producer: &str) -> Self {
        Self {
            shard,
            producer: producer.into(),
        }
    }
}

/// How a node's producers fall into tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenancy {
    /// One anonymous tenant: a node without token keys, whose producer ids
    /// are stored as clients give them.
    Anonymous,
    /// Producer ids are stored as `tenant/producer` (a node with token
    /// keys): fairness goes to tenants first.
    Namespaced,
}

/// The tenant of a producer stored as `tenant/producer`.
fn namespaced_tenant(key: &ProducerKey) -> String {
    floret_store::producer_group(&key.producer).to_owned()
}

/// The one tenant of a node without token keys.
fn anonymous_tenant(_: &ProducerKey) -> String {
    String::new()
}

/// A delayed message held back until its time, in the dispatcher's timer heap.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct HeldMessage {
    /// When it may be delivered, ms since the Unix epoch (first, so the heap orders by it).
    pub due_ms: i64,
    pub queue: Arc<str>,
    pub producer: ProducerKey,
    pub sequence: u64,
}

/// Who holds a live lease: the consumer it was delivered to, and the
/// random part of the delivery's id, which a settle must present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LeaseHolder {
    pub consumer: ConsumerId,
    pub nonce: u64,
}

/// One lease: which delivery of which message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct LeaseKey {
    pub producer: ProducerKey,
    pub sequence: u64,
    pub attempt: u32,
}

pub(super) struct QueueDispatch {
    pub scheduler: Scheduler<ProducerKey, String>,
    /// Subscribed consumers; the front is served next.
    pub consumers: VecDeque<ConsumerId>,
    /// Who holds each live lease.
    pub holders: HashMap<LeaseKey, LeaseHolder>,
    pub delivered: u64,
    pub acked: u64,
    pub redelivered: u64,
    /// Recent deliveries and dwell times per producer.
    pub fairness: FairnessWindow<ProducerKey>,
    /// The backlog the consumers were last told (`backlog.rs`).
    pub reported: BacklogReport,
    /// The scheduler's ring changes when that backlog was last computed.
    pub reported_at_change: Option<u64>,
}

impl QueueDispatch {
    /// Whether the backlog may differ from when this was last asked: the
    /// scheduler's rings changed since.
    pub fn backlog_may_have_changed(&mut self) -> bool {
        let changes = self.scheduler.ring_changes();
        let changed = self.reported_at_change != Some(changes);
        self.reported_at_change = Some(changes);
        changed
    }

    pub fn new(config: SchedulerConfig, tenancy: Tenancy) -> Self {
        let tenant_of = match tenancy {
            Tenancy::Anonymous => anonymous_tenant,
            Tenancy::Namespaced => namespaced_tenant,
        };
        Self {
            scheduler: Scheduler::with_tenants(config, tenant_of),
            consumers: VecDeque::new(),
            holders: HashMap::new(),
            delivered: 0,
            acked: 0,
            redelivered: 0,
            fairness: FairnessWindow::default(),
            reported: BacklogReport::default(),
            reported_at_change: None,
        }
    }

    /// Rotates the consumer ring until a consumer that `has_credit` is in front; None if nobody has.
    pub fn consumer_with_credit(
        &mut self,
        has_credit: impl Fn(ConsumerId) -> bool,
    ) -> Option<ConsumerId> {
        for _ in 0..self.consumers.len() {
            let front = *self.consumers.front()?;
            if has_credit(front) {
                return Some(front);
            }
            self.consumers.rotate_left(1);
        }
        None
    }
}
