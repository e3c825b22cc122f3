//! Acks and nacks against the book's leases. A settle is checked against
//! the live lease and its holder: the random part of the id must be the
//! one drawn for that delivery, and the caller must be the stream it was
//! delivered on (or, through the unary `Ack`, that stream's tenant). A nack
//! then returns the lease at once. An ack's lease ends only when the
//! removal has committed ([`DispatchBook::removal_committed`]): if the
//! removal fails, the lease lapses and the message comes back. A refusal
//! is explained (never committed, already acked, a lapsed lease, not
//! yours) without naming who holds the delivery.
//!
//! Routing an ack to the node whose book holds its lease is
//! `deliver/settler.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use floret_sched::SettleError;

use super::queue::{LeaseKey, ProducerKey, QueueDispatch};
use super::{Consumer, ConsumerChannel, ConsumerId, DispatchBook, Now, ShardContents};
use crate::deliver::{SettleCode as Code, SettleKind, SettleOutcome, SettledBy};
use crate::delivery_id::{DeliveryId, DeliveryTicket};

impl<S: ShardContents, C: ConsumerChannel> DispatchBook<S, C> {
    /// Settles each id (in order, one outcome each) on behalf of `by`; ids
    /// that did not parse are answered INVALID_ARGUMENT. An accepted ack's
    /// outcome names the removal to commit before answering it.
    pub fn settle(
        &mut self,
        kind: SettleKind,
        ids: Vec<Result<DeliveryTicket, String>>,
        by: &SettledBy,
        now: Now,
    ) -> Vec<SettleOutcome> {
        ids.into_iter()
            .map(|id| self.settle_one(kind, id, by, now))
            .collect()
    }

    /// These deliveries' removals committed (acked, or dead-lettered or
    /// dropped when not `acked`): their leases end, and each queue is pumped,
    /// since an ended lease can free a producer held at its in-flight limit.
    pub fn removal_committed(&mut self, ids: &[DeliveryId], acked: bool, now: Now) {
        for id in ids {
            self.end_lease(id, acked);
        }
        let queues: HashSet<Arc<str>> = ids.iter().map(|id| id.queue.as_str().into()).collect();
        for queue in queues {
            self.pump(&queue, now);
        }
    }

    fn settle_one(
        &mut self,
        kind: SettleKind,
        ticket: Result<DeliveryTicket, String>,
        by: &SettledBy,
        now: Now,
    ) -> SettleOutcome {
        let ticket = match ticket {
            Ok(ticket) => ticket,
            Err(text) => {
                return outcome(
                    text.clone(),
                    Code::InvalidArgument,
                    format!("malformed delivery id {text:?}"),
                );
            }
        };
        let text = ticket.to_string();
        let DeliveryTicket { id, nonce } = ticket;
        let shard = id.shard as usize;
        if shard >= self.led.len() {
            return outcome(text, Code::NotFound, format!("no shard {}", id.shard));
        }
        if !self.led[shard] {
            return outcome(
                text,
                Code::FailedPrecondition,
                format!(
                    "this node no longer leads shard {}: the lease was lost",
                    id.shard
                ),
            );
        }
        let key = ProducerKey::new(id.shard, &id.producer);
        let lease = LeaseKey {
            producer: key.clone(),
            sequence: id.sequence,
            attempt: id.attempt,
        };
        let queue_name: Arc<str> = id.queue.as_str().into();
        let Some(queue) = self.queues.get_mut(&queue_name) else {
            return self.explain_not_leased(kind, &id, text);
        };
        if !queue.scheduler.is_leased(&key, id.sequence, id.attempt) {
            return self.explain_not_leased(kind, &id, text);
        }
        if let Err((code, why)) = may_settle(queue, &self.consumers, &lease, nonce, by) {
            return outcome(text, code, why.to_owned());
        }
        match kind {
            SettleKind::Ack | SettleKind::DeadLetter => SettleOutcome {
                delivery_id: text,
                code: Code::Ok,
                message: String::new(),
                removal: Some(id),
            },
            SettleKind::Nack => match queue.scheduler.nack(&key, id.sequence, id.attempt) {
                Ok(()) => {
                    self.release_holder(&queue_name, &lease);
                    self.pump(&queue_name, now);
                    outcome(text, Code::Ok, String::new())
                }
                Err(SettleError::NotLeased) => self.explain_not_leased(kind, &id, text),
            },
        }
    }

