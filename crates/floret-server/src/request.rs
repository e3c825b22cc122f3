//! Checks on what clients send, turning wire values into domain values or
//! an [`InvalidRequest`] that says what was wrong (INVALID_ARGUMENT on the
//! wire). A produce's whole batch is checked in `produce/batch.rs`.

use floret_proto::v1;

use crate::deliver::SettleKind;
use crate::raft_inputs::RaftInputError;

/// What is wrong with a request; retrying it unchanged fails again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    /// A queue name over [`MAX_QUEUE_NAME_BYTES`].
    #[error("queue name too long: {len} bytes > {MAX_QUEUE_NAME_BYTES}")]
    QueueNameTooLong {
        /// Its length.
        len: usize,
    },
    /// A queue name with a character keys cannot hold.
    #[error("queue name {queue:?} has {bad:?}: use ASCII letters, digits, '.', '_' or '-'")]
    QueueNameCharacter {
        /// The name.
        queue: String,
        /// The first character refused.
        bad: char,
    },
    /// No producer id.
    #[error("producer_id is empty")]
    ProducerIdEmpty,
    /// A producer id over its limit ([`MAX_PRODUCER_ID_BYTES`] as a client
    /// names it, [`MAX_STORED_PRODUCER_ID_BYTES`] with its tenant).
    #[error("producer_id too long: {len} bytes > {max}")]
    ProducerIdTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A producer id with a control character (logs and status lines would show it raw).
    #[error("producer_id has a control character at byte {at}: use printable characters")]
    ProducerIdCharacter {
        /// Where the first one is.
        at: usize,
    },
    /// A produce without messages.
    #[error("a produce needs at least one message")]
    NoMessages,
    /// A produce over the node's batch limit.
    #[error("too many messages in one produce: {count} > {max}")]
    TooManyMessages {
        /// Messages sent.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A `ProduceMany` over its limit of produces.
    #[error("too many produces in one ProduceMany: {count} > {max}")]
    TooManyProduces {
        /// Produces sent.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// One message's payload over the limit.
    #[error("message {index}: payload too large: {len} bytes > {max}")]
    PayloadTooLarge {
        /// Its place in the batch.
        index: usize,
        /// Its size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// One message with more headers than the limit.
    #[error("message {index}: too many headers: {count} > {MAX_HEADERS}")]
    TooManyHeaders {
        /// Its place in the batch.
        index: usize,
        /// Headers sent.
        count: usize,
    },
    /// A header name that is empty or has a control character.
    #[error("message {index}: header name {name:?} must be non-empty printable text")]
    HeaderName {
        /// Its place in the batch.
        index: usize,
        /// The name as sent.
        name: String,
    },
    /// One message's headers over the limit.
    #[error("message {index}: headers too large: {len} bytes > {max}")]
    HeadersTooLarge {
        /// Its place in the batch.
        index: usize,
        /// Keys and values, in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A delay past [`MAX_DELAY_MS`].
    #[error("deliver_at_unix_ms {deliver_at_ms} is more than 30 days ahead (now {now_ms})")]
    DelayTooLong {
        /// The time asked for.
        deliver_at_ms: i64,
        /// The node's time.
        now_ms: i64,
    },
    /// An ack flagged for the dead letters.
    #[error("dead_letter applies to a nack, not to an ack")]
    DeadLetterOnAck,
    /// A consumer granting no credits.
    #[error("credits must be > 0")]
    ZeroCredits,
    /// A policy enum value this node does not know.
    #[error("unknown {setting} action {value}")]
    UnknownPolicyAction {
        /// `overflow` or `expiry`.
        setting: &'static str,
        /// The number sent.
        value: i32,
    },
    /// A policy setting of zero that must be at least one.
    #[error("{setting} must be at least 1 (leave it unset to inherit)")]
    PolicySettingZero {
        /// Its name.
        setting: &'static str,
    },
    /// A produce larger by itself than its producer's stored limits.
    #[error(
        "a produce of {count} messages is larger than producer {producer:?}'s limit ({limits}) by itself and can never be stored; send smaller batches"
    )]
    BatchOverLimit {
        /// Messages in the produce.
        count: usize,
        /// The producer.
        producer: String,
        /// Its limits, described.
        limits: String,
    },
    /// A produce larger than its tenant's limits by itself.
    #[error(
        "a produce of {count} messages is larger than tenant {tenant:?}'s limit over all its producers ({limits}) by itself and can never be stored; send smaller batches"
    )]
    BatchOverTenantLimit {
        /// Messages in the produce.
        count: usize,
        /// The tenant.
        tenant: String,
        /// Its limits, described.
        limits: String,
    },
    /// A dead-letter id not in the form the listing gives.
    #[error("malformed dead-letter id {text:?}: expected <shard>:<id> as listed")]
    DeadLetterId {
        /// The id as sent.
        text: String,
    },
    /// A message between nodes that does not decode.
    #[error("undecodable {what}: {reason}")]
    Undecodable {
        /// What it should have been.
        what: &'static str,
        /// Why it does not decode.
        reason: String,
    },
    /// A raft message from a peer that openraft must not see.
    #[error("refused raft message: {0}")]
    RaftInput(#[from] RaftInputError),
    /// A call whose shape the service does not accept (what and why).
    #[error("{0}")]
    Malformed(&'static str),
}

/// Queue used when a request leaves the name empty.
pub const DEFAULT_QUEUE: &str = "default";
/// Longest queue name, in bytes.
pub const MAX_QUEUE_NAME_BYTES: usize = 128;
/// Longest producer id, in bytes.
pub const MAX_PRODUCER_ID_BYTES: usize = 256;
/// Longest producer id as stored: a tenant's producers are stored as
/// `tenant/producer` (`crate::auth::Caller::producer_id`).
pub const MAX_STORED_PRODUCER_ID_BYTES: usize =
    crate::auth::MAX_TENANT_BYTES + 1 + MAX_PRODUCER_ID_BYTES;
/// Most headers one message may carry.
pub const MAX_HEADERS: usize = 64;

/// The queue a request names: empty means [`DEFAULT_QUEUE`]; otherwise
/// 1..=128 bytes of ASCII letters, digits, `.`, `_` and `-`.
pub fn queue_name(queue: &str) -> Result<String, InvalidRequest> {
    if queue.is_empty() {
        return Ok(DEFAULT_QUEUE.to_owned());
    }
    if queue.len() > MAX_QUEUE_NAME_BYTES {
        return Err(InvalidRequest::QueueNameTooLong { len: queue.len() });
    }
    if let Some(bad) = queue
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(InvalidRequest::QueueNameCharacter {
            queue: queue.to_owned(),
            bad,
        });
    }
    Ok(queue.to_owned())
}

