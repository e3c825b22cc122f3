//! The node's TLS material, read from the files `[tls]` names: the
//! certificate and key it presents on both ports and to the peers it
//! dials, the cluster's CA that the peer port's mutual TLS trusts, and
//! (`auth.client_ca`) the CA of the client certificates the client port
//! asks for. The files are read once, at start.
//!
//! IMPLEMENTATION CAVEATS
//! - Certificates are not reloaded: a renewed certificate takes a restart
//!   (a rolling one keeps the cluster serving).

use std::path::{Path, PathBuf};
use std::time::Duration;

use floret_cluster::{MemberTls, member_name, pem_names_member};
use floret_store::NodeId;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::config::TlsSettings;

/// How long a connection may take to finish its TLS handshake: one that
/// sends nothing must not hold its place under the connection cap.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS material that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// A file cannot be read.
    #[error("cannot read {what} {path}: {source}")]
    Unreadable {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The node's certificate does not name it as a member.
    #[error(
        "tls.cert {path} does not name this node as {expected} (alone): its peers would refuse it; use node {node}'s certificate from `floret certs`"
    )]
    NotThisMember {
        /// The certificate file.
        path: PathBuf,
        /// This node.
        node: NodeId,
        /// The name it must carry.
        expected: String,
    },
}

/// What the node presents and trusts.
#[derive(Debug, Clone)]
pub struct NodeTls {
    identity: Identity,
    /// The cluster's CA; none for a one-node cluster given none.
    ca: Option<Certificate>,
    /// The CA of clients' certificates, when clients may present one.
    client_ca: Option<Certificate>,
}

impl NodeTls {
    /// Reads the files `settings` and `client_ca` name; none when TLS is
    /// off. With a CA the certificate must name `node` alone among `members`.
    pub fn load(
        settings: &TlsSettings,
        client_ca: Option<&Path>,
        node: NodeId,
        members: &[NodeId],
    ) -> Result<Option<Self>, TlsFileError> {
        let (Some(cert), Some(key)) = (&settings.cert, &settings.key) else {
            return Ok(None);
        };
        let chain = read("tls.cert certificate", cert)?;
        if settings.ca.is_some() && !pem_names_member(&chain, node, members) {
            return Err(TlsFileError::NotThisMember {
                path: cert.clone(),
                node,
                expected: member_name(node),
            });
        }
        let identity = Identity::from_pem(chain, read("tls.key key", key)?);
        let ca = settings
            .ca
            .as_deref()
            .map(|ca| read("tls.ca certificate", ca).map(Certificate::from_pem))
            .transpose()?;
        let client_ca = client_ca
            .map(|ca| read("auth.client_ca certificate", ca).map(Certificate::from_pem))
            .transpose()?;
        Ok(Some(Self {
            identity,
            ca,
            client_ca,
        }))
    }

    /// The client port's TLS: this node's certificate, and with a client
    /// CA a request for the client's certificate (which a client with a
    /// token need not send; one that is sent must verify).
    pub fn client_port(&self) -> ServerTlsConfig {
        let config = ServerTlsConfig::new()
            .identity(self.identity.clone())
            .timeout(HANDSHAKE_TIMEOUT);
        match &self.client_ca {
            Some(ca) => config.client_ca_root(ca.clone()).client_auth_optional(true),
            None => config,
        }
    }

    /// The peer port's mutual TLS: callers must present a certificate of
    /// the cluster's CA (which member it names is checked per call).
    pub fn peer_port(&self) -> Option<ServerTlsConfig> {
        let ca = self.ca.clone()?;
        Some(
            ServerTlsConfig::new()
                .identity(self.identity.clone())
                .client_ca_root(ca)
                .timeout(HANDSHAKE_TIMEOUT),
        )
    }

    /// What this node presents to, and trusts, the peers it dials.
    pub fn member(&self) -> Option<MemberTls> {
        Some(MemberTls {
            identity: self.identity.clone(),
            ca: self.ca.clone()?,
        })
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|source| TlsFileError::Unreadable {
        what,
        path: path.to_path_buf(),
        source,
    })
}