    /// A settled message's removal committed (an ack when `acked`, else a
    /// dead-lettering or a drop): the lease ends. A lease that lapsed in the
    /// meantime is already back in the ring; its redelivery finds the
    /// message gone and is skipped.
    fn end_lease(&mut self, id: &DeliveryId, acked: bool) {
        let queue_name: Arc<str> = id.queue.as_str().into();
        let lease = LeaseKey {
            producer: ProducerKey::new(id.shard, &id.producer),
            sequence: id.sequence,
            attempt: id.attempt,
        };
        let Some(queue) = self.queues.get_mut(&queue_name) else {
            return;
        };
        if queue
            .scheduler
            .ack(&lease.producer, id.sequence, id.attempt)
            .is_ok()
            && acked
        {
            queue.acked += 1;
        }
        self.release_holder(&queue_name, &lease);
    }

    /// Forgets who held `lease` (settled or lapsed).
    pub(super) fn release_holder(&mut self, queue_name: &Arc<str>, lease: &LeaseKey) {
        if let Some(queue) = self.queues.get_mut(queue_name)
            && let Some(holder) = queue.holders.remove(lease)
            && let Some(consumer) = self.consumers.get_mut(&holder.consumer)
        {
            consumer.held.remove(lease);
        }
    }

    /// Tells apart a message that never existed, one already acked and a lease that lapsed.
    fn explain_not_leased(&self, kind: SettleKind, id: &DeliveryId, text: String) -> SettleOutcome {
        if !self.shards.holds(id.shard) {
            return outcome(
                text,
                Code::NotFound,
                format!("this node holds no replica of shard {}", id.shard),
            );
        }
        let tail = self.shards.producer_tail(id.shard, &id.queue, &id.producer);
        let ever_committed = match tail {
            Ok(tail) => tail.is_some_and(|tail| id.sequence < tail),
            Err(error) => {
                return outcome(
                    text,
                    Code::Unavailable,
                    format!("cannot read the shard: {error}"),
                );
            }
        };
        if !ever_committed {
            return outcome(
                text,
                Code::NotFound,
                "no such delivery: that message does not exist".into(),
            );
        }
        let message = self
            .shards
            .message(id.shard, &id.queue, &id.producer, id.sequence);
        match (message, kind) {
            (Ok(None), SettleKind::Ack) => outcome(text, Code::Ok, "already acked".into()),
            (Ok(None), SettleKind::Nack | SettleKind::DeadLetter) => {
                outcome(text, Code::FailedPrecondition, "already acked".into())
            }
            (Ok(Some(_)), _) => outcome(
                text,
                Code::FailedPrecondition,
                format!(
                    "attempt {} of this message is not leased: its lease expired or it was settled",
                    id.attempt
                ),
            ),
            (Err(error), _) => outcome(
                text,
                Code::Unavailable,
                format!("cannot read the shard: {error}"),
            ),
        }
    }
}

/// Whether `by` may settle the live `lease`, presenting `nonce`: the
/// delivery must be one this book gave out under that nonce, to a stream
/// `by` speaks for. The refusal says so without naming the holder.
fn may_settle<C>(
    queue: &QueueDispatch,
    consumers: &HashMap<ConsumerId, Consumer<C>>,
    lease: &LeaseKey,
    nonce: u64,
    by: &SettledBy,
) -> Result<(), (Code, &'static str)> {
    let holder = queue
        .holders
        .get(lease)
        .filter(|holder| holder.nonce == nonce)
        .ok_or((
            Code::NotFound,
            "no such delivery: its id was not given out by this node",
        ))?;
    let held_by = consumers
        .get(&holder.consumer)
        .map(|consumer| &consumer.owner);
    if held_by.is_some_and(|owner| by.may_settle(owner)) {
        return Ok(());
    }
    Err(match by {
        SettledBy::Stream(_) => (
            Code::PermissionDenied,
            "this delivery was made on another consume stream: settle it on the stream that received it",
        ),
        SettledBy::Tenant(_) => (
            Code::PermissionDenied,
            "this delivery was not made to your tenant",
        ),
    })
}

fn outcome(delivery_id: String, code: Code, message: String) -> SettleOutcome {
    SettleOutcome {
        delivery_id,
        code,
        message,
        removal: None,
    }
}
