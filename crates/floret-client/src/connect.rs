//! How the client reaches a node: the endpoint of an address (a connect
//! timeout, Nagle off) and, for a cluster that serves TLS, the CA to trust
//! and the client certificate to present ([`ClientTls`]).

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::ClientError;

/// How long connecting to a node may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How to trust a cluster whose client port serves TLS: its CA; and the
/// client certificate to present, on a cluster that maps certificates to
/// tenants.
#[derive(Debug, Clone)]
pub struct ClientTls {
    ca: Certificate,
    domain_name: Option<String>,
    identity: Option<Identity>,
}

impl ClientTls {
    /// Trusts the node certificates that the CA in `ca_pem` (PEM) signed.
    pub fn new(ca_pem: impl AsRef<[u8]>) -> Self {
        Self {
            ca: Certificate::from_pem(ca_pem),
            domain_name: None,
            identity: None,
        }
    }

    /// Presents the client certificate `cert_pem` (its key `key_pem`) to
    /// the nodes: on a cluster that maps it to a tenant, calls without a
    /// token are that tenant's.
    pub fn with_client_certificate(
        mut self,
        cert_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Self {
        self.identity = Some(Identity::from_pem(cert_pem, key_pem));
        self
    }

    /// Reads the client certificate and its key from PEM files.
    pub fn with_client_certificate_files(
        self,
        cert: impl AsRef<std::path::Path>,
        key: impl AsRef<std::path::Path>,
    ) -> Result<Self, ClientError> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|error| {
                ClientError::Tls(format!("cannot read {}: {error}", path.display()))
            })
        };
        let (cert, key) = (read(cert.as_ref())?, read(key.as_ref())?);
        Ok(self.with_client_certificate(cert, key))
    }

    /// Reads the CA from a PEM file.
    pub fn from_ca_file(path: impl AsRef<std::path::Path>) -> Result<Self, ClientError> {
        let path = path.as_ref();
        std::fs::read(path)
            .map(Self::new)
            .map_err(|error| ClientError::Tls(format!("cannot read {}: {error}", path.display())))
    }

    /// Expects `name` in every node's certificate, instead of the host
    /// each is dialled by.
    pub fn with_domain_name(mut self, name: impl Into<String>) -> Self {
        self.domain_name = Some(name.into());
        self
    }

    fn config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().ca_certificate(self.ca.clone());
        if let Some(name) = &self.domain_name {
            config = config.domain_name(name.clone());
        }
        if let Some(identity) = &self.identity {
            config = config.identity(identity.clone());
        }
        config
    }
}

/// The endpoint of one node, connecting with a timeout and Nagle off,
/// over TLS when `tls` is given.
pub(crate) fn endpoint(address: &str, tls: Option<&ClientTls>) -> Result<Endpoint, ClientError> {
    let uri = match (address.split_once("://"), tls) {
        (Some((_, host_port)), Some(_)) => format!("https://{host_port}"),
        (Some(_), None) => address.to_owned(),
        (None, Some(_)) => format!("https://{address}"),
        (None, None) => format!("http://{address}"),
    };
    let endpoint = Endpoint::from_shared(uri).map_err(|e| ClientError::InvalidAddress {
        address: address.to_owned(),
        reason: e.to_string(),
    })?;
    let endpoint = endpoint.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true);
    match tls {
        Some(tls) => endpoint
            .tls_config(tls.config())
            .map_err(|e| ClientError::Tls(error_chain(&e))),
        None => Ok(endpoint),
    }
}

/// An error with its causes: tonic's own message says only "transport error".
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut reason = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        reason.push_str(": ");
        reason.push_str(&inner.to_string());
        cause = inner.source();
    }
    reason
}
