//! Gossip's UDP transport: chitchat's datagrams, each sealed with an
//! HMAC-SHA256 tag under the cluster's gossip secret ([`GossipSecret`]), and
//! the byte and drop counts ([`Traffic`]).
//!
//! A datagram is chitchat's encoded message, its sending time and a 32-byte
//! tag over both. One whose tag does not verify (a stranger's, a spoofed
//! one, one of another cluster) or whose time is more than
//! [`MAX_CLOCK_SKEW_MS`] from the receiver's clock (a replay) is dropped
//! before chitchat sees it, and counted.
//! chitchat keeps its encoding to itself, so it encodes and decodes on a
//! loopback socket of its own and a relay seals and opens what passes
//! between that socket and the network (`gossip_relay.rs`). Without a
//! secret (a loopback cluster) chitchat's socket is used directly and
//! datagrams carry no tag. The `gossip-send-drop` fault point drops every
//! datagram this node would send, as a firewall that lets only TCP through
//! (with `return(FILE)`: while FILE exists).
//!
//! IMPLEMENTATION CAVEATS
//! - A recorded datagram can be replayed within the clock-skew window;
//!   chitchat ignores state older than what it has, so a replay can only
//!   repeat what the node already knew.
//! - The seal makes a datagram 40 bytes longer than chitchat plans for:
//!   chitchat fills a catch-up datagram up to UDP's limit once the
//!   cluster's gossiped state passes about 64 KiB (thousands of queues),
//!   and such a datagram is dropped (counted, logged) instead of sent.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport, UdpTransport};
use ring::hmac;

/// Length of the tag that ends a sealed datagram.
pub const TAG_BYTES: usize = 32;
/// Bytes a seal adds: the sending time (ms since the Unix epoch, u64 le)
/// and the tag over the payload and that time.
pub const SEAL_BYTES: usize = 8 + TAG_BYTES;
/// How far a datagram's sending time may be from the receiver's clock: a
/// recorded datagram can be replayed only within this window. Members'
/// clocks must agree within it (NTP does).
pub const MAX_CLOCK_SKEW_MS: u64 = 30_000;
/// Shortest secret taken: 128 bits.
pub const MIN_SECRET_BYTES: usize = 16;

/// The cluster's gossip secret: every member holds the same.
#[derive(Clone)]
pub struct GossipSecret(hmac::Key);

impl std::fmt::Debug for GossipSecret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("GossipSecret(<redacted>)")
    }
}

impl GossipSecret {
    /// A secret of at least [`MIN_SECRET_BYTES`] bytes.
    pub fn new(secret: &[u8]) -> Result<Self, String> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the gossip secret has {} bytes; it needs at least {MIN_SECRET_BYTES}",
                secret.len()
            ));
        }
        Ok(Self(hmac::Key::new(hmac::HMAC_SHA256, secret)))
    }

    /// `payload` followed by `now_ms` (the sending time) and the tag over both.
    pub fn seal(&self, payload: &mut Vec<u8>, now_ms: u64) {
        payload.extend_from_slice(&now_ms.to_le_bytes());
        let tag = hmac::sign(&self.0, payload);
        payload.extend_from_slice(tag.as_ref());
    }

    /// The payload of a sealed `datagram`, if its tag verifies and it was
    /// sent within [`MAX_CLOCK_SKEW_MS`] of `now_ms`.
    pub fn open<'a>(&self, datagram: &'a [u8], now_ms: u64) -> Option<&'a [u8]> {
        let split = datagram.len().checked_sub(TAG_BYTES)?;
        let (signed, tag) = datagram.split_at(split);
        hmac::verify(&self.0, signed, tag).ok()?;
        let (payload, sent) = signed.split_last_chunk::<8>()?;
        let sent_ms = u64::from_le_bytes(*sent);
        (sent_ms.abs_diff(now_ms) <= MAX_CLOCK_SKEW_MS).then_some(payload)
    }
}

