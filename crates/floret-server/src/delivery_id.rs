//! Delivery ids: what a consumer sends back to ack or nack a delivery.
//!
//! An id names the message and the attempt, so any node can route it to the
//! shard that holds the message, and a late ack of an older attempt is told
//! apart from an ack of the current one. Text form:
//! `{shard}-{sequence}-{attempt}-{queue length}-{queue}{producer}`.

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

impl fmt::Display for DeliveryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{}-{}-{}-{}{}",
            self.shard,
            self.sequence,
            self.attempt,
            self.queue.len(),
            self.queue,
            self.producer
        )
    }
}

/// A delivery id that this node did not produce.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed delivery id {0:?}")]
pub struct MalformedDeliveryId(pub String);

impl std::str::FromStr for DeliveryId {
    type Err = MalformedDeliveryId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parts =
            DeliveryIdParts::of(text).ok_or_else(|| MalformedDeliveryId(text.to_owned()))?;
        Ok(Self {
            shard: parts.shard,
            queue: parts.queue.to_owned(),
            producer: parts.producer.to_owned(),
            sequence: parts.sequence,
            attempt: parts.attempt,
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
    queue: &'a str,
    producer: &'a str,
}

impl<'a> DeliveryIdParts<'a> {
    fn of(text: &'a str) -> Option<Self> {
        let mut parts = text.splitn(5, '-');
        let mut number = || parts.next().and_then(|p| p.parse::<u64>().ok());
        let shard = ShardId::try_from(number()?).ok()?;
        let sequence = number()?;
        let attempt = u32::try_from(number()?).ok()?;
        let queue_len = usize::try_from(number()?).ok()?;
        let (queue, producer) = parts.next()?.split_at_checked(queue_len)?;
        if queue.is_empty() || producer.is_empty() || attempt == 0 {
            return None;
        }
        Some(Self {
            shard,
            sequence,
            attempt,
            queue,
            producer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_id_round_trips_with_dashes_in_names() {
        let id = DeliveryId {
            shard: 7,
            queue: "orders-eu".into(),
            producer: "tenant-1-é".into(),
            sequence: 42,
            attempt: 3,
        };
        assert_eq!(id.to_string().parse::<DeliveryId>().unwrap(), id);
    }

    #[test]
    fn an_ack_is_checked_against_another_queue_than_its_id_names() {
        let id = DeliveryId {
            shard: 2,
            queue: "acme.orders".into(),
            producer: "acme/p-1".into(),
            sequence: 9,
            attempt: 1,
        };
        assert_eq!(queue_of(&id.to_string()), Some("acme.orders"));
        assert_eq!(queue_of("1-2-3-9-qp"), None);
    }

    #[test]
    fn garbage_delivery_id_is_malformed() {
        for text in [
            "",
            "x",
            "1-2-3",
            "1-2-0-1-qp",
            "1-2-3-9-qp",
            "1-2-3-1-q",
            "-1-2-3-1-qp",
        ] {
            assert!(text.parse::<DeliveryId>().is_err(), "{text:?} parsed");
        }
    }
}
