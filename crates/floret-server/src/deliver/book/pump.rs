//! Delivering: while a queue has ready messages and a consumer with credit,
//! the scheduler picks the next message, the book reads it, and either holds
//! it back (delayed), discards it (past its TTL or its attempts) or hands it
//! to the consumer under a lease.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;

use floret_sched::Dispatch;
use floret_store::policy::{Expiry, Policy};
use floret_store::records::StoredMessage;
use floret_store::{DeadLetterReason, Discarded, MessageRef, ShardId};

use super::queue::{HeldMessage, LeaseHolder, LeaseKey, ProducerKey};
use super::{ConsumerChannel, DispatchBook, Now, ShardContents, ShardDiscard};
use crate::deliver::{ConsumerEvent, ConsumerId, Delivered};
use crate::delivery_id::{DeliveryId, DeliveryTicket};

/// Messages one pump discards (expired, out of attempts) before it stops;
/// the commit of their discard pumps again. Keeps a discard's raft entry
/// small when a long outage let a whole backlog expire.
pub(super) const DISCARDS_PER_PUMP: usize = 1_000;

/// What became of one message the scheduler picked.
enum Picked {
    /// Handed to the consumer.
    Delivered,
    /// Not delivered now (gone, held back, or the consumer closed); go on.
    Skipped,
    /// To be discarded instead of delivered.
    Discard(DeliveryId, Discarded),
    /// The shard cannot be read: stop this pump.
    Stop,
}

impl<S: ShardContents, C: ConsumerChannel> DispatchBook<S, C> {
    /// Delivers to consumers with credit while the queue has ready
    /// messages; messages its policy says not to deliver (expired, out of
    /// attempts) are put in the outbox to discard instead.
    pub(super) fn pump(&mut self, queue_name: &Arc<str>, now: Now) {
        let mut discards: BTreeMap<ShardId, ShardDiscard> = BTreeMap::new();
        let mut discarding = 0;
        loop {
            let Some(queue) = self.queues.get_mut(queue_name) else {
                return;
            };
            let consumers = &self.consumers;
            let Some(consumer) =
                queue.consumer_with_credit(|id| consumers.get(&id).is_some_and(|c| c.credits > 0))
            else {
                break;
            };
            let Some(dispatch) = queue.scheduler.next(now.instant) else {
                break;
            };
            match self.pick(queue_name, consumer, dispatch, now) {
                Picked::Delivered | Picked::Skipped => {}
                Picked::Discard(id, discarded) => {
                    let shard = discards.entry(id.shard).or_insert_with(|| ShardDiscard {
                        shard: id.shard,
                        ids: Vec::new(),
                        messages: Vec::new(),
                    });
                    shard.ids.push(id);
                    shard.messages.push(discarded);
                    discarding += 1;
                    if discarding >= DISCARDS_PER_PUMP {
                        break;
                    }
                }
                Picked::Stop => break,
            }
        }
        self.outbox.discards.extend(discards.into_values());
    }

    /// Decides what to do with the message `dispatch` names, leased to the
    /// book by the scheduler, for `consumer`.
    fn pick(
        &mut self,
        queue_name: &Arc<str>,
        consumer: ConsumerId,
        dispatch: Dispatch<ProducerKey>,
        now: Now,
    ) -> Picked {
        let queue = self.queues.get_mut(queue_name).expect("pumped queue");
        let Dispatch {
            producer: key,
            sequence,
            attempt,
        } = dispatch;
        if !self.shards.holds(key.shard) {
            return Picked::Skipped;
        }
        let message = match self
            .shards
            .message(key.shard, queue_name, &key.producer, sequence)
        {
            Ok(Some(message)) => message,
            Ok(None) => {
                let _already_settled = queue.scheduler.ack(&key, sequence, attempt);
                return Picked::Skipped;
            }
            Err(error) => {
                tracing::error!(shard = key.shard, %error, "cannot read a message to dispatch");
                let _ = queue.scheduler.nack(&key, sequence, attempt);
                return Picked::Stop;
            }
        };
        if let Some(due_ms) = self
            .shards
            .deliver_at(key.shard, queue_name, &key.producer, sequence)
            && due_ms > now.unix_ms as i64
        {
            let _lease_is_ours = queue.scheduler.hold(&key, sequence, attempt);
            self.held.push(Reverse(HeldMessage {
                due_ms,
                queue: queue_name.clone(),
                producer: key,
                sequence,
            }));
            return Picked::Skipped;
        }
        let id = DeliveryId {
            shard: key.shard,
            queue: queue_name.to_string(),
            producer: key.producer.to_string(),
            sequence,
            attempt,
        };
        let policy = self.shards.policy(key.shard, queue_name, &key.producer);
        if let Some(discarded) = discard_instead(&policy, &id, &message, now.unix_ms) {
            return Picked::Discard(id, discarded);
        }
        let lease = LeaseKey {
            producer: key,
            sequence,
            attempt,
        };
        self.hand_over(queue_name, consumer, lease, id, message, now)
    }

    /// Sends delivery `id` of `message` to `consumer`, under an id with a
    /// fresh random part, and records its `lease`; a consumer whose stream
    /// closed leaves the ring and the message goes back.
    fn hand_over(
        &mut self,
        queue_name: &Arc<str>,
        consumer_id: ConsumerId,
        lease: LeaseKey,
        id: DeliveryId,
        message: StoredMessage,
        now: Now,
    ) -> Picked {
        let nonce = self.nonces.draw();
        let delivered = Delivered {
            ticket: DeliveryTicket { id, nonce },
            message,
        };
        let queue = self.queues.get_mut(queue_name).expect("pumped queue");
        let consumer = self
            .consumers
            .get_mut(&consumer_id)
            .expect("chosen among live consumers");
        let enqueued_at_ms = delivered.message.enqueued_at_ms.max(0) as u64;
        let dwell_ms = (lease.attempt == 1).then(|| now.unix_ms.saturating_sub(enqueued_at_ms));
        let delivery = ConsumerEvent::Delivery(Box::new(delivered));
        if consumer.channel.send(delivery).is_err() {
            let _ = queue
                .scheduler
                .nack(&lease.producer, lease.sequence, lease.attempt);
            queue.consumers.pop_front();
            return Picked::Skipped;
        }
        consumer.credits -= 1;
        consumer.held.insert(lease.clone());
        queue.delivered += 1;
        queue
            .fairness
            .delivered(&lease.producer, now.unix_ms / 1_000, dwell_ms);
        if lease.attempt > 1 {
            queue.redelivered += 1;
        }
        queue.holders.insert(
            lease,
            LeaseHolder {
                consumer: consumer_id,
                nonce,
            },
        );
        queue.consumers.rotate_left(1);
        if let Some(dwell_ms) = dwell_ms {
            self.outbox
                .first_deliveries
                .push((queue_name.clone(), dwell_ms));
        }
        Picked::Delivered
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
