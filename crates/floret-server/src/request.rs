//! Checks on what clients send, turning wire requests into domain values or
//! a clear INVALID_ARGUMENT saying what was wrong.

use std::collections::BTreeMap;

use floret_proto::v1;
use floret_store::NewMessage;
use tonic::Status;

use crate::config::Limits;
use crate::deliver::SettleKind;

/// Queue used when a request leaves the name empty.
pub const DEFAULT_QUEUE: &str = "default";
/// Longest queue name, in bytes.
pub const MAX_QUEUE_NAME_BYTES: usize = 128;
/// Longest producer id, in bytes.
pub const MAX_PRODUCER_ID_BYTES: usize = 256;

/// The queue a request names: empty means [`DEFAULT_QUEUE`]; otherwise
/// 1..=128 bytes of ASCII letters, digits, `.`, `_` and `-`.
pub fn queue_name(queue: &str) -> Result<String, Status> {
    if queue.is_empty() {
        return Ok(DEFAULT_QUEUE.to_owned());
    }
    if queue.len() > MAX_QUEUE_NAME_BYTES {
        return Err(Status::invalid_argument(format!(
            "queue name too long: {} bytes > {MAX_QUEUE_NAME_BYTES}",
            queue.len()
        )));
    }
    if let Some(bad) = queue
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(Status::invalid_argument(format!(
            "queue name {queue:?} has {bad:?}: use ASCII letters, digits, '.', '_' or '-'"
        )));
    }
    Ok(queue.to_owned())
}

/// A producer id: 1..=256 bytes of UTF-8.
pub fn producer_id(producer: &str) -> Result<String, Status> {
    if producer.is_empty() {
        return Err(Status::invalid_argument("producer_id is empty"));
    }
    if producer.len() > MAX_PRODUCER_ID_BYTES {
        return Err(Status::invalid_argument(format!(
            "producer_id too long: {} bytes > {MAX_PRODUCER_ID_BYTES}",
            producer.len()
        )));
    }
    Ok(producer.to_owned())
}

/// Checks a produce request's messages against the node's limits.
pub fn check_messages(messages: &[v1::Message], limits: &Limits) -> Result<(), Status> {
    if messages.is_empty() {
        return Err(Status::invalid_argument(
            "a produce needs at least one message",
        ));
    }
    if messages.len() > limits.max_batch_messages {
        return Err(Status::invalid_argument(format!(
            "too many messages in one produce: {} > {}",
            messages.len(),
            limits.max_batch_messages
        )));
    }
    for (index, message) in messages.iter().enumerate() {
        if message.payload.len() > limits.max_payload_bytes {
            return Err(Status::invalid_argument(format!(
                "message {index}: payload too large: {} bytes > {}",
                message.payload.len(),
                limits.max_payload_bytes
            )));
        }
        let header_bytes: usize = message.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        if header_bytes > limits.max_header_bytes {
            return Err(Status::invalid_argument(format!(
                "message {index}: headers too large: {header_bytes} bytes > {}",
                limits.max_header_bytes
            )));
        }
    }
    Ok(())
}

/// The messages of a produce request as the store takes them; check them
/// with [`check_messages`] first.
pub fn new_messages(messages: Vec<v1::Message>) -> Vec<NewMessage> {
    messages
        .into_iter()
        .map(|message| NewMessage {
            payload: message.payload,
            headers: message.headers.into_iter().collect::<BTreeMap<_, _>>(),
        })
        .collect()
}

/// What an ack (`nack` false) or nack on a consume stream asks for; a
/// dead-letter flag on an ack is refused.
pub fn settle_kind(nack: bool, settle: &v1::Settle) -> Result<SettleKind, Status> {
    match (nack, settle.dead_letter) {
        (false, false) => Ok(SettleKind::Ack),
        (false, true) => Err(Status::invalid_argument(
            "dead_letter applies to a nack, not to an ack",
        )),
        (true, false) => Ok(SettleKind::Nack),
        (true, true) => Ok(SettleKind::DeadLetter),
    }
}

/// Furthest ahead a message may be delayed.
pub const MAX_DELAY_MS: i64 = 30 * 24 * 3600 * 1000;

/// A produce's not-before time: at most [`MAX_DELAY_MS`] after `now_ms`
/// (0 and past times mean at once).
pub fn deliver_at(deliver_at_ms: i64, now_ms: i64) -> Result<i64, Status> {
    if deliver_at_ms > now_ms.saturating_add(MAX_DELAY_MS) {
        return Err(Status::invalid_argument(format!(
            "deliver_at_unix_ms {deliver_at_ms} is more than 30 days ahead (now {now_ms})"
        )));
    }
    Ok(deliver_at_ms)
}

/// Credits a consumer grants: at least one.
pub fn credits(credits: u32) -> Result<u32, Status> {
    if credits == 0 {
        return Err(Status::invalid_argument("credits must be > 0"));
    }
    Ok(credits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn empty_queue_name_means_default() {
        assert_eq!(queue_name("").unwrap(), DEFAULT_QUEUE);
    }

    #[test]
    fn queue_name_with_slash_is_refused() {
        let status = queue_name("a/b").unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("'/'"), "{}", status.message());
    }

    #[test]
    fn producer_id_over_256_bytes_is_refused() {
        assert!(producer_id(&"p".repeat(256)).is_ok());
        let status = producer_id(&"p".repeat(257)).unwrap_err();
        assert!(
            status.message().contains("257 bytes > 256"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn empty_batch_and_oversized_payload_are_refused() {
        let limits = Limits {
            max_payload_bytes: 4,
            ..Limits::default()
        };
        assert_eq!(
            check_messages(&[], &limits).unwrap_err().code(),
            Code::InvalidArgument
        );
        let big = v1::Message {
            payload: vec![0; 5],
            headers: Default::default(),
        };
        let status = check_messages(&[big], &limits).unwrap_err();
        assert!(
            status.message().contains("payload too large: 5 bytes > 4"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn delay_beyond_thirty_days_is_refused() {
        assert_eq!(deliver_at(0, 1_000).unwrap(), 0);
        assert!(deliver_at(1_000 + MAX_DELAY_MS, 1_000).is_ok());
        let status = deliver_at(1_001 + MAX_DELAY_MS, 1_000).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
    }

    #[test]
    fn zero_credits_are_refused() {
        assert_eq!(credits(0).unwrap_err().code(), Code::InvalidArgument);
    }
}
