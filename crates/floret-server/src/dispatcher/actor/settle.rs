//! Acks and nacks inside the dispatcher. A nack returns the lease at once.
//! An ack is checked against the live lease, and the lease ends only when
//! the removal has committed ([`Dispatcher::removal_committed`]): if the removal
//! fails, the lease lapses and the message comes back. A refusal is
//! explained (never committed, already acked, or a lapsed lease).

use std::sync::Arc;

use floret_sched::SettleError;
use tonic::Code;

use super::super::queue::{LeaseKey, ProducerKey};
use super::super::{SettleKind, SettleOutcome};
use super::Dispatcher;
use crate::delivery_id::DeliveryId;

impl Dispatcher {
    pub(super) fn settle(
        &mut self,
        kind: SettleKind,
        id: Result<DeliveryId, String>,
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
        if shard >= self.readers.len() {
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
        let key = ProducerKey {
            shard: id.shard,
            producer: id.producer.as_str().into(),
        };
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
                    self.pump(&queue_name);
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
    pub(super) fn removal_committed(&mut self, id: &DeliveryId, acked: bool) {
        let queue_name: Arc<str> = id.queue.as_str().into();
        let lease = LeaseKey {
            producer: ProducerKey {
                shard: id.shard,
                producer: id.producer.as_str().into(),
            },
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
        let Some(reader) = &self.readers[id.shard as usize] else {
            return outcome(
                text,
                Code::NotFound,
                format!("this node holds no replica of shard {}", id.shard),
            );
        };
        let ever_committed = match reader.producer(&id.queue, &id.producer) {
            Ok(record) => record.is_some_and(|r| id.sequence < r.tail),
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
        match (reader.message(&id.queue, &id.producer, id.sequence), kind) {
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
