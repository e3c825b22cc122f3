//! A produce request, checked once and turned into a [`ProduceBatch`]: the
//! queue, producer and shard it goes to, its idempotency sequence and delay,
//! and its messages. The messages stay in their wire form until the batch is
//! proposed, so a batch forwarded to its shard's leader is sent on without
//! being copied.

use std::collections::BTreeMap;

use floret_cluster::ShardPlacement;
use floret_proto::v1;
use floret_store::{DelayedEnqueue, Enqueue, NewMessage, Op, ShardId};

use crate::config::Limits;
use crate::request::{self, InvalidRequest};

/// Furthest ahead a message may be delayed.
pub const MAX_DELAY_MS: i64 = 30 * 24 * 3600 * 1000;

/// A checked produce.
#[derive(Debug, Clone, PartialEq)]
pub struct ProduceBatch {
    /// The queue (never empty: an empty name means the default queue).
    pub queue: String,
    /// The producer.
    pub producer: String,
    /// The shard that holds the producer.
    pub shard: ShardId,
    /// The client's idempotency sequence, if any.
    pub producer_sequence: Option<u64>,
    /// Not before this time (ms since the Unix epoch); 0 or past means at once.
    pub deliver_at_ms: i64,
    /// The messages, as sent (at least one, each within the limits).
    pub messages: Vec<v1::Message>,
}

impl ProduceBatch {
    /// Checks `request` against the node's `limits` at `now_ms` and places it.
    pub fn parse(
        request: v1::ProduceRequest,
        limits: &Limits,
        placement: &ShardPlacement,
        now_ms: i64,
    ) -> Result<Self, InvalidRequest> {
        let queue = request::queue_name(&request.queue)?;
        let producer = request::producer_id(&request.producer_id)?;
        check_messages(&request.messages, limits)?;
        let deliver_at_ms = deliver_at(request.deliver_at_unix_ms, now_ms)?;
        Ok(Self {
            shard: placement.shard_of(&queue, &producer),
            queue,
            producer,
            producer_sequence: request.producer_sequence,
            deliver_at_ms,
            messages: request.messages,
        })
    }

    /// The request to send this batch on to its shard's leader.
    pub fn into_wire(self) -> v1::ProduceRequest {
        v1::ProduceRequest {
            queue: self.queue,
            producer_id: self.producer,
            messages: self.messages,
            producer_sequence: self.producer_sequence,
            deliver_at_unix_ms: self.deliver_at_ms,
        }
    }

    /// The operation that stores the batch, committed at `now_ms`.
    pub fn into_op(self, now_ms: i64) -> Op {
        let enqueue = Enqueue {
            queue: self.queue,
            producer: self.producer,
            producer_sequence: self.producer_sequence,
            enqueued_at_ms: now_ms,
            messages: new_messages(self.messages),
        };
        if self.deliver_at_ms > now_ms {
            Op::EnqueueDelayed(DelayedEnqueue {
                enqueue,
                deliver_at_ms: self.deliver_at_ms,
            })
        } else {
            Op::Enqueue(enqueue)
        }
    }
}

/// Checks a produce request's messages against the node's limits.
fn check_messages(messages: &[v1::Message], limits: &Limits) -> Result<(), InvalidRequest> {
    if messages.is_empty() {
        return Err(InvalidRequest::NoMessages);
    }
    if messages.len() > limits.max_batch_messages {
        return Err(InvalidRequest::TooManyMessages {
            count: messages.len(),
            max: limits.max_batch_messages,
        });
    }
    for (index, message) in messages.iter().enumerate() {
        if message.payload.len() > limits.max_payload_bytes {
            return Err(InvalidRequest::PayloadTooLarge {
                index,
                len: message.payload.len(),
                max: limits.max_payload_bytes,
            });
        }
        request::header_names(index, message.headers.keys())?;
        let header_bytes: usize = message.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        if header_bytes > limits.max_header_bytes {
            return Err(InvalidRequest::HeadersTooLarge {
                index,
                len: header_bytes,
                max: limits.max_header_bytes,
            });
        }
    }
    Ok(())
}

/// A produce's not-before time: at most [`MAX_DELAY_MS`] after `now_ms`
/// (0 and past times mean at once).
fn deliver_at(deliver_at_ms: i64, now_ms: i64) -> Result<i64, InvalidRequest> {
    if deliver_at_ms > now_ms.saturating_add(MAX_DELAY_MS) {
        return Err(InvalidRequest::DelayTooLong {
            deliver_at_ms,
            now_ms,
        });
    }
    Ok(deliver_at_ms)
}

fn new_messages(messages: Vec<v1::Message>) -> Vec<NewMessage> {
    messages
        .into_iter()
        .map(|message| NewMessage {
            payload: message.payload,
            headers: message.headers.into_iter().collect::<BTreeMap<_, _>>(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_batch_and_oversized_payload_are_refused() {
        let limits = Limits {
            max_payload_bytes: 4,
            ..Limits::default()
        };
        assert_eq!(
            check_messages(&[], &limits),
            Err(InvalidRequest::NoMessages)
        );
        let big = v1::Message {
            payload: vec![0; 5],
            headers: Default::default(),
        };
        let refused = check_messages(&[big], &limits).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("payload too large: 5 bytes > 4"),
            "{refused}"
        );
    }

    #[test]
    fn delay_beyond_thirty_days_is_refused() {
        assert_eq!(deliver_at(0, 1_000).unwrap(), 0);
        assert!(deliver_at(1_000 + MAX_DELAY_MS, 1_000).is_ok());
        let refused = deliver_at(1_001 + MAX_DELAY_MS, 1_000).unwrap_err();
        assert!(matches!(refused, InvalidRequest::DelayTooLong { .. }));
    }

    #[test]
    fn a_delayed_batch_becomes_a_delayed_enqueue_and_a_due_one_does_not() {
        let request = v1::ProduceRequest {
            queue: String::new(),
            producer_id: "p".into(),
            messages: vec![v1::Message::default()],
            producer_sequence: Some(7),
            deliver_at_unix_ms: 2_000,
        };
        let placement = ShardPlacement::new(6);
        let batch = ProduceBatch::parse(request, &Limits::default(), &placement, 1_000).unwrap();
        assert_eq!(batch.queue, request::DEFAULT_QUEUE);
        assert!(matches!(
            batch.clone().into_op(1_000),
            Op::EnqueueDelayed(_)
        ));
        assert!(matches!(batch.clone().into_op(2_000), Op::Enqueue(_)));
        assert_eq!(batch.into_wire().producer_sequence, Some(7));
    }
}
