//! The dispatch book: the node's whole delivery state, as a pure state
//! machine. Per queue a fair scheduler over the backlogged producers of the
//! shards this node leads; the consumers with their credits; who holds
//! which lease; delayed messages held back until their time.
//!
//! It takes events (applied ops, leadership gained or lost, subscribe,
//! credit, settle, removal committed, consumer gone, `tick`), each with the
//! time ([`Now`]). It reads stored messages through [`ShardContents`] and
//! hands deliveries to each consumer's [`ConsumerChannel`]; what needs the
//! runtime (discards to propose, metrics) waits in its [`Outbox`] for the
//! actor (`deliver/actor.rs`) to carry out. It has no tokio, no I/O of its
//! own and reads no clock, so its tests replay scripts of events.
//!
//! Files: `pump.rs` delivers to consumers with credit, `settle.rs` checks
//! acks and nacks against leases, `leadership.rs` rebuilds and drops a
//! shard's queues, `policies.rs` follows policy changes, `activity.rs`
//! reports counters, `queue.rs` is one queue's state.
//!
//! IMPLEMENTATION CAVEATS
//! - Leases live in memory: after a restart or a leadership change every
//!   unacked message is delivered again (attempt numbering starts over).
//! - TTL and attempts are checked when a message comes up for dispatch: an
//!   expired message waits on disk until then (no sweeper yet).
//! - A delayed message held back costs a heap entry until its time.

mod activity;
mod backlog;
mod contents;
mod leadership;
mod policies;
mod pump;
mod queue;
mod settle;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use floret_sched::SchedulerConfig;
use floret_store::{AppliedEvent, Discarded, ShardId};

pub use backlog::BACKLOG_REPORT_GAP;
pub use contents::{ReadError, ShardContents, StoredBacklog};
pub use queue::Tenancy;
use queue::{HeldMessage, LeaseKey, ProducerKey, QueueDispatch};

use super::owner::DeliveryNonces;
use super::{ConsumerEvent, ConsumerId, StreamOwner};
use crate::delivery_id::DeliveryId;

/// The time of an event, on both clocks the book needs: the monotonic one
/// for lease deadlines, the wall clock (ms since the Unix epoch) for message
/// ages and delivery times, which are stored as wall-clock.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// For lease deadlines.
    pub instant: Instant,
    /// For TTLs, delays and fairness windows.
    pub unix_ms: u64,
}

/// Where the book hands a consumer its deliveries and settle outcomes.
pub trait ConsumerChannel {
    /// Sends `event`; Err once the consumer's stream has closed.
    fn send(&self, event: ConsumerEvent) -> Result<(), ConsumerClosed>;
}

/// The consumer's stream has closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerClosed;

/// Messages of one shard to discard through raft (expired or out of
/// attempts); their leases end once that commits.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardDiscard {
    /// The shard that holds them.
    pub shard: ShardId,
    /// The deliveries whose leases the discard holds.
    pub ids: Vec<DeliveryId>,
    /// What to discard, and why.
    pub messages: Vec<Discarded>,
}

/// What the book decided that needs the runtime: taken by the actor after each event.
#[derive(Debug, Default)]
pub struct Outbox {
    /// Discards to propose.
    pub discards: Vec<ShardDiscard>,
    /// First deliveries handed to consumers: their queue, and how long
    /// each message waited from its commit, ms.
    pub first_deliveries: Vec<(Arc<str>, u64)>,
    /// Leases that lapsed.
    pub lease_expiries: u64,
}

struct Consumer<C> {
    queue: Arc<str>,
    credits: u64,
    channel: C,
    held: HashSet<LeaseKey>,
    /// A peer's stream feeding a consumer it merges (not counted as a consumer).
    for_peer: bool,
    /// The consumer's stream and tenant, which alone settle what it holds.
    owner: StreamOwner,
}

/// The node's delivery state; see the module doc.
pub struct DispatchBook<S, C> {
    shards: S,
    /// Per shard id: whether this node leads it now.
    led: Vec<bool>,
    queues: HashMap<Arc<str>, QueueDispatch>,
    consumers: HashMap<ConsumerId, Consumer<C>>,
    next_consumer: ConsumerId,
    scheduler_config: SchedulerConfig,
    /// How producers fall into tenants.
    tenancy: Tenancy,
    max_credits: u64,
    /// Delayed messages held back, earliest first.
    held: BinaryHeap<Reverse<HeldMessage>>,
    outbox: Outbox,
    /// When the next round of backlog reports may go out, after one went.
    backlog_report_due: Option<Instant>,
    /// The random parts of delivery ids.
    nonces: DeliveryNonces,
}

