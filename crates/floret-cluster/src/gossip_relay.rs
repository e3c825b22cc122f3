//! The sealed gossip socket (`gossip_transport.rs` says what a seal is).
//! chitchat encodes its messages itself and does not let others do it, so
//! its own UDP socket runs on a loopback port behind a relay: the public
//! socket takes sealed datagrams from the network, opens them and hands
//! the payload to chitchat's socket from a loopback socket of its own per
//! peer; what chitchat sends to that socket is sealed and sent to the
//! peer. The per-peer sockets tell chitchat's datagrams apart, so chitchat
//! sees every peer under its real address.
//!
//! IMPLEMENTATION CAVEATS
//! - A process on the same host that can spoof loopback source addresses
//!   could reach chitchat's socket directly.
//! - A fatal error of the public socket stops receiving (logged), not
//!   sending.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket};

use crate::gossip_transport::{GossipSecret, SEAL_BYTES, Traffic};

/// Largest payload UDP carries.
const MAX_UDP_PAYLOAD: usize = 65_507;
/// Most peers with a relay socket at once; the least recently used goes
/// when another is needed (a restarted peer comes back on a new port).
const MAX_RELAYS: usize = 256;
/// Largest datagram received (UDP's own limit).
const MAX_DATAGRAM_BYTES: usize = 65_536;

/// The sealed socket. chitchat encodes its messages itself and does not
/// let others do it, so its own UDP socket (`inner`, on a loopback port)
/// does the encoding, and every datagram passes through a relay: the
/// public socket (`outer`) takes sealed datagrams from the network, checks
/// them and hands the payload to `inner` from a loopback socket of its own
/// per peer, and seals what `inner` sends to that socket before it leaves
/// for the peer. The per-peer sockets tell `inner`'s datagrams apart, so
/// chitchat sees every peer under its real address.
pub(crate) struct SealedSocket {
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
    pub(crate) async fn open(
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
        if crate::gossip_transport::send_dropped_by_fault() {
            return Ok(SendOutcome { num_bytes_sent: 0 });
        }
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
