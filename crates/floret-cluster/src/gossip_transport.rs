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
//! between that socket and the network ([`SealedSocket`]). Without a
//! secret (a loopback cluster) chitchat's socket is used directly and
//! datagrams carry no tag.
//!
//! IMPLEMENTATION CAVEATS
//! - A process on the same host that can spoof loopback source addresses
//!   could reach chitchat's socket directly.
//! - A recorded datagram can be replayed within the clock-skew window;
//!   chitchat ignores state older than what it has, so a replay can only
//!   repeat what the node already knew.
//! - The seal makes a datagram 40 bytes longer than chitchat plans for:
//!   chitchat fills a catch-up datagram up to UDP's limit once the
//!   cluster's gossiped state passes about 64 KiB (thousands of queues),
//!   and such a datagram is dropped (counted, logged) instead of sent.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
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
/// Largest payload UDP carries.
const MAX_UDP_PAYLOAD: usize = 65_507;
/// Most peers with a relay socket at once; the least recently used goes
/// when another is needed (a restarted peer comes back on a new port).
const MAX_RELAYS: usize = 256;
/// Shortest secret taken: 128 bits.
pub const MIN_SECRET_BYTES: usize = 16;
/// Largest datagram received (UDP's own limit).
const MAX_DATAGRAM_BYTES: usize = 65_536;

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
    sent: AtomicU64,
    received: AtomicU64,
    dropped: AtomicU64,
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
                SealedSocket::open(listen_addr, secret.clone(), self.traffic.clone()).await?,
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

/// The sealed socket. chitchat encodes its messages itself and does not
/// let others do it, so its own UDP socket (`inner`, on a loopback port)
/// does the encoding, and every datagram passes through a relay: the
/// public socket (`outer`) takes sealed datagrams from the network, checks
/// them and hands the payload to `inner` from a loopback socket of its own
/// per peer, and seals what `inner` sends to that socket before it leaves
/// for the peer. The per-peer sockets tell `inner`'s datagrams apart, so
/// chitchat sees every peer under its real address.
struct SealedSocket {
    inner: chitchat::transport::UdpSocket,
    relays: Arc<Relays>,
    receiver: tokio::task::JoinHandle<()>,
}

/// The relay between the public socket and chitchat's loopback one.
struct Relays {
    outer: tokio::net::UdpSocket,
    /// chitchat's socket.
    inner: SocketAddr,
    secret: GossipSecret,
    traffic: Arc<Traffic>,
    table: Mutex<RelayTable>,
}

/// Per peer, the loopback socket that stands for it towards chitchat's.
#[derive(Default)]
struct RelayTable {
    by_peer: HashMap<SocketAddr, Relay>,
    /// A relay socket's address -> its peer.
    by_relay: HashMap<SocketAddr, SocketAddr>,
    /// The socket was dropped: no relay may be made any more.
    closed: bool,
}

/// One peer's relay socket and the task sealing what chitchat sends it.
struct Relay {
    socket: Arc<tokio::net::UdpSocket>,
    sender: tokio::task::JoinHandle<()>,
    last_used: Instant,
}

impl SealedSocket {
    async fn open(
        listen_addr: SocketAddr,
        secret: GossipSecret,
        traffic: Arc<Traffic>,
    ) -> anyhow::Result<Self> {
        let outer = tokio::net::UdpSocket::bind(listen_addr)
            .await
            .with_context(|| format!("cannot bind {listen_addr}/UDP for gossip"))?;
        let inner = chitchat::transport::UdpSocket::open(loopback(listen_addr)).await?;
        let relays = Arc::new(Relays {
            outer,
            inner: inner.local_addr()?,
            secret,
            traffic,
            table: Mutex::default(),
        });
        let receiver = tokio::spawn(relays.clone().receive());
        Ok(Self {
            inner,
            relays,
            receiver,
        })
    }
}

impl Drop for SealedSocket {
    fn drop(&mut self) {
        self.receiver.abort();
        let mut table = self.relays.table();
        table.closed = true;
        for (_, relay) in table.by_peer.drain() {
            relay.sender.abort();
        }
        table.by_relay.clear();
    }
}

#[tonic::async_trait]
impl Socket for SealedSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.relays
            .outer
            .local_addr()
            .context("cannot read the gossip socket's address")
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        let relay = self.relays.relay_for(to).await?;
        self.inner.send(relay.local_addr()?, envelope).await
    }

    /// Cancellable: chitchat drops it between rounds.
    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            let mut outcome = self.inner.recv().await?;
            let peer = self
                .relays
                .table()
                .by_relay
                .get(&outcome.from_addr)
                .copied();
            match peer {
                Some(peer) => {
                    outcome.from_addr = peer;
                    return Ok(outcome);
                }
                None => {
                    self.relays.traffic.dropped.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(from = %outcome.from_addr, "gossip datagram dropped: it bypassed the relay");
                }
            }
        }
    }
}

