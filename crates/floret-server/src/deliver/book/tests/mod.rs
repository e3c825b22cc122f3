//! Tests of the dispatch book: a harness that drives it over in-memory
//! shards with a clock the test moves, the scenario scripts in
//! `deliver/book/scripts/` (`scripts.rs`), properties over random event
//! sequences (`properties.rs`), and unit tests of single decisions (`unit.rs`).

mod properties;
mod scripts;
mod unit;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use floret_sched::SchedulerConfig;
use floret_store::policy::{Policy, PolicyTable};
use floret_store::records::StoredMessage;
use floret_store::{AppliedEvent, ShardId};

use super::{
    ConsumerChannel, ConsumerClosed, DispatchBook, Now, ReadError, ShardContents, ShardDiscard,
    StoredBacklog,
};
use crate::deliver::{
    ConsumerEvent, ConsumerId, SettleKind, SettleOutcome, SettledBy, StreamKey, StreamOwner,
};
use crate::delivery_id::{DeliveryId, DeliveryTicket};

/// The wall clock at the start of every test, ms since the Unix epoch.
const UNIX_START_MS: u64 = 1_800_000_000_000;

/// Lease timeout of the harness's schedulers.
const LEASE_TIMEOUT: Duration = Duration::from_secs(30);

/// Most credits a harness consumer may hold.
const MAX_CREDITS: u32 = 1_000;

/// One producer's stored messages in the fake shards.
#[derive(Default)]
struct StoredProducer {
    tail: u64,
    /// Live messages by sequence, with their delivery time if delayed.
    messages: BTreeMap<u64, (StoredMessage, Option<i64>)>,
}

#[derive(Default)]
struct FakeState {
    shard_count: usize,
    /// Keyed by (shard, queue, producer).
    producers: BTreeMap<(ShardId, String, String), StoredProducer>,
    policies: HashMap<ShardId, PolicyTable>,
}

/// Shards kept in maps, shared between the harness and the book.
#[derive(Clone, Default)]
pub(super) struct FakeShards(Rc<RefCell<FakeState>>);

impl ShardContents for FakeShards {
    fn holds(&self, shard: ShardId) -> bool {
        (shard as usize) < self.0.borrow().shard_count
    }

    fn shard_count(&self) -> usize {
        self.0.borrow().shard_count
    }