impl<S: ShardContents, C: ConsumerChannel> DispatchBook<S, C> {
    /// An empty book over `shards`; a consumer never holds more than `max_credits`.
    pub fn new(shards: S, scheduler_config: SchedulerConfig, max_credits: u32) -> Self {
        Self {
            led: vec![false; shards.shard_count()],
            shards,
            queues: HashMap::new(),
            consumers: HashMap::new(),
            next_consumer: 1,
            scheduler_config,
            tenancy: Tenancy::Anonymous,
            max_credits: u64::from(max_credits),
            held: BinaryHeap::new(),
            outbox: Outbox::default(),
            backlog_report_due: None,
            nonces: DeliveryNonces::random(),
        }
    }

    /// The book with its queues' producers falling into tenants as `tenancy` says.
    pub fn with_tenancy(mut self, tenancy: Tenancy) -> Self {
        self.tenancy = tenancy;
        self
    }

    /// What the book decided since the last call.
    pub fn take_outbox(&mut self) -> Outbox {
        std::mem::take(&mut self.outbox)
    }

    /// A state machine applied an op.
    pub fn applied(&mut self, event: AppliedEvent, now: Now) {
        match event {
            AppliedEvent::Enqueued {
                shard,
                queue,
                producer,
                sequences,
            } => {
                if self.leads(shard) {
                    let queue: Arc<str> = queue.into();
                    let key = ProducerKey::new(shard, &producer);
                    self.queue(&queue).scheduler.enqueued(&key, sequences);
                    self.pump(&queue, now);
                }
            }
            AppliedEvent::PolicyChanged {
                shard,
                queue,
                producer,
            } => self.policy_changed(shard, &queue.into(), producer.as_deref(), now),
            AppliedEvent::Dropped {
                shard,
                queue,
                producer,
                below,
            } => {
                if self.leads(shard)
                    && let Some(queue) = self.queues.get_mut(queue.as_str())
                {
                    queue
                        .scheduler
                        .drop_before(&ProducerKey::new(shard, &producer), below);
                }
            }
            AppliedEvent::Forgotten {
                shard,
                queue,
                producer,
            } => self.forget_producer(&queue, ProducerKey::new(shard, &producer)),
            AppliedEvent::Reset { shard } => {
                if self.leads(shard) {
                    tracing::warn!(
                        shard,
                        "state replaced by a snapshot while leading; rebuilding its queues"
                    );
                    self.forget_shard(shard);
                    self.rebuild_shard(shard, now);
                }
            }
        }
    }

    /// This node gained or lost the leadership of `shard`.
    pub fn leadership(&mut self, shard: ShardId, leader: bool, now: Now) {
        let Some(led) = self.led.get_mut(shard as usize) else {
            return;
        };
        if *led != leader {
            *led = leader;
            if leader {
                self.rebuild_shard(shard, now);
            } else {
                self.forget_shard(shard);
            }
        }
    }

    /// Registers a consumer stream on `queue` with its first credits;
    /// `for_peer` when it feeds another node's merged consumer; `owner` is
    /// the consumer's stream, which alone settles what it is delivered. Its
    /// first event is the queue's backlog report.
    pub fn subscribe(
        &mut self,
        queue: &str,
        credits: u32,
        channel: C,
        for_peer: bool,
        owner: StreamOwner,
        now: Now,
    ) -> ConsumerId {
        let id = self.next_consumer;
        self.next_consumer += 1;
        let queue: Arc<str> = queue.into();
        let _closed_stream_is_noticed_by_the_pump =
            channel.send(ConsumerEvent::Backlog(self.first_backlog_report(&queue)));
        self.consumers.insert(
            id,
            Consumer {
                queue: queue.clone(),
                credits: u64::from(credits).min(self.max_credits),
                channel,
                held: HashSet::new(),
                for_peer,
                owner,
            },
        );
        self.queue(&queue).consumers.push_back(id);
        self.pump(&queue, now);
        id
    }

    /// Grants a consumer `credits` more, or sets its unused credits to
    /// `credits` when `replace` (zero allowed), capped at the maximum.
    pub fn credit(&mut self, consumer: ConsumerId, credits: u32, replace: bool, now: Now) {
        if let Some(state) = self.consumers.get_mut(&consumer) {
            let base = if replace { 0 } else { state.credits };
            state.credits = (base + u64::from(credits)).min(self.max_credits);
            let queue = state.queue.clone();
            self.pump(&queue, now);
        }
    }

