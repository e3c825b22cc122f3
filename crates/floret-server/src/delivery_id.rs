//! Delivery ids: what a consumer sends back to ack or nack a delivery.
//!
//! An id names the message and the attempt, so any node can route it to the
//! shard that holds the message, and a late ack of an older attempt is told
//! apart from an ack of the current one ([`DeliveryId`]). What a consumer
//! holds is a [`DeliveryTicket`]: the id plus a random part the leader drew
//! for that one delivery, so an id cannot be guessed from the message it
//! names. Text form:
//! `{shard}-{sequence}-{attempt}-{nonce, 16 hex digits}-{queue length}-{queue}{producer}`.

use std::fmt;

use floret_store::ShardId;

/// One delivery of one message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeliveryId {
    /// Shard that holds the message.
    pub shard: ShardId,
    /// Queue of the message.
    pub queue: String,
    /// Producer of the message.
    pub producer: String,
    /// The message's sequence.
    pub sequence: u64,
    /// Which delivery of the message this was (1 = first).
    pub attempt: u32,
}

/// A delivery as its consumer names it: which delivery, and the random
/// part drawn for it when it was leased.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeliveryTicket {
    /// The delivery.
    pub id: DeliveryId,
    /// Drawn by the leader for this delivery; a ticket with another one
    /// names no delivery.
    pub nonce: u64,
}

impl fmt::Display for DeliveryTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = &self.id;
        write!(
            f,
            "{}-{}-{}-{:016x}-{}-{}{}",
            id.shard,
            id.sequence,
            id.attempt,
            self.nonce,
            id.queue.len(),
            id.queue,
            id.producer
        )
    }
}

/// A delivery id that this node did not produce.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed delivery id {0:?}")]
pub struct MalformedDeliveryId(pub String);

impl std::str::FromStr for DeliveryTicket {
    type Err = MalformedDeliveryId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parts =
            DeliveryIdParts::of(text).ok_or_else(|| MalformedDeliveryId(text.to_owned()))?;
        Ok(Self {
            id: DeliveryId {
                shard: parts.shard,
                queue: parts.queue.to_owned(),
                producer: parts.producer.to_owned(),
                sequence: parts.sequence,
                attempt: parts.attempt,
            },
            nonce: parts.nonce,
        })
    }
}

/// The queue a delivery id names, read without copying anything (acks are
/// checked against their stream's or caller's queues before they are
/// routed); None when the id is malformed.
pub fn queue_of(text: &str) -> Option<&str> {
    DeliveryIdParts::of(text).map(|parts| parts.queue)
}

/// A delivery id's fields, borrowed from its text.
struct DeliveryIdParts<'a> {
    shard: ShardId,
    sequence: u64,
    attempt: u32,
    nonce: u64,
    queue: &'a str,
    producer: &'a str,
}

impl<'a> DeliveryIdParts<'a> {
    fn of(text: &'a str) -> Option<Self> {
        let mut parts = text.splitn(6, '-');
        let mut number = |radix| {
            parts
                .next()
                .and_then(|part| u64::from_str_radix(part, radix).ok())
        };
        let shard = ShardId::try_from(number(10)?).ok()?;
        let sequence = number(10)?;
        let attempt = u32::try_from(number(10)?).ok()?;
        let nonce = number(16)?;
        let queue_len = usize::try_from(number(10)?).ok()?;
        let (queue, producer) = parts.next()?.split_at_checked(queue_len)?;
        if queue.is_empty() || producer.is_empty() || attempt == 0 {
            return None;
        }
        Some(Self {
            shard,
            sequence,
            attempt,
            nonce,
            queue,
            producer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(queue: &str, producer: &str) -> DeliveryTicket {
        DeliveryTicket {
            id: DeliveryId {
                shard: 7,
                queue: queue.into(),
                producer: producer.into(),
                sequence: 42,
                attempt: 3,
            },
            nonce: 0x00c0_ffee_0000_0001,
        }
    }

    #[test]
    fn delivery_id_round_trips_with_dashes_in_names() {
        let ticket = ticket("orders-eu", "tenant-1-é");
        assert_eq!(
            ticket.to_string().parse::<DeliveryTicket>().unwrap(),
            ticket
        );
    }

    #[test]
    fn a_ticket_keeps_every_bit_of_its_nonce() {
        let mut ticket = ticket("q", "p");
        ticket.nonce = u64::MAX;
        assert_eq!(
            ticket.to_string().parse::<DeliveryTicket>().unwrap(),
            ticket
        );
    }

    #[test]
    fn an_ack_is_checked_against_another_queue_than_its_id_names() {
        let ticket = ticket("acme.orders", "acme/p-1");
        assert_eq!(queue_of(&ticket.to_string()), Some("acme.orders"));
        assert_eq!(queue_of("1-2-3-0-9-qp"), None);
    }

    #[test]
    fn garbage_delivery_id_is_malformed() {
        for text in [
            "",
            "x",
            "1-2-3",
            "1-2-0-0-1-qp",
            "1-2-3-0-9-qp",
            "1-2-3-0-1-q",
            "-1-2-3-0-1-qp",
            "1-2-3-1-qp",
            "1-2-3-xyz-1-qp",
        ] {
            assert!(text.parse::<DeliveryTicket>().is_err(), "{text:?} parsed");
        }
    }
}