/// Port 0 on the loopback address of `listen`'s family.
fn loopback(listen: SocketAddr) -> SocketAddr {
    match listen {
        SocketAddr::V4(_) => SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)),
        SocketAddr::V6(_) => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 0)),
    }
}

/// Milliseconds since the Unix epoch, the time seals carry.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

impl Relays {
    fn table(&self) -> std::sync::MutexGuard<'_, RelayTable> {
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes sealed datagrams from the network; hands those that verify to
    /// chitchat through their peer's relay socket, drops and counts the rest.
    async fn receive(self: Arc<Self>) {
        let mut datagram = vec![0u8; MAX_DATAGRAM_BYTES];
        loop {
            let (len, from) = match self.outer.recv_from(&mut datagram).await {
                Ok(received) => received,
                Err(error) if is_transient(&error) => continue,
                Err(error) => {
                    tracing::error!(%error, "gossip socket failed; this node hears no gossip any more");
                    return;
                }
            };
            self.traffic
                .received
                .fetch_add(len as u64, Ordering::Relaxed);
            let Some(payload) = self.secret.open(&datagram[..len], now_ms()) else {
                self.traffic.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%from, bytes = len, "gossip datagram dropped: its tag does not verify or its time is out of the window");
                continue;
            };
            match self.relay_for(from).await {
                Ok(relay) => {
                    if relay.send_to(payload, self.inner).await.is_err() {
                        self.traffic.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(error) => tracing::warn!(%error, %from, "cannot relay gossip"),
            }
        }
    }

    /// The loopback socket standing for `peer`, made on first use; past
    /// [`MAX_RELAYS`] the least recently used one goes.
    async fn relay_for(
        self: &Arc<Self>,
        peer: SocketAddr,
    ) -> io::Result<Arc<tokio::net::UdpSocket>> {
        if let Some(relay) = self.table().by_peer.get_mut(&peer) {
            relay.last_used = Instant::now();
            return Ok(relay.socket.clone());
        }
        let socket = Arc::new(tokio::net::UdpSocket::bind(loopback(self.inner)).await?);
        let address = socket.local_addr()?;
        let mut table = self.table();
        if table.closed {
            return Err(io::Error::other("the gossip socket is closed"));
        }
        if let Some(made_meanwhile) = table.by_peer.get(&peer) {
            return Ok(made_meanwhile.socket.clone());
        }
        if table.by_peer.len() >= MAX_RELAYS {
            let oldest = table
                .by_peer
                .iter()
                .min_by_key(|(_, relay)| relay.last_used)
                .map(|(&peer, _)| peer);
            if let Some(relay) = oldest.and_then(|oldest| table.by_peer.remove(&oldest)) {
                relay.sender.abort();
                if let Ok(address) = relay.socket.local_addr() {
                    table.by_relay.remove(&address);
                }
            }
        }
        let sender = tokio::spawn(self.clone().seal_towards(peer, socket.clone()));
        table.by_relay.insert(address, peer);
        table.by_peer.insert(
            peer,
            Relay {
                socket: socket.clone(),
                sender,
                last_used: Instant::now(),
            },
        );
        Ok(socket)
    }

    /// Seals what chitchat sends through `relay` and sends it to `peer`.
    async fn seal_towards(self: Arc<Self>, peer: SocketAddr, relay: Arc<tokio::net::UdpSocket>) {
        let mut datagram = vec![0u8; MAX_DATAGRAM_BYTES];
        loop {
            let (len, from) = match relay.recv_from(&mut datagram).await {
                Ok(received) => received,
                Err(error) if is_transient(&error) => continue,
                Err(error) => {
                    tracing::warn!(%error, %peer, "gossip relay socket failed");
                    return;
                }
            };
            if from != self.inner {
                continue;
            }
            if len + SEAL_BYTES > MAX_UDP_PAYLOAD {
                self.traffic.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, bytes = len, "gossip datagram too large to seal; not sent (too much gossiped state)");
                continue;
            }
            let mut sealed = datagram[..len].to_vec();
            self.secret.seal(&mut sealed, now_ms());
            match self.outer.send_to(&sealed, peer).await {
                Ok(sent) => {
                    self.traffic.sent.fetch_add(sent as u64, Ordering::Relaxed);
                }
                Err(error) => tracing::debug!(%error, %peer, "cannot send gossip"),
            }
        }
    }
}

/// Errors a UDP socket reports for an earlier send to a closed port.
fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
    )
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
