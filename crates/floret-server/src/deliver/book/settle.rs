//! Acks and nacks against the book's leases. A nack returns the lease at
//! once. An ack is checked against the live lease, and the lease ends only
//! when the removal has committed ([`DispatchBook::removal_committed`]): if
//! the removal fails, the lease lapses and the message comes back. A refusal
//! is explained (never committed, already acked, or a lapsed lease).
//!
//! Routing an ack to the node whose book holds its lease is
//! `deliver/settler.rs`.

use std::collections::HashSet;
use std::sync::Arc;

use floret_sched::SettleError;

use super::queue::{LeaseKey, ProducerKey};
use super::{ConsumerChannel, DispatchBook, Now, ShardContents};
use crate::deliver::{SettleCode as Code, SettleKind, SettleOutcome};
use crate::delivery_id::DeliveryId;

impl<S: ShardContents, C: ConsumerChannel> DispatchBook<S, C> {
    /// Settles each id (in order, one outcome each); ids that did not
    /// parse are answered INVALID_ARGUMENT. An accepted ack's outcome names
    /// the removal to commit before answering it.
    pub fn settle(
        &mut self,
        kind: SettleKind,
        ids: Vec<Result<DeliveryId, String>>,
        now: Now,
    ) -> Vec<SettleOutcome> {
        ids.into_iter()
            .map(|id| self.settle_one(kind, id, now))
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
        id: Result<DeliveryId, String>,
        now: Now,
    ) -> SettleOutcome {
        let id = match id {
            Ok(id) => id,
            Err(text) => {
                return outcome(
                    text.clone(),
                    Code::InvalidArgument,
                    format!("malformed delivery id {text:?}"),
                );
            }
        };
        let text = id.to_string();
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
        match kind {
            SettleKind::Ack | SettleKind::DeadLetter
                if queue.scheduler.is_leased(&key, id.sequence, id.attempt) =>
            {
                SettleOutcome {
                    delivery_id: text,
                    code: Code::Ok,
                    message: String::new(),
                    removal: Some(id),
                }
            }
            SettleKind::Nack => match queue.scheduler.nack(&key, id.sequence, id.attempt) {
                Ok(()) => {
                    self.release_holder(&queue_name, &lease);
                    self.pump(&queue_name, now);
                    outcome(text, Code::Ok, String::new())
                }
                Err(SettleError::NotLeased) => self.explain_not_leased(kind, &id, text),
            },
            SettleKind::Ack | SettleKind::DeadLetter => self.explain_not_leased(kind, &id, text),
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
            && let Some(consumer) = self.consumers.get_mut(&holder)
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

fn outcome(delivery_id: String, code: Code, message: String) -> SettleOutcome {
    SettleOutcome {
        delivery_id,
        code,
        message,
        removal: None,
    }
}
