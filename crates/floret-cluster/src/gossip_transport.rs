//! Gossip's UDP transport: chitchat's datagrams, each sealed with an
//! HMAC-SHA256 tag under the cluster's gossip secret ([`GossipSecret`]), and
//! the byte and drop counts ([`Traffic`]).
//!
//! A datagram is chitchat's encoded message followed by its 32-byte tag.
//! One whose tag does not verify (a stranger's, a spoofed one, one of
//! another cluster) is dropped before chitchat sees it, and counted.
//! chitchat keeps its encoding to itself, so it encodes and decodes on a
//! loopback socket of its own and a relay seals and opens what passes
//! between that socket and the network ([`SealedSocket`]). Without a
//! secret (a loopback cluster) chitchat's socket is used directly and
//! datagrams carry no tag.
//!
//! IMPLEMENTATION CAVEATS
//! - A process on the same host that can spoof loopback source addresses
//!   could reach chitchat's socket directly.
//! - A recorded datagram can be replayed; chitchat ignores state older
//!   than what it has, so a replay can only repeat what the node already knew.
//! - The tag makes a datagram 32 bytes longer than chitchat plans for; a
//!   node's state near the 64 KiB datagram limit (thousands of queues)
//!   would no longer fit.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::Context;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport, UdpTransport};
use ring::hmac;

/// Length of the tag that ends a sealed datagram.
pub const TAG_BYTES: usize = 32;
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

    /// `payload` followed by its tag.
    pub fn seal(&self, payload: &mut Vec<u8>) {
        let tag = hmac::sign(&self.0, payload);
        payload.extend_from_slice(tag.as_ref());
    }

    /// The payload of a sealed `datagram`, if its tag verifies.
    pub fn open<'a>(&self, datagram: &'a [u8]) -> Option<&'a [u8]> {
        let split = datagram.len().checked_sub(TAG_BYTES)?;
        let (payload, tag) = datagram.split_at(split);
        hmac::verify(&self.0, payload, tag).ok()?;
        Some(payload)
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
    by_peer: HashMap<SocketAddr, Arc<tokio::net::UdpSocket>>,
    /// A relay socket's address -> its peer.
    by_relay: HashMap<SocketAddr, SocketAddr>,
    /// The tasks sealing what chitchat sends through each relay socket.
    senders: Vec<tokio::task::JoinHandle<()>>,
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
        for sender in self.relays.table().senders.drain(..) {
            sender.abort();
        }
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
                    tracing::error!(%error, "gossip socket failed; gossip stops");
                    return;
                }
            };
            self.traffic
                .received
                .fetch_add(len as u64, Ordering::Relaxed);
            let Some(payload) = self.secret.open(&datagram[..len]) else {
                self.traffic.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%from, bytes = len, "gossip datagram dropped: its tag does not verify");
                continue;
            };
            match self.relay_for(from).await {
                Ok(relay) => {
                    let _full_or_gone = relay.send_to(payload, self.inner).await;
                }
                Err(error) => tracing::warn!(%error, %from, "cannot relay gossip"),
            }
        }
    }

    /// The loopback socket standing for `peer`, made on first use.
    async fn relay_for(
        self: &Arc<Self>,
        peer: SocketAddr,
    ) -> io::Result<Arc<tokio::net::UdpSocket>> {
        if let Some(relay) = self.table().by_peer.get(&peer) {
            return Ok(relay.clone());
        }
        let relay = Arc::new(tokio::net::UdpSocket::bind(loopback(self.inner)).await?);
        let address = relay.local_addr()?;
        let mut table = self.table();
        if let Some(made_meanwhile) = table.by_peer.get(&peer) {
            return Ok(made_meanwhile.clone());
        }
        table.by_peer.insert(peer, relay.clone());
        table.by_relay.insert(address, peer);
        let sender = tokio::spawn(self.clone().seal_towards(peer, relay.clone()));
        table.senders.push(sender);
        Ok(relay)
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
            let mut sealed = datagram[..len].to_vec();
            self.secret.seal(&mut sealed);
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
        let mut datagram = b"chitchat envelope".to_vec();
        secret.seal(&mut datagram);
        assert_eq!(secret.open(&datagram), Some(&b"chitchat envelope"[..]));

        let other = GossipSecret::new(b"another cluster's secret").unwrap();
        assert_eq!(other.open(&datagram), None);
        let mut flipped = datagram.clone();
        flipped[3] ^= 1;
        assert_eq!(secret.open(&flipped), None);
        assert_eq!(secret.open(b"short"), None);
        assert_eq!(secret.open(&datagram[..datagram.len() - 1]), None);
        assert!(GossipSecret::new(b"too short").is_err());
    }
}
