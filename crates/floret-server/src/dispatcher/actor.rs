//! The dispatcher task: applies commands to the queues and pumps deliveries
//! to consumers with credit. Settling lives in `settle.rs`, leadership
//! changes in `leadership.rs`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use floret_sched::SchedulerConfig;
use floret_store::policy::{Expiry, Policy};
use floret_store::records::StoredMessage;
use floret_store::{
    AppliedEvent, DeadLetterReason, Discard, Discarded, MessageRef, Op, ShardId, ShardReader,
};
use tokio::sync::mpsc;

use super::queue::{HeldMessage, LeaseKey, ProducerKey, QueueDispatch};
use super::{
    ConsumerEvent, ConsumerId, Delivered, DispatcherCommand, DispatcherHandle, ProducerActivity,
    QueueActivity,
};
use crate::delivery_id::DeliveryId;
use crate::policy;
use crate::proposer::Proposers;

mod leadership;
mod settle;

/// Messages one pump discards (expired, out of attempts) before it stops;
/// the commit of their discard pumps again. Keeps a discard's raft entry
/// small when a long outage let a whole backlog expire.
const DISCARDS_PER_PUMP: usize = 1_000;

/// Commands handled in one go before the loop checks its lease timer again.
const COMMANDS_PER_TURN: usize = 256;

struct Consumer {
    queue: Arc<str>,
    credits: u64,
    events: mpsc::UnboundedSender<ConsumerEvent>,
    held: HashSet<LeaseKey>,
    /// A peer's stream feeding a consumer it merges (not counted as a consumer).
    for_peer: bool,
}

struct Dispatcher {
    readers: Vec<Option<ShardReader>>,
    /// Proposers of the shards this node holds, to discard messages.
    proposers: Proposers,
    /// This task's own handle, for what its spawned proposals report.
    handle: DispatcherHandle,
    led: Vec<bool>,
    queues: HashMap<Arc<str>, QueueDispatch>,
    consumers: HashMap<ConsumerId, Consumer>,
    next_consumer: ConsumerId,
    scheduler_config: SchedulerConfig,
    max_credits: u64,
    /// Delayed messages held back, earliest first.
    held: BinaryHeap<Reverse<HeldMessage>>,
}

/// Commands waiting for the dispatcher task, before it is spawned.
pub(crate) struct DispatcherInbox(mpsc::UnboundedReceiver<DispatcherCommand>);

/// The dispatcher's handle and inbox: the handle works (commands queue up)
/// before the task exists, so state machines can report from their first apply.
pub(crate) fn channel() -> (DispatcherHandle, DispatcherInbox) {
    let (commands, receiver) = mpsc::unbounded_channel();
    (DispatcherHandle { commands }, DispatcherInbox(receiver))
}

/// Starts the dispatcher task over the shards' readers (indexed by shard
/// id; None for a shard this node holds no replica of).
pub(crate) fn spawn(
    (handle, inbox): (DispatcherHandle, DispatcherInbox),
    readers: Vec<Option<ShardReader>>,
    proposers: Proposers,
    scheduler_config: SchedulerConfig,
    max_credits: u32,
) {
    let dispatcher = Dispatcher {
        proposers,
        handle,
        led: vec![false; readers.len()],
        readers,
        queues: HashMap::new(),
        consumers: HashMap::new(),
        next_consumer: 1,
        scheduler_config,
        max_credits: u64::from(max_credits),
        held: BinaryHeap::new(),
    };
    tokio::spawn(dispatcher.run(inbox.0));
}

