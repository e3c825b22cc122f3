//! A TCP proxy for one direction of a peer link (node A dials B through
//! it), which the chaos schedules can cut to emulate a network partition.
//!
//! Cutting black-holes the link the way a dropped route does: connections
//! stay open, bytes in either direction are swallowed, new connections are
//! accepted and go nowhere, so the peers see timeouts, not resets. Healing
//! closes every connection that lived through the cut (its byte stream has a
//! hole) and forwards again; the peers reconnect.
//!
//! IMPLEMENTATION CAVEATS
//! - Only TCP: the gossip view (UDP) still flows across a cut.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// One proxied direction; cut and heal it through this handle. The proxy
/// stops when the handle drops.
pub struct Link {
    /// Where the dialling node connects.
    pub address: SocketAddr,
    cut: watch::Sender<bool>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Link {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (cut, cut_changes) = watch::channel(false);
        let accept_task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let _nodelay = inbound.set_nodelay(true);
                tokio::spawn(forward(inbound, target, cut_changes.clone()));
            }
        });
        Ok(Self {
            address,
            cut,
            accept_task,
        })
    }

    /// Black-holes the link (or ends that, when `cut` is false).
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

/// Carries one connection until either side closes it, or the link heals
/// after a cut this connection lived through.
async fn forward(mut inbound: TcpStream, target: SocketAddr, mut cut: watch::Receiver<bool>) {
    let mut lived_through_cut = *cut.borrow_and_update();
    let mut outbound = None;
    let mut from_dialler = vec![0u8; 16 * 1024];
    let mut from_target = vec![0u8; 16 * 1024];
    loop {
        if outbound.is_none() && !lived_through_cut {
            match TcpStream::connect(target).await {
                Ok(stream) => {
                    let _nodelay = stream.set_nodelay(true);
                    outbound = Some(stream);
                }
                Err(_) => return,
            }
        }
        let target_read = async {
            match outbound.as_mut() {
                Some(stream) => stream.read(&mut from_target).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            read = inbound.read(&mut from_dialler) => {
                let Ok(n @ 1..) = read else { return };
                if !*cut.borrow()
                    && let Some(stream) = outbound.as_mut()
                    && stream.write_all(&from_dialler[..n]).await.is_err()
                {
                    return;
                }
            }
            read = target_read => {
                let Ok(n @ 1..) = read else { return };
                if !*cut.borrow() && inbound.write_all(&from_target[..n]).await.is_err() {
                    return;
                }
            }
            changed = cut.changed() => {
                if changed.is_err() {
                    return;
                }
                if *cut.borrow_and_update() {
                    lived_through_cut = true;
                } else if lived_through_cut {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    while let Ok(n @ 1..) = stream.read(&mut buffer).await {
                        if stream.write_all(&buffer[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        address
    }

    async fn round_trip(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        stream.write_all(b"ping").await.ok()?;
        let mut answer = [0u8; 4];
        match tokio::time::timeout(within, stream.read_exact(&mut answer)).await {
            Ok(Ok(_)) => Some(answer.to_vec()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn a_cut_link_swallows_bytes_and_healing_closes_what_lived_through_it() {
        let link = Link::start(echo_server().await).await.unwrap();
        let mut before = TcpStream::connect(link.address).await.unwrap();
        assert_eq!(
            round_trip(&mut before, Duration::from_secs(5)).await,
            Some(b"ping".to_vec())
        );

        link.set_cut(true);
        assert_eq!(
            round_trip(&mut before, Duration::from_millis(200)).await,
            None
        );
        let mut during = TcpStream::connect(link.address).await.unwrap();
        assert_eq!(
            round_trip(&mut during, Duration::from_millis(200)).await,
            None
        );

        link.set_cut(false);
        let mut buffer = [0u8; 8];
        let closed = tokio::time::timeout(Duration::from_secs(5), before.read(&mut buffer)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "a connection that lived through the cut is closed at the heal"
        );
        let mut after = TcpStream::connect(link.address).await.unwrap();
        assert_eq!(
            round_trip(&mut after, Duration::from_secs(5)).await,
            Some(b"ping".to_vec())
        );
    }
}