/// A producer id as a client names it: 1..=256 bytes of printable UTF-8.
pub fn client_producer_id(producer: &str) -> Result<(), InvalidRequest> {
    check_producer_id(producer, MAX_PRODUCER_ID_BYTES)
}

/// A producer id as stored (with its tenant, if it has one).
pub fn producer_id(producer: &str) -> Result<String, InvalidRequest> {
    check_producer_id(producer, MAX_STORED_PRODUCER_ID_BYTES)?;
    Ok(producer.to_owned())
}

fn check_producer_id(producer: &str, max: usize) -> Result<(), InvalidRequest> {
    if producer.is_empty() {
        return Err(InvalidRequest::ProducerIdEmpty);
    }
    if producer.len() > max {
        return Err(InvalidRequest::ProducerIdTooLong {
            len: producer.len(),
            max,
        });
    }
    if let Some((at, _)) = producer.char_indices().find(|(_, c)| c.is_control()) {
        return Err(InvalidRequest::ProducerIdCharacter { at });
    }
    Ok(())
}

/// A message's header names: at most [`MAX_HEADERS`], each non-empty printable text.
pub fn header_names<'a>(
    index: usize,
    names: impl ExactSizeIterator<Item = &'a String>,
) -> Result<(), InvalidRequest> {
    if names.len() > MAX_HEADERS {
        return Err(InvalidRequest::TooManyHeaders {
            index,
            count: names.len(),
        });
    }
    for name in names {
        if name.is_empty() || name.chars().any(char::is_control) {
            return Err(InvalidRequest::HeaderName {
                index,
                name: name.clone(),
            });
        }
    }
    Ok(())
}

/// What an ack (`nack` false) or nack on a consume stream asks for; a
/// dead-letter flag on an ack is refused.
pub fn settle_kind(nack: bool, settle: &v1::Settle) -> Result<SettleKind, InvalidRequest> {
    match (nack, settle.dead_letter) {
        (false, false) => Ok(SettleKind::Ack),
        (false, true) => Err(InvalidRequest::DeadLetterOnAck),
        (true, false) => Ok(SettleKind::Nack),
        (true, true) => Ok(SettleKind::DeadLetter),
    }
}

/// Credits a consumer grants: at least one.
pub fn credits(credits: u32) -> Result<u32, InvalidRequest> {
    if credits == 0 {
        return Err(InvalidRequest::ZeroCredits);
    }
    Ok(credits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_queue_name_means_default() {
        assert_eq!(queue_name("").unwrap(), DEFAULT_QUEUE);
    }

    #[test]
    fn queue_name_with_slash_is_refused() {
        let refused = queue_name("a/b").unwrap_err();
        assert!(matches!(
            refused,
            InvalidRequest::QueueNameCharacter { bad: '/', .. }
        ));
        assert!(refused.to_string().contains("'/'"), "{refused}");
    }

    #[test]
    fn producer_id_over_256_bytes_is_refused() {
        assert!(client_producer_id(&"p".repeat(256)).is_ok());
        let refused = client_producer_id(&"p".repeat(257)).unwrap_err();
        assert!(refused.to_string().contains("257 bytes > 256"), "{refused}");
        let stored = format!("{}/{}", "t".repeat(64), "p".repeat(256));
        assert!(producer_id(&stored).is_ok());
        assert!(producer_id(&format!("{stored}p")).is_err());
    }

    #[test]
    fn producer_id_with_control_characters_garbles_logs_and_status() {
        assert!(producer_id("tenant-ü 1").is_ok());
        assert_eq!(
            producer_id("a\nb"),
            Err(InvalidRequest::ProducerIdCharacter { at: 1 })
        );
        assert!(producer_id("\u{7}").is_err());
    }

    #[test]
    fn header_names_must_be_printable_and_few() {
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        assert_eq!(header_names(0, names(&["kind", "trace-id"]).iter()), Ok(()));
        assert!(matches!(
            header_names(2, names(&[""]).iter()),
            Err(InvalidRequest::HeaderName { index: 2, .. })
        ));
        assert!(header_names(0, names(&["a\rb"]).iter()).is_err());
        let many: Vec<String> = (0..=MAX_HEADERS).map(|i| format!("h{i}")).collect();
        assert_eq!(
            header_names(1, many.iter()),
            Err(InvalidRequest::TooManyHeaders {
                index: 1,
                count: MAX_HEADERS + 1
            })
        );
    }

    #[test]
    fn zero_credits_are_refused() {
        assert_eq!(credits(0), Err(InvalidRequest::ZeroCredits));
    }
}
