//! Byte layout of the keys in a shard's state-machine tree.
//!
//! Everything of one shard lives in one sled tree so that one change set
//! (see `change_set.rs`) applies a raft entry atomically. Keys sort so that a range scan reads one producer's
//! backlog in sequence order:
//!
//! - `A` -> the applied state (last applied log id, membership);
//! - `R` -> the redo record of an apply being written (none at rest);
//! - `L` -> how many of the shard's runs point into each segment of this
//!   node's raft log (see `wal/pins.rs`); this node's own, so snapshots
//!   and replica digests leave it out;
//! - `P` queue-len:u8 queue producer -> [`crate::records::ProducerRecord`];
//! - `M` queue-len:u8 queue producer-len:u16 producer sequence:u64be -> a
//!   run of messages from that sequence on (see `runs.rs`);
//! - `X` + a run's key without its `M` -> which of the run's messages are
//!   removed; only runs with removed messages have one.
//! - `Q` queue-len:u8 queue -> the queue's default [`crate::policy::Policy`];
//! - `O` queue-len:u8 queue producer -> a producer's override [`crate::policy::Policy`];
//! - `D` queue-len:u8 queue id:u64be -> [`crate::records::DeadLetterRecord`];
//! - `N` queue-len:u8 queue -> the id the queue's next dead letter gets (u64);
//! - `T` + a message key without its `M` -> when that delayed message may be
//!   delivered (i64 ms since the Unix epoch); only delayed messages have one.
//! - `S` queue-len:u8 queue -> the queue's [`crate::SinkSpec`].
//!
//! Lengths are prefixed so that producer `ab` and producer `abc` never share a
//! key prefix.

/// Key of the applied state record.
pub const APPLIED: &[u8] = b"A";
/// Key of the redo record of an apply being written (see `ChangeSet`).
pub const REDO: &[u8] = b"R";
/// Key of the shard's runs per raft log segment on this node.
pub const PAYLOAD_PINS: &[u8] = b"L";
/// First byte of every producer record key.
pub const PRODUCER_TAG: u8 = b'P';
/// First byte of every message key.
pub const MESSAGE_TAG: u8 = b'M';

/// First byte of every queue policy key.
pub const QUEUE_POLICY_TAG: u8 = b'Q';
/// First byte of every producer policy key.
pub const PRODUCER_POLICY_TAG: u8 = b'O';
/// First byte of every dead-letter key.
pub const DEAD_LETTER_TAG: u8 = b'D';
/// First byte of every next-dead-letter-id key.
pub const NEXT_DEAD_LETTER_TAG: u8 = b'N';

/// First byte of every delay key.
pub const DELAY_TAG: u8 = b'T';

/// First byte of every key of a run's removal marks.
pub const REMOVED_TAG: u8 = b'X';

/// First byte of every sink key.
pub const SINK_TAG: u8 = b'S';

/// Whether `key` belongs to this node's copy alone (the redo record of a
/// write in progress, the payload pins): it never travels in a snapshot.
pub fn is_node_local(key: &[u8]) -> bool {
    key == REDO || key == PAYLOAD_PINS
}

/// Key of the removal marks of the run stored under `run_key`.
pub fn removed(run_key: &[u8]) -> Vec<u8> {
    let mut key = run_key.to_vec();
    key[0] = REMOVED_TAG;
    key
}

/// Key of the delivery time of the message whose key is `message_key`.
pub fn delay(message_key: &[u8]) -> Vec<u8> {
    let mut key = message_key.to_vec();
    key[0] = DELAY_TAG;
    key
}

/// The message key a delay key belongs to.
pub fn delayed_message(delay_key: &[u8]) -> Vec<u8> {
    let mut key = delay_key.to_vec();
    key[0] = MESSAGE_TAG;
    key
}

/// Key of a queue's default policy.
pub fn queue_policy(queue: &str) -> Vec<u8> {
    queue_key(QUEUE_POLICY_TAG, queue)
}

/// Key of a producer's policy override.
pub fn producer_policy(queue: &str, producer: &str) -> Vec<u8> {
    let mut key = queue_key(PRODUCER_POLICY_TAG, queue);
    key.extend_from_slice(producer.as_bytes());
    key
}

/// Prefix of every dead letter of a queue.
pub fn dead_letter_prefix(queue: &str) -> Vec<u8> {
    queue_key(DEAD_LETTER_TAG, queue)
}

/// Key of one dead letter.
pub fn dead_letter(queue: &str, id: u64) -> Vec<u8> {
    let mut key = dead_letter_prefix(queue);
    key.extend_from_slice(&id.to_be_bytes());
    key
}

/// Key of the id a queue's next dead letter gets.
pub fn next_dead_letter(queue: &str) -> Vec<u8> {
    queue_key(NEXT_DEAD_LETTER_TAG, queue)
}