    /// The consumer's stream ended: what it held is delivered again.
    pub fn consumer_gone(&mut self, consumer_id: ConsumerId, now: Now) {
        let Some(consumer) = self.consumers.remove(&consumer_id) else {
            return;
        };
        let Some(queue) = self.queues.get_mut(&consumer.queue) else {
            return;
        };
        queue.consumers.retain(|&id| id != consumer_id);
        for lease in consumer.held {
            queue.holders.remove(&lease);
            let _expired_already =
                queue
                    .scheduler
                    .nack(&lease.producer, lease.sequence, lease.attempt);
        }
        self.pump(&consumer.queue, now);
        self.drop_if_idle(&consumer.queue);
    }

    /// Forgets `queue` once nothing refers to it: no consumer, no lease and
    /// a scheduler that holds nothing. Otherwise every subscribe to a new
    /// name would leave an entry that every turn walks, for good.
    fn drop_if_idle(&mut self, name: &str) {
        if self.queues.get(name).is_some_and(|queue| {
            queue.consumers.is_empty()
                && queue.holders.is_empty()
                && queue.scheduler.holds_nothing()
        }) {
            self.queues.remove(name);
        }
    }

    /// Queues the book keeps an entry for.
    #[cfg(test)]
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Expires lapsed leases and releases held messages whose time came.
    pub fn tick(&mut self, now: Now) {
        self.expire_leases(now);
        self.release_held(now);
    }

    /// When [`Self::tick`] (and [`Self::report_backlogs`]) must run next:
    /// the earliest lease deadline, held message's time or round of
    /// backlog reports.
    pub fn next_deadline(&self, now: Now) -> Option<Instant> {
        let leases = self
            .queues
            .values()
            .filter_map(|q| q.scheduler.next_deadline())
            .min();
        let held = self.held.peek().map(|Reverse(held)| {
            let wait_ms = (held.due_ms - now.unix_ms as i64).max(0) as u64;
            now.instant + Duration::from_millis(wait_ms)
        });
        leases
            .into_iter()
            .chain(held)
            .chain(self.backlog_report_due)
            .min()
    }

    fn leads(&self, shard: ShardId) -> bool {
        self.led.get(shard as usize).copied().unwrap_or(false)
    }

    fn queue(&mut self, queue: &Arc<str>) -> &mut QueueDispatch {
        let (config, tenancy) = (self.scheduler_config.clone(), self.tenancy);
        self.queues
            .entry(queue.clone())
            .or_insert_with(|| QueueDispatch::new(config, tenancy))
    }

    /// An idle producer's counters were deleted. A sweep forgets many
    /// producers, each with nothing stored, so almost never with a lease:
    /// only then are the holders and every consumer's leases walked.
    fn forget_producer(&mut self, name: &str, key: ProducerKey) {
        if let Some(queue) = self.queues.get_mut(name)
            && queue.scheduler.forget(&key) > 0
        {
            queue.holders.retain(|lease, _| lease.producer != key);
            for consumer in self.consumers.values_mut() {
                consumer.held.retain(|lease| lease.producer != key);
            }
        }
        self.drop_if_idle(name);
    }

    /// Makes the held messages whose time has come ready again (those of
    /// shards led since they were held; a rebuild holds the others anew).
    fn release_held(&mut self, now: Now) {
        let now_ms = now.unix_ms as i64;
        let mut touched = HashSet::new();
        while self
            .held
            .peek()
            .is_some_and(|Reverse(held)| held.due_ms <= now_ms)
        {
            let Some(Reverse(held)) = self.held.pop() else {
                break;
            };
            if self.leads(held.producer.shard)
                && let Some(queue) = self.queues.get_mut(&held.queue)
                && queue.scheduler.unhold(&held.producer, held.sequence)
            {
                touched.insert(held.queue);
            }
        }
        for queue in touched {
            self.pump(&queue, now);
        }
    }

    fn expire_leases(&mut self, now: Now) {
        let mut expired = Vec::new();
        for (name, queue) in &mut self.queues {
            let leases = queue.scheduler.expire_leases(now.instant);
            if !leases.is_empty() {
                self.outbox.lease_expiries += leases.len() as u64;
                expired.push((name.clone(), leases));
            }
        }
        for (queue, leases) in expired {
            for dispatch in leases {
                let lease = LeaseKey {
                    producer: dispatch.producer,
                    sequence: dispatch.sequence,
                    attempt: dispatch.attempt,
                };
                self.release_holder(&queue, &lease);
            }
            self.pump(&queue, now);
        }
    }
}
