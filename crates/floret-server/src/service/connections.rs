//! Caps the connections a port keeps open: each accepted connection holds
//! a permit until it closes, and one accepted while every permit is taken
//! is closed at once (counted in `floret_connections_refused_total`). With
//! the streams-per-connection cap (`server.rs`) this bounds what clients
//! can hold open on a node.
//!
//! IMPLEMENTATION CAVEATS
//! - The cap is per port, not per client address: one client may take
//!   every connection (the tenants work adds identity).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// An accepted connection and its place under the cap.
pub struct CappedConnection {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

/// The connections of `accepted` that fit under `max_open` at once; `port`
/// names the port in logs and metrics.
pub fn cap(
    accepted: impl Stream<Item = io::Result<TcpStream>> + Send + 'static,
    max_open: usize,
    port: &'static str,
) -> impl Stream<Item = io::Result<CappedConnection>> + Send + 'static {
    let permits = Arc::new(Semaphore::new(max_open));
    accepted.filter_map(move |accepted| {
        let admitted = match accepted {
            Ok(stream) => match permits.clone().try_acquire_owned() {
                Ok(permit) => Some(Ok(CappedConnection {
                    stream,
                    _permit: permit,
                })),
                Err(_) => {
                    metrics::counter!("floret_connections_refused_total", "port" => port)
                        .increment(1);
                    tracing::debug!(
                        port,
                        max_open,
                        peer = ?stream.peer_addr().ok(),
                        "connection closed: the port holds its most open connections"
                    );
                    None
                }
            },
            Err(error) => Some(Err(error)),
        };
        std::future::ready(admitted)
    })
}

impl Connected for CappedConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for CappedConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CappedConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