/// Key of a queue's sink.
pub fn sink(queue: &str) -> Vec<u8> {
    queue_key(SINK_TAG, queue)
}

/// The queue a sink key names; None if it is not one.
pub fn parse_sink(key: &[u8]) -> Option<&str> {
    let (&tag, rest) = key.split_first()?;
    let (&queue_len, queue) = rest.split_first()?;
    if tag != SINK_TAG || queue.len() != usize::from(queue_len) {
        return None;
    }
    std::str::from_utf8(queue).ok()
}

/// Splits a queue policy key, or a producer policy key, into (queue,
/// producer); None if it is neither.
pub fn parse_policy(key: &[u8]) -> Option<(&str, Option<&str>)> {
    let (&tag, rest) = key.split_first()?;
    let (&queue_len, rest) = rest.split_first()?;
    let (queue, producer) = rest.split_at_checked(queue_len as usize)?;
    let queue = std::str::from_utf8(queue).ok()?;
    match tag {
        QUEUE_POLICY_TAG if producer.is_empty() => Some((queue, None)),
        PRODUCER_POLICY_TAG => Some((queue, Some(std::str::from_utf8(producer).ok()?))),
        _ => None,
    }
}

fn queue_key(tag: u8, queue: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(2 + queue.len());
    key.push(tag);
    push_queue(&mut key, queue);
    key
}

/// Key of a producer's record.
pub fn producer(queue: &str, producer: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(2 + queue.len() + producer.len());
    key.push(PRODUCER_TAG);
    push_queue(&mut key, queue);
    key.extend_from_slice(producer.as_bytes());
    key
}

/// Prefix shared by every message of one producer.
pub fn message_prefix(queue: &str, producer: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(12 + queue.len() + producer.len());
    key.push(MESSAGE_TAG);
    push_queue(&mut key, queue);
    key.extend_from_slice(&(producer.len() as u16).to_be_bytes());
    key.extend_from_slice(producer.as_bytes());
    key
}

/// Key of one message: the key of the run that starts with it, and the
/// name its delay key is made from.
pub fn message(queue: &str, producer: &str, sequence: u64) -> Vec<u8> {
    let mut key = message_prefix(queue, producer);
    key.extend_from_slice(&sequence.to_be_bytes());
    key
}

/// Splits a producer record key into (queue, producer); None if it is not one.
pub fn parse_producer(key: &[u8]) -> Option<(&str, &str)> {
    let (&tag, rest) = key.split_first()?;
    if tag != PRODUCER_TAG {
        return None;
    }
    let (&queue_len, rest) = rest.split_first()?;
    let (queue, producer) = rest.split_at_checked(queue_len as usize)?;
    Some((
        std::str::from_utf8(queue).ok()?,
        std::str::from_utf8(producer).ok()?,
    ))
}

/// Sequence at the end of a message (or run) key.
pub fn message_sequence(key: &[u8]) -> Option<u64> {
    let tail = key.len().checked_sub(8).map(|start| &key[start..])?;
    Some(u64::from_be_bytes(tail.try_into().ok()?))
}

fn push_queue(key: &mut Vec<u8>, queue: &str) {
    key.push(queue.len() as u8);
    key.extend_from_slice(queue.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producer_whose_id_extends_another_does_not_share_its_message_range() {
        let short = message_prefix("q", "ab");
        let long = message("q", "abc", 0);
        assert!(!long.starts_with(&short));
    }

    #[test]
    fn message_keys_sort_by_sequence() {
        let keys: Vec<_> = [256u64, 1, 255, 0]
            .iter()
            .map(|&s| message("q", "p", s))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        let sequences: Vec<_> = sorted.iter().filter_map(|k| message_sequence(k)).collect();
        assert_eq!(sequences, vec![0, 1, 255, 256]);
    }

    #[test]
    fn delay_key_maps_back_to_its_message() {
        let message = message("q", "p", 9);
        let delay = delay(&message);
        assert_eq!(delay[0], DELAY_TAG);
        assert_eq!(delayed_message(&delay), message);
    }

    #[test]
    fn policy_keys_round_trip() {
        assert_eq!(parse_policy(&queue_policy("q")), Some(("q", None)));
        assert_eq!(
            parse_policy(&producer_policy("q", "p")),
            Some(("q", Some("p")))
        );
        assert_eq!(parse_policy(&producer("q", "p")), None);
    }

    #[test]
    fn dead_letters_of_a_queue_do_not_share_a_longer_named_queues_range() {
        assert!(!dead_letter("ab", 0).starts_with(&dead_letter_prefix("a")));
        assert!(dead_letter("a", 9).starts_with(&dead_letter_prefix("a")));
    }

    #[test]
    fn producer_key_round_trips() {
        let key = producer("orders", "tenant-7");
        assert_eq!(parse_producer(&key), Some(("orders", "tenant-7")));
        assert_eq!(parse_producer(b"A"), None);
    }
}