impl Dispatcher {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<DispatcherCommand>) {
        loop {
            let deadline = self.next_deadline();
            tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { break };
                    self.handle(command);
                    for _ in 1..COMMANDS_PER_TURN {
                        match commands.try_recv() {
                            Ok(command) => self.handle(command),
                            Err(_) => break,
                        }
                    }
                }
                () = sleep_until(deadline), if deadline.is_some() => {
                    self.expire_leases();
                    self.release_held();
                }
            }
        }
        tracing::debug!("dispatcher stopped");
    }

    fn handle(&mut self, command: DispatcherCommand) {
        match command {
            DispatcherCommand::Applied(AppliedEvent::Enqueued {
                shard,
                queue,
                producer,
                sequences,
            }) => {
                if self.led[shard as usize] {
                    let queue: Arc<str> = queue.into();
                    let key = ProducerKey {
                        shard,
                        producer: producer.into(),
                    };
                    self.queue(&queue).scheduler.enqueued(&key, sequences);
                    self.pump(&queue);
                }
            }
            DispatcherCommand::Applied(AppliedEvent::PolicyChanged {
                shard,
                queue,
                producer,
            }) => self.policy_changed(shard, &queue.into(), producer.as_deref()),
            DispatcherCommand::Applied(AppliedEvent::Dropped {
                shard,
                queue,
                producer,
                below,
            }) => {
                if self.led[shard as usize]
                    && let Some(queue) = self.queues.get_mut(queue.as_str())
                {
                    let key = ProducerKey {
                        shard,
                        producer: producer.into(),
                    };
                    queue.scheduler.drop_before(&key, below);
                }
            }
            DispatcherCommand::Applied(AppliedEvent::Forgotten {
                shard,
                queue,
                producer,
            }) => {
                if let Some(queue) = self.queues.get_mut(queue.as_str()) {
                    let key = ProducerKey {
                        shard,
                        producer: producer.into(),
                    };
                    // A sweep forgets many producers, each with nothing
                    // stored, so almost never with a lease: only then are
                    // the holders and every consumer's leases walked.
                    if queue.scheduler.forget(&key) > 0 {
                        queue.holders.retain(|lease, _| lease.producer != key);
                        for consumer in self.consumers.values_mut() {
                            consumer.held.retain(|lease| lease.producer != key);
                        }
                    }
                }
            }
            DispatcherCommand::Applied(AppliedEvent::Reset { shard }) => {
                if self.led[shard as usize] {
                    tracing::warn!(
                        shard,
                        "state replaced by a snapshot while leading; rebuilding its queues"
                    );
                    self.forget_shard(shard);
                    self.rebuild_shard(shard);
                }
            }
            DispatcherCommand::Leadership { shard, leader } => {
                if self.led[shard as usize] != leader {
                    self.led[shard as usize] = leader;
                    if leader {
                        self.rebuild_shard(shard);
                    } else {
                        self.forget_shard(shard);
                    }
                }
            }
            DispatcherCommand::Subscribe {
                queue,
                credits,
                events,
                for_peer,
                reply,
            } => {
                let id = self.next_consumer;
                self.next_consumer += 1;
                let queue: Arc<str> = queue.into();
                self.consumers.insert(
                    id,
                    Consumer {
                        queue: queue.clone(),
                        credits: u64::from(credits).min(self.max_credits),
                        events,
                        held: HashSet::new(),
                        for_peer,
                    },
                );
                self.queue(&queue).consumers.push_back(id);
                let _caller_gone = reply.send(id);
                self.pump(&queue);
            }
            DispatcherCommand::Credit {
                consumer,
                credits,
                replace,
            } => {
                if let Some(state) = self.consumers.get_mut(&consumer) {
                    let base = if replace { 0 } else { state.credits };
                    state.credits = (base + u64::from(credits)).min(self.max_credits);
                    let queue = state.queue.clone();
                    self.pump(&queue);
                }
            }
            DispatcherCommand::Settle { kind, ids, reply } => {
                let outcomes = ids.into_iter().map(|id| self.settle(kind, id)).collect();
                let _caller_gone = reply.send(outcomes);
            }
            DispatcherCommand::RemovalCommitted { ids, acked } => {
                for id in &ids {
                    self.removal_committed(id, acked);
                }
                if !acked {
                    let queues: HashSet<Arc<str>> =
                        ids.iter().map(|id| id.queue.as_str().into()).collect();
                    for queue in queues {
                        self.pump(&queue);
                    }
                }
            }
            DispatcherCommand::ConsumerGone { consumer } => self.remove_consumer(consumer),
            DispatcherCommand::Activity {
                with_producers,
                reply,
            } => {
                let _caller_gone = reply.send(self.activity(with_producers));
            }
        }
    }

    fn queue(&mut self, queue: &Arc<str>) -> &mut QueueDispatch {
        let config = self.scheduler_config.clone();
        self.queues
            .entry(queue.clone())
            .or_insert_with(|| QueueDispatch::new(config))
    }

    /// Delivers to consumers with credit while the queue has ready
    /// messages; messages its policy says not to deliver (expired, out of
    /// attempts) are discarded instead.
    fn pump(&mut self, queue_name: &Arc<str>) {
        let Some(queue) = self.queues.get_mut(queue_name) else {
            return;
        };
        let now = Instant::now();
        let mut discards: BTreeMap<ShardId, Vec<(DeliveryId, Discarded)>> = BTreeMap::new();
        let mut discarding = 0;
        loop {
            let consumers = &self.consumers;
            let Some(consumer_id) =
                queue.consumer_with_credit(|id| consumers.get(&id).is_some_and(|c| c.credits > 0))
            else {
                break;
            };
            let Some(dispatch) = queue.scheduler.next(now) else {
                break;
            };
            let key = dispatch.producer;
            let Some(reader) = &self.readers[key.shard as usize] else {
                continue;
            };
            let message = match reader.message(queue_name, &key.producer, dispatch.sequence) {
                Ok(Some(message)) => message,
                Ok(None) => {
                    let _already_settled =
                        queue
                            .scheduler
                            .ack(&key, dispatch.sequence, dispatch.attempt);
                    continue;
                }
                Err(error) => {
                    tracing::error!(shard = key.shard, %error, "cannot read a message to dispatch");
                    let _ = queue
                        .scheduler
                        .nack(&key, dispatch.sequence, dispatch.attempt);
                    break;
                }
            };
            let id = DeliveryId {
                shard: key.shard,
                queue: queue_name.to_string(),
                producer: key.producer.to_string(),
                sequence: dispatch.sequence,
                attempt: dispatch.attempt,
            };
            let now_ms = unix_ms();
            if let Some(due_ms) = reader.deliver_at(queue_name, &key.producer, dispatch.sequence)
                && due_ms > now_ms as i64
            {
                let _lease_is_ours =
                    queue
                        .scheduler
                        .hold(&key, dispatch.sequence, dispatch.attempt);
                self.held.push(Reverse(HeldMessage {
                    due_ms,
                    queue: queue_name.clone(),
                    producer: key,
                    sequence: dispatch.sequence,
                }));
                continue;
            }
            let policy = reader.policy(queue_name, &key.producer);
            if let Some(discarded) = discard_instead(&policy, &id, &message, now_ms) {
                discards.entry(key.shard).or_default().push((id, discarded));
                discarding += 1;
                if discarding >= DISCARDS_PER_PUMP {
                    break;
                }
                continue;
            }
            let lease = LeaseKey {
                producer: key.clone(),
                sequence: dispatch.sequence,
                attempt: dispatch.attempt,
            };
            let consumer = self
                .consumers
                .get_mut(&consumer_id)
                .expect("chosen among live consumers");
            let dwell_ms = (dispatch.attempt == 1)
                .then(|| now_ms.saturating_sub(message.enqueued_at_ms.max(0) as u64));
            if consumer
                .events
                .send(ConsumerEvent::Delivery(Box::new(Delivered { id, message })))
                .is_err()
            {
                let _ = queue
                    .scheduler
                    .nack(&key, dispatch.sequence, dispatch.attempt);
                queue.consumers.pop_front();
                continue;
            }
            consumer.credits -= 1;
            consumer.held.insert(lease.clone());
            queue.holders.insert(lease, consumer_id);
            queue.delivered += 1;
            queue.fairness.delivered(&key, now_ms / 1_000, dwell_ms);
            if dispatch.attempt > 1 {
                queue.redelivered += 1;
            }
            queue.consumers.rotate_left(1);
            metrics::counter!("floret_deliveries_total").increment(1);
        }
        for (shard, discarded) in discards {
            self.discard(shard, discarded);
        }
    }

    /// Commits the discard of messages whose leases this dispatcher holds;
    /// the leases end once it commits. If it does not, they lapse and the
    /// messages come up (and are discarded) again.
    fn discard(&self, shard: ShardId, discarded: Vec<(DeliveryId, Discarded)>) {
        let Some(proposer) = self.proposers.get(shard).cloned() else {
            return;
        };
        metrics::counter!("floret_discarded_total").increment(discarded.len() as u64);
        let (ids, messages): (Vec<_>, Vec<_>) = discarded.into_iter().unzip();
        let handle = self.handle.clone();
        tokio::spawn(async move {
            let op = Op::Discard(Discard {
                at_ms: unix_ms() as i64,
                messages,
            });
            match proposer.propose(op).await {
                Ok(_) => handle.removal_committed(ids, false),
                Err(error) => tracing::warn!(
                    shard,
                    %error,
                    "could not discard expired or exhausted messages; they come back when their leases lapse"
                ),
            }
        });
    }

    /// A queue's defaults or a producer's override changed in `shard`: the
    /// scheduler takes the producers' new weights, tiers and limits. A
    /// queue-wide change arrives once from every shard; each time only that
    /// shard's overrides are resolved again (against its own, now updated,
    /// defaults), and the defaults are set once.
    fn policy_changed(&mut self, shard: ShardId, queue: &Arc<str>, producer: Option<&str>) {
        let Some(reader) = self.readers[shard as usize].clone() else {
            return;
        };
        match producer {
            None => {
                let defaults = policy::scheduling(reader.stored_policy(queue, None));
                let scheduler = &mut self.queue(queue).scheduler;
                if scheduler.defaults() != defaults {
                    scheduler.set_defaults(defaults);
                }
                if self.led[shard as usize] {
                    self.apply_overrides(shard, queue);
                }
            }
            Some(producer) if self.led[shard as usize] => {
                let key = ProducerKey {
                    shard,
                    producer: producer.into(),
                };
                let stored = reader.stored_policy(queue, Some(producer));
                let scheduling = (!stored.is_empty())
                    .then(|| policy::scheduling(reader.policy(queue, producer)));
                self.queue(queue).scheduler.set_policy(&key, scheduling);
            }
            Some(_) => return,
        }
        self.pump(queue);
    }

    /// Gives the scheduler of `queue` the overrides of `shard`'s producers.
    fn apply_overrides(&mut self, shard: ShardId, queue: &Arc<str>) {
        let Some(reader) = self.readers[shard as usize].clone() else {
            return;
        };
        let policies = reader.policies();
        let scheduler = &mut self.queue(queue).scheduler;
        for producer in policies.overridden(queue) {
            let key = ProducerKey {
                shard,
                producer: producer.into(),
            };
            let policy = policies.effective(queue, producer);
            scheduler.set_policy(&key, Some(policy::scheduling(policy)));
        }
    }

    fn remove_consumer(&mut self, consumer_id: ConsumerId) {
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
        self.pump(&consumer.queue);
    }

    /// When the timer must wake: the earliest lease deadline or held message's time.
    fn next_deadline(&self) -> Option<Instant> {
        let leases = self
            .queues
            .values()
            .filter_map(|q| q.scheduler.next_deadline())
            .min();
        let held = self.held.peek().map(|Reverse(held)| {
            let wait_ms = (held.due_ms - unix_ms() as i64).max(0) as u64;
            Instant::now() + std::time::Duration::from_millis(wait_ms)
        });
        leases.into_iter().chain(held).min()
    }

    /// Makes the held messages whose time has come ready again (those of
    /// shards led since they were held; a rebuild holds the others anew).
    fn release_held(&mut self) {
        let now_ms = unix_ms() as i64;
        let mut touched = HashSet::new();
        while self
            .held
            .peek()
            .is_some_and(|Reverse(held)| held.due_ms <= now_ms)
        {
            let Some(Reverse(held)) = self.held.pop() else {
                break;
            };
            if self.led[held.producer.shard as usize]
                && let Some(queue) = self.queues.get_mut(&held.queue)
                && queue.scheduler.unhold(&held.producer, held.sequence)
            {
                touched.insert(held.queue);
            }
        }
        for queue in touched {
            self.pump(&queue);
        }
    }

    fn expire_leases(&mut self) {
        let now = Instant::now();
        let mut expired = Vec::new();
        for (name, queue) in &mut self.queues {
            let leases = queue.scheduler.expire_leases(now);
            if !leases.is_empty() {
                metrics::counter!("floret_lease_expiries_total").increment(leases.len() as u64);
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
            self.pump(&queue);
        }
    }

    fn activity(&mut self, with_producers: bool) -> HashMap<String, QueueActivity> {
        let now_second = unix_ms() / 1_000;
        self.queues
            .iter_mut()
            .map(|(name, queue)| {
                let producers = if with_producers {
                    queue
                        .fairness
                        .figures(now_second)
                        .into_iter()
                        .map(|(key, fairness)| {
                            let view = queue.scheduler.producer(&key);
                            let activity = ProducerActivity {
                                fairness,
                                weight: view.map_or(1, |v| v.weight),
                                deficit: view.map_or(0, |v| v.deficit),
                                ready: view.map_or(0, |v| v.ready),
                            };
                            (key.producer.to_string(), activity)
                        })
                        .collect()
                } else {
                    HashMap::new()
                };
                let mut in_flight_by_producer: HashMap<String, u64> = HashMap::new();
                for lease in queue.holders.keys() {
                    *in_flight_by_producer
                        .entry(lease.producer.producer.to_string())
                        .or_default() += 1;
                }
                let activity = QueueActivity {
                    in_flight: queue.scheduler.in_flight(),
                    ready: queue.scheduler.ready_messages(),
                    backlogged_producers: queue.scheduler.backlogged_producers() as u64,
                    backlogged_weight: queue.scheduler.backlogged_weight(),
                    delivered: queue.delivered,
                    acked: queue.acked,
                    redelivered: queue.redelivered,
                    in_flight_by_producer,
                    consumers: queue
                        .consumers
                        .iter()
                        .filter(|id| self.consumers.get(id).is_some_and(|c| !c.for_peer))
                        .count() as u64,
                    producers,
                };
                (name.to_string(), activity)
            })
            .collect()
    }
}

/// Whether `message`, coming up for delivery `id`, must be discarded
/// instead: its TTL passed, or it had `max_attempts` deliveries.
fn discard_instead(
    policy: &Policy,
    id: &DeliveryId,
    message: &StoredMessage,
    now_ms: u64,
) -> Option<Discarded> {
    let expired = policy
        .ttl_ms
        .is_some_and(|ttl| now_ms > (message.enqueued_at_ms.max(0) as u64).saturating_add(ttl));
    let exhausted = policy.max_attempts.is_some_and(|max| id.attempt > max);
    let (reason, dead_letter) = if exhausted {
        (DeadLetterReason::MaxAttempts, true)
    } else if expired {
        (
            DeadLetterReason::Expired,
            policy.expiry.unwrap_or_default() == Expiry::DeadLetter,
        )
    } else {
        return None;
    };
    Some(Discarded {
        message: MessageRef {
            queue: id.queue.clone(),
            producer: id.producer.clone(),
            sequence: id.sequence,
        },
        reason,
        attempts: id.attempt - 1,
        dead_letter,
    })
}

/// Wall-clock milliseconds since the Unix epoch (commit times are wall-clock too).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}
