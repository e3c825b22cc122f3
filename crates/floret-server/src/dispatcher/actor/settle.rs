//! Acks and nacks inside the dispatcher: drop or return the lease, and
//! explain a refusal (never committed, already acked, or a lapsed lease).

use std::sync::Arc;

use floret_sched::SettleError;
use floret_store::MessageRef;
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
        let settled = match self.queues.get_mut(&queue_name) {
            Some(queue) => match kind {
                SettleKind::Ack => queue.scheduler.ack(&key, id.sequence, id.attempt),
                SettleKind::Nack => queue.scheduler.nack(&key, id.sequence, id.attempt),
            },
            None => Err(SettleError::NotLeased),
        };
        match settled {
            Ok(()) => {
                let queue = self
                    .queues
                    .get_mut(&queue_name)
                    .expect("settled in this queue");
                if let Some(holder) = queue.holders.remove(&lease)
                    && let Some(consumer) = self.consumers.get_mut(&holder)
                {
                    consumer.held.remove(&lease);
                }
                match kind {
                    SettleKind::Ack => {
                        queue.acked += 1;
                        let removal = MessageRef {
                            queue: id.queue,
                            producer: id.producer,
                            sequence: id.sequence,
                        };
                        SettleOutcome {
                            delivery_id: text,
                            code: Code::Ok,
                            message: String::new(),
                            removal: Some(removal),
                        }
                    }
                    SettleKind::Nack => {
                        self.pump(&queue_name);
                        outcome(text, Code::Ok, String::new())
                    }
                }
            }
            Err(SettleError::NotLeased) => self.explain_not_leased(kind, &id, text),
        }
    }

    /// Tells apart a message that never existed, one already acked and a lease that lapsed.
    fn explain_not_leased(&self, kind: SettleKind, id: &DeliveryId, text: String) -> SettleOutcome {
        let reader = &self.readers[id.shard as usize];
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
            (Ok(None), SettleKind::Nack) => {
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
