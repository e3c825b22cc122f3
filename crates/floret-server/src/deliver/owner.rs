//! Who may settle a delivery: the consume stream it was delivered on, or,
//! through the unary `Ack`, the tenant that stream belongs to.
//!
//! A consumer's stream is named by a random [`StreamKey`], drawn where the
//! consumer connected and carried to every node that feeds the stream, so
//! each leader records which stream and tenant hold each of its leases
//! ([`StreamOwner`]). A settle carries who sends it ([`SettledBy`]); the
//! leader settles only what that caller holds. On top of that, each
//! delivery's id has a random part ([`DeliveryNonces`]), so a delivery
//! cannot be named by someone it was not given to.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use ring::rand::{SecureRandom, SystemRandom};

/// Names one consumer stream across the nodes that feed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamKey(pub u128);

impl StreamKey {
    /// A key no other stream has: 128 bits from the system's random source.
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        SystemRandom::new()
            .fill(&mut bytes)
            .expect("the system's random source works");
        Self(u128::from_be_bytes(bytes))
    }

    /// The key as 16 bytes, for the wire.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// A key from the wire; `None` unless it is 16 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(Self(u128::from_be_bytes(bytes.try_into().ok()?)))
    }
}

impl fmt::Display for StreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl std::str::FromStr for StreamKey {
    type Err = std::num::ParseIntError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        u128::from_str_radix(text, 16).map(Self)
    }
}

/// The consume stream a subscription serves, and its tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamOwner {
    /// The tenant that opened the stream.
    pub tenant: Arc<str>,
    /// The stream.
    pub stream: StreamKey,
}

/// Who asks to settle deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettledBy {
    /// A consume stream: it settles only what it was delivered.
    Stream(StreamOwner),
    /// A tenant through the unary `Ack`: it settles what any of its streams
    /// was delivered.
    Tenant(Arc<str>),
}

impl SettledBy {
    /// Whether this caller may settle a delivery held by `holder`.
    pub fn may_settle(&self, holder: &StreamOwner) -> bool {
        match self {
            Self::Stream(stream) => stream == holder,
            Self::Tenant(tenant) => *tenant == holder.tenant,
        }
    }
}

/// The random parts of a book's delivery ids: a keyed hash of a counter,
/// so they are unpredictable without the key and cost no system call.
#[derive(Debug, Clone)]
pub struct DeliveryNonces {
    key: RandomState,
    drawn: u64,
}

impl DeliveryNonces {
    /// Nonces under a key drawn from the system's random source.
    pub fn random() -> Self {
        Self {
            key: RandomState::new(),
            drawn: 0,
        }
    }

    /// The next nonce.
    pub fn draw(&mut self) -> u64 {
        self.drawn += 1;
        self.key.hash_one(self.drawn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(tenant: &str, stream: u128) -> StreamOwner {
        StreamOwner {
            tenant: tenant.into(),
            stream: StreamKey(stream),
        }
    }

    #[test]
    fn another_stream_of_the_same_tenant_cannot_settle_on_a_stream() {
        let holder = owner("acme", 1);
        assert!(SettledBy::Stream(owner("acme", 1)).may_settle(&holder));
        assert!(!SettledBy::Stream(owner("acme", 2)).may_settle(&holder));
        assert!(SettledBy::Tenant("acme".into()).may_settle(&holder));
        assert!(!SettledBy::Tenant("globex".into()).may_settle(&holder));
    }

    #[test]
    fn stream_keys_round_trip_as_text_and_bytes() {
        let key = StreamKey::random();
        assert_eq!(key.to_string().parse::<StreamKey>().unwrap(), key);
        assert_eq!(StreamKey::from_bytes(&key.to_bytes()), Some(key));
        assert_eq!(StreamKey::from_bytes(&[1, 2, 3]), None);
        assert_ne!(StreamKey::random(), key);
    }

    #[test]
    fn nonces_do_not_repeat_or_count_up() {
        let mut nonces = DeliveryNonces::random();
        let drawn: Vec<u64> = (0..1_000).map(|_| nonces.draw()).collect();
        let distinct: std::collections::HashSet<_> = drawn.iter().collect();
        assert_eq!(distinct.len(), drawn.len());
        assert!(drawn.windows(2).any(|pair| pair[1] < pair[0]));
    }
}