/// What gossip sent, received and dropped since the node started (bytes
/// as they travel on the network, tags included).
#[derive(Debug, Default)]
pub struct Traffic {
    pub(crate) sent: AtomicU64,
    pub(crate) received: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

impl Traffic {
    /// (bytes sent, bytes received).
    pub fn totals(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
        )
    }

    /// Datagrams dropped: their tag did not verify.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The fault point that drops every gossip datagram this node sends.
pub(crate) const GOSSIP_SEND_DROP: &str = "gossip-send-drop";

/// Whether this datagram is to be dropped instead of sent (a fault point).
pub(crate) fn send_dropped_by_fault() -> bool {
    match floret_store::failpoints::fires_with(GOSSIP_SEND_DROP) {
        Some(Some(file)) => std::path::Path::new(&file).exists(),
        Some(None) => true,
        None => false,
    }
}

/// chitchat's transport over UDP, sealing with `secret` when there is one.
pub(crate) struct SealedTransport {
    pub(crate) secret: Option<GossipSecret>,
    pub(crate) traffic: Arc<Traffic>,
}

#[tonic::async_trait]
impl Transport for SealedTransport {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        match &self.secret {
            None => Ok(Box::new(CountingSocket {
                inner: UdpTransport.open(listen_addr).await?,
                traffic: self.traffic.clone(),
            })),
            Some(secret) => Ok(Box::new(
                crate::gossip_relay::SealedSocket::open(
                    listen_addr,
                    secret.clone(),
                    self.traffic.clone(),
                )
                .await?,
            )),
        }
    }
}

/// chitchat's own UDP socket, counting bytes (a cluster without a secret).
struct CountingSocket {
    inner: Box<dyn Socket>,
    traffic: Arc<Traffic>,
}

#[tonic::async_trait]
impl Socket for CountingSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.inner.local_addr()
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        if send_dropped_by_fault() {
            return Ok(SendOutcome { num_bytes_sent: 0 });
        }
        let outcome = self.inner.send(to, envelope).await?;
        self.traffic
            .sent
            .fetch_add(outcome.num_bytes_sent as u64, Ordering::Relaxed);
        Ok(outcome)
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        let outcome = self.inner.recv().await?;
        self.traffic
            .received
            .fetch_add(outcome.num_bytes_received as u64, Ordering::Relaxed);
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_with_a_forged_or_missing_tag_is_opened() {
        let secret = GossipSecret::new(b"sixteen bytes ok").unwrap();
        let now = 1_796_000_000_000;
        let mut datagram = b"chitchat envelope".to_vec();
        secret.seal(&mut datagram, now);
        assert_eq!(datagram.len(), 17 + SEAL_BYTES);
        assert_eq!(secret.open(&datagram, now), Some(&b"chitchat envelope"[..]));

        let other = GossipSecret::new(b"another cluster's secret").unwrap();
        assert_eq!(other.open(&datagram, now), None);
        let mut flipped = datagram.clone();
        flipped[3] ^= 1;
        assert_eq!(secret.open(&flipped, now), None);
        assert_eq!(secret.open(b"short", now), None);
        assert_eq!(secret.open(&datagram[..datagram.len() - 1], now), None);
        assert!(GossipSecret::new(b"too short").is_err());
    }

    #[test]
    fn recorded_datagram_replayed_an_hour_later_is_opened() {
        let secret = GossipSecret::new(b"sixteen bytes ok").unwrap();
        let sent = 1_796_000_000_000;
        let mut datagram = b"a syn".to_vec();
        secret.seal(&mut datagram, sent);
        assert!(secret.open(&datagram, sent + MAX_CLOCK_SKEW_MS).is_some());
        assert!(secret.open(&datagram, sent - MAX_CLOCK_SKEW_MS).is_some());
        assert_eq!(secret.open(&datagram, sent + 3_600_000), None);
        assert_eq!(secret.open(&datagram, sent - MAX_CLOCK_SKEW_MS - 1), None);
    }
}
