//! Mutual TLS between the members of a cluster: the name every member
//! certificate carries ([`member_name`]), the node id a peer's certificate
//! names ([`member_named_by`]), and what a node presents and trusts when it
//! dials another ([`MemberTls`]).
//!
//! Every node has a certificate signed by the cluster's CA with the DNS
//! name `node-<id>.floret`. A node dials a peer expecting that name for the
//! peer's id (whatever address it dials), and the peer port takes only
//! callers whose certificate, signed by the same CA, names a member.
//!
//! IMPLEMENTATION CAVEATS
//! - No revocation lists: a member's certificate stays valid until it
//!   expires or the cluster's CA is replaced.

use floret_store::NodeId;
use rustls_pki_types::{CertificateDer, DnsName, ServerName};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The DNS name a member certificate for `node` carries.
pub fn member_name(node: NodeId) -> String {
    format!("node-{node}.floret")
}

/// The member whose name `certificate` (DER) carries, if any of `members`.
/// The caller has already verified it against the cluster's CA (the TLS
/// handshake does).
pub fn member_named_by(certificate: &[u8], members: &[NodeId]) -> Option<NodeId> {
    let der = CertificateDer::from(certificate);
    let certificate = webpki::EndEntityCert::try_from(&der).ok()?;
    members.iter().copied().find(|&node| {
        DnsName::try_from(member_name(node)).is_ok_and(|name| {
            certificate
                .verify_is_valid_for_subject_name(&ServerName::DnsName(name))
                .is_ok()
        })
    })
}

/// What a node presents to the peers it dials, and the CA it trusts them by.
#[derive(Debug, Clone)]
pub struct MemberTls {
    /// This node's member certificate and key.
    pub identity: Identity,
    /// The cluster's CA.
    pub ca: Certificate,
}

impl MemberTls {
    /// The TLS settings for dialling `node`: its member name is expected,
    /// whatever address it is dialled on.
    pub fn dialling(&self, node: NodeId) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(self.ca.clone())
            .identity(self.identity.clone())
            .domain_name(member_name(node))
    }
}