    fn message(
        &self,
        shard: ShardId,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Result<Option<StoredMessage>, ReadError> {
        let state = self.0.borrow();
        let key = (shard, queue.to_owned(), producer.to_owned());
        Ok(state
            .producers
            .get(&key)
            .and_then(|stored| stored.messages.get(&sequence))
            .map(|(message, _)| message.clone()))
    }

    fn deliver_at(
        &self,
        shard: ShardId,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Option<i64> {
        let state = self.0.borrow();
        let key = (shard, queue.to_owned(), producer.to_owned());
        state
            .producers
            .get(&key)
            .and_then(|stored| stored.messages.get(&sequence))
            .and_then(|(_, due)| *due)
    }

    fn policy(&self, shard: ShardId, queue: &str, producer: &str) -> Policy {
        self.policies(shard).effective(queue, producer)
    }

    fn stored_policy(&self, shard: ShardId, queue: &str, producer: Option<&str>) -> Policy {
        self.policies(shard).stored(queue, producer)
    }

    fn policies(&self, shard: ShardId) -> PolicyTable {
        let state = self.0.borrow();
        state.policies.get(&shard).cloned().unwrap_or_default()
    }

    fn producer_tail(
        &self,
        shard: ShardId,
        queue: &str,
        producer: &str,
    ) -> Result<Option<u64>, ReadError> {
        let state = self.0.borrow();
        let key = (shard, queue.to_owned(), producer.to_owned());
        Ok(state.producers.get(&key).map(|stored| stored.tail))
    }

    fn backlogs(&self, shard: ShardId) -> Result<Vec<StoredBacklog>, ReadError> {
        let state = self.0.borrow();
        Ok(state
            .producers
            .iter()
            .filter(|((of, _, _), _)| *of == shard)
            .filter_map(|((_, queue, producer), stored)| {
                let (&first, _) = stored.messages.first_key_value()?;
                Some(StoredBacklog {
                    queue: queue.clone(),
                    producer: producer.clone(),
                    sequences: first..stored.tail,
                })
            })
            .collect())
    }

    fn producers(&self, shard: ShardId) -> Vec<(String, String)> {
        let state = self.0.borrow();
        state
            .producers
            .keys()
            .filter(|(of, _, _)| *of == shard)
            .map(|(_, queue, producer)| (queue.clone(), producer.clone()))
            .collect()
    }
}

/// The random part of every delivery id the book gave out, so tests name
/// deliveries by what they are and settle them as their consumer would.
type IssuedNonces = Rc<RefCell<HashMap<DeliveryId, u64>>>;

/// A consumer stream that records what it is sent, until the test closes it.
#[derive(Clone)]
pub(super) struct Recorder {
    events: Rc<RefCell<Vec<ConsumerEvent>>>,
    closed: Rc<Cell<bool>>,
    issued: IssuedNonces,
}

impl ConsumerChannel for Recorder {
    fn send(&self, event: ConsumerEvent) -> Result<(), ConsumerClosed> {
        if self.closed.get() {
            return Err(ConsumerClosed);
        }
        if let ConsumerEvent::Delivery(delivered) = &event {
            self.issued
                .borrow_mut()
                .insert(delivered.ticket.id.clone(), delivered.ticket.nonce);
        }
        self.events.borrow_mut().push(event);
        Ok(())
    }
}

/// The tenant the harness's consumers belong to unless a test says otherwise.
pub(super) const TENANT: &str = "tenant";

/// Consumer `stream`'s owner: stream key `stream` of `tenant`.
pub(super) fn owner(tenant: &str, stream: u128) -> StreamOwner {
    StreamOwner {
        tenant: tenant.into(),
        stream: StreamKey(stream),
    }
}

/// The book over fake shards, its consumers' recorders, and a clock.
pub(super) struct Harness {
    pub book: DispatchBook<FakeShards, Recorder>,
    shards: FakeShards,
    pub recorders: BTreeMap<ConsumerId, Recorder>,
    start: Instant,
    pub elapsed: Duration,
    /// Discards the book decided and the test has not committed yet.
    pub pending_discards: Vec<ShardDiscard>,
    /// First deliveries the book reported: queue, and wait from commit in ms.
    pub first_deliveries: Vec<(String, u64)>,
    /// The random part of each delivery id handed out.
    issued: IssuedNonces,
    /// Stream keys given to consumers so far.
    streams: u128,
}

impl Harness {
    /// A book over `shard_count` shards, none led yet.
    pub fn new(shard_count: usize) -> Self {
        let shards = FakeShards::default();
        shards.0.borrow_mut().shard_count = shard_count;
        let config = SchedulerConfig {
            default_weight: 1,
            lease_timeout: LEASE_TIMEOUT,
        };
        Self {
            book: DispatchBook::new(shards.clone(), config, MAX_CREDITS),
            shards,
            recorders: BTreeMap::new(),
            start: Instant::now(),
            elapsed: Duration::ZERO,
            pending_discards: Vec::new(),
            first_deliveries: Vec::new(),
            issued: IssuedNonces::default(),
            streams: 0,
        }
    }

    /// A book over `shard_count` shards whose producers `tenant/name` fall
    /// into tenants, as with token keys.
    pub fn namespaced(shard_count: usize) -> Self {
        let mut harness = Self::new(shard_count);
        let shards = harness.shards.clone();
        let config = SchedulerConfig {
            default_weight: 1,
            lease_timeout: LEASE_TIMEOUT,
        };
        harness.book =
            DispatchBook::new(shards, config, MAX_CREDITS).with_tenancy(super::Tenancy::Namespaced);
        harness
    }

    pub fn now(&self) -> Now {
        Now {
            instant: self.start + self.elapsed,
            unix_ms: UNIX_START_MS + self.elapsed.as_millis() as u64,
        }
    }

    /// Moves the clock and lets the book expire leases and release held messages.
    pub fn advance(&mut self, by: Duration) {
        self.elapsed += by;
        let now = self.now();
        self.book.tick(now);
        self.collect_outbox();
    }

    /// Stores `count` messages of `producer` on `shard` (delayed by
    /// `delay_ms` if set) and tells the book they were applied.
    pub fn produce(
        &mut self,
        shard: ShardId,
        queue: &str,
        producer: &str,
        count: u64,
        delay_ms: Option<u64>,
    ) {
        let now = self.now();
        let sequences = {
            let mut state = self.shards.0.borrow_mut();
            let key = (shard, queue.to_owned(), producer.to_owned());
            let stored = state.producers.entry(key).or_default();
            let first = stored.tail;
            for sequence in first..first + count {
                let message = StoredMessage {
                    payload: format!("{producer}-{sequence}").into_bytes(),
                    headers: BTreeMap::new(),
                    enqueued_at_ms: now.unix_ms as i64,
                };
                let due = delay_ms.map(|delay| (now.unix_ms + delay) as i64);
                stored.messages.insert(sequence, (message, due));
            }
            stored.tail = first + count;
            first..first + count
        };
        let event = AppliedEvent::Enqueued {
            shard,
            queue: queue.to_owned(),
            producer: producer.to_owned(),
            sequences,
        };
        self.book.applied(event, now);
        self.collect_outbox();
    }

    /// Stores `policy` for `queue` (`producer` None) or one producer and applies the change.
    pub fn set_policy(
        &mut self,
        shard: ShardId,
        queue: &str,
        producer: Option<&str>,
        policy: Policy,
    ) {
        let now = self.now();
        {
            let mut state = self.shards.0.borrow_mut();
            let policies = state.policies.entry(shard).or_default();
            policies.set(queue, producer, policy);
        }
        let event = AppliedEvent::PolicyChanged {
            shard,
            queue: queue.to_owned(),
            producer: producer.map(str::to_owned),
        };
        self.book.applied(event, now);
        self.collect_outbox();
    }

    pub fn leadership(&mut self, shard: ShardId, leader: bool) {
        let now = self.now();
        self.book.leadership(shard, leader, now);
        self.collect_outbox();
    }

    /// Subscribes a consumer of [`TENANT`] on a stream of its own.
    pub fn subscribe(&mut self, queue: &str, credits: u32) -> ConsumerId {
        self.streams += 1;
        self.subscribe_as(queue, credits, owner(TENANT, self.streams))
    }

    pub fn subscribe_as(&mut self, queue: &str, credits: u32, owner: StreamOwner) -> ConsumerId {
        let recorder = Recorder {
            events: Rc::default(),
            closed: Rc::default(),
            issued: self.issued.clone(),
        };
        let now = self.now();
        let id = self
            .book
            .subscribe(queue, credits, recorder.clone(), false, owner, now);
        self.recorders.insert(id, recorder);
        self.collect_outbox();
        id
    }

    pub fn credit(&mut self, consumer: ConsumerId, credits: u32, replace: bool) {
        let now = self.now();
        self.book.credit(consumer, credits, replace, now);
        self.collect_outbox();
    }

    /// The consumer's stream closes: sends to it fail from now on.
    pub fn close(&mut self, consumer: ConsumerId) {
        if let Some(recorder) = self.recorders.get(&consumer) {
            recorder.closed.set(true);
        }
    }

    /// The consumer's stream ended and the node noticed.
    pub fn gone(&mut self, consumer: ConsumerId) {
        self.close(consumer);
        let now = self.now();
        self.book.consumer_gone(consumer, now);
        self.collect_outbox();
    }

    /// Settles `id`; an accepted ack or dead-lettering is committed at once
    /// when `commit` (the message leaves the store, then the lease ends).
    /// Settles `id` as [`TENANT`] through the unary `Ack`, under the id the
    /// book gave out for it (or, for a delivery never made, a made-up one).
    pub fn settle(&mut self, kind: SettleKind, id: &DeliveryId, commit: bool) -> SettleOutcome {
        let ticket = self.ticket(id);
        self.settle_as(kind, ticket, &SettledBy::Tenant(TENANT.into()), commit)
    }

    /// The id the book gave out for delivery `id` (nonce 0 if it never did).
    pub fn ticket(&self, id: &DeliveryId) -> DeliveryTicket {
        DeliveryTicket {
            id: id.clone(),
            nonce: self.issued.borrow().get(id).copied().unwrap_or_default(),
        }
    }

    /// Settles `ticket` on behalf of `by`; with `commit`, an accepted
    /// removal commits at once.
    pub fn settle_as(
        &mut self,
        kind: SettleKind,
        ticket: DeliveryTicket,
        by: &SettledBy,
        commit: bool,
    ) -> SettleOutcome {
        let now = self.now();
        let mut outcomes = self.book.settle(kind, vec![Ok(ticket)], by, now);
        let outcome = outcomes.pop().expect("one outcome per id");
        if commit && let Some(removal) = &outcome.removal {
            self.remove_stored(removal);
            let now = self.now();
            self.book.removal_committed(
                std::slice::from_ref(removal),
                kind == SettleKind::Ack,
                now,
            );
            self.collect_outbox();
        }
        self.collect_outbox();
        outcome
    }

    /// Commits every pending discard: the messages leave the store, the leases end.
    pub fn commit_discards(&mut self) -> usize {
        let discards = std::mem::take(&mut self.pending_discards);
        let mut committed = 0;
        for discard in discards {
            for id in &discard.ids {
                self.remove_stored(id);
            }
            committed += discard.ids.len();
            let now = self.now();
            self.book.removal_committed(&discard.ids, false, now);
            self.collect_outbox();
        }
        committed
    }

    /// Deliveries each consumer received since the last call, in order.
    pub fn take_deliveries(&mut self) -> Vec<(ConsumerId, DeliveryId)> {
        self.take_events()
            .into_iter()
            .filter_map(|(consumer, event)| match event {
                ConsumerEvent::Delivery(delivered) => Some((consumer, delivered.ticket.id)),
                _ => None,
            })
            .collect()
    }

    /// Everything each consumer received since the last call, in order.
    pub fn take_events(&mut self) -> Vec<(ConsumerId, ConsumerEvent)> {
        let mut events = Vec::new();
        for (&consumer, recorder) in &self.recorders {
            events.extend(
                recorder
                    .events
                    .borrow_mut()
                    .drain(..)
                    .map(|event| (consumer, event)),
            );
        }
        events
    }

    /// Whether the store still holds the message.
    pub fn stored(&self, shard: ShardId, queue: &str, producer: &str, sequence: u64) -> bool {
        matches!(
            self.shards.message(shard, queue, producer, sequence),
            Ok(Some(_))
        )
    }

    /// Messages the store still holds, over every shard.
    pub fn stored_count(&self) -> usize {
        let state = self.shards.0.borrow();
        state.producers.values().map(|p| p.messages.len()).sum()
    }

    fn remove_stored(&mut self, id: &DeliveryId) {
        let mut state = self.shards.0.borrow_mut();
        let key = (id.shard, id.queue.clone(), id.producer.clone());
        if let Some(stored) = state.producers.get_mut(&key) {
            stored.messages.remove(&id.sequence);
        }
    }

    /// What the actor does after every turn: backlog reports, then the outbox.
    fn collect_outbox(&mut self) {
        let now = self.now();
        self.book.report_backlogs(now);
        let outbox = self.book.take_outbox();
        self.pending_discards.extend(outbox.discards);
        self.first_deliveries.extend(
            outbox
                .first_deliveries
                .into_iter()
                .map(|(queue, dwell_ms)| (queue.to_string(), dwell_ms)),
        );
    }
}
