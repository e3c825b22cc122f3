//! Binding a node's ports before it starts (so port 0 works): the client
//! port (`listen`), for a cluster the peer port, and the metrics and
//! console port (`metrics_listen`) when set.

use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::node::NodeError;
use crate::service::server::Listeners;

/// Binds the client port (`listen`) and, for a cluster, the peer port
/// (`peer_listen`, by default the port of this node's own address in
/// `peers` on the client port's interface: a host name there may resolve
/// to another interface, such as Debian's 127.0.1.1 for the machine's own
/// name).
pub async fn bind_listeners(config: &Config) -> Result<Listeners, NodeError> {
    let client = bind("client", &config.listen.to_string()).await?;
    let peer = match (config.peer_listen, config.own_peer_address()) {
        (Some(address), _) => Some(bind("peer", &address.to_string()).await?),
        (None, Some(own)) => {
            let port = own
                .rsplit_once(':')
                .and_then(|(_, port)| port.parse::<u16>().ok())
                .ok_or_else(|| NodeError::Bind {
                    port: "peer",
                    address: own.to_owned(),
                    source: std::io::Error::other("this node's peers entry has no port"),
                })?;
            let address = SocketAddr::new(config.listen.ip(), port);
            Some(bind("peer", &address.to_string()).await?)
        }
        (None, None) => None,
    };
    let operations = match config.metrics_listen {
        Some(address) => Some(bind("metrics and console", &address.to_string()).await?),
        None => None,
    };
    Ok(Listeners {
        client,
        peer,
        operations,
    })
}

async fn bind(port: &'static str, address: &str) -> Result<TcpListener, NodeError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| NodeError::Bind {
            port,
            address: address.to_owned(),
            source,
        })
}
