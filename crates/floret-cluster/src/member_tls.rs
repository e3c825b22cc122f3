//! Mutual TLS between the members of a cluster: the name every member
//! certificate carries ([`member_name`]), the node id a peer's certificate
//! names ([`member_named_by`]), and what a node presents and trusts when it
//! dials another ([`MemberTls`]); and whether a client's certificate
//! carries a name ([`certificate_carries_name`]).
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

/// The member whose name `certificate` (DER) carries, if it names exactly
/// one of `members` (a certificate naming two could act as either). The
/// caller has already verified it against the cluster's CA (the TLS
/// handshake does).
pub fn member_named_by(certificate: &[u8], members: &[NodeId]) -> Option<NodeId> {
    let der = CertificateDer::from(certificate);
    let certificate = webpki::EndEntityCert::try_from(&der).ok()?;
    let mut named = members.iter().copied().filter(|&node| {
        DnsName::try_from(member_name(node)).is_ok_and(|name| {
            certificate
                .verify_is_valid_for_subject_name(&ServerName::DnsName(name))
                .is_ok()
        })
    });
    match (named.next(), named.next()) {
        (Some(node), None) => Some(node),
        _ => None,
    }
}

/// Whether `certificate` (DER, already verified by the TLS handshake)
/// carries the DNS name `name`: how a client certificate is matched to
/// the tenant it stands for.
pub fn certificate_carries_name(certificate: &[u8], name: &str) -> bool {
    let der = CertificateDer::from(certificate);
    let (Ok(certificate), Ok(name)) = (
        webpki::EndEntityCert::try_from(&der),
        DnsName::try_from(name.to_owned()),
    ) else {
        return false;
    };
    certificate
        .verify_is_valid_for_subject_name(&ServerName::DnsName(name))
        .is_ok()
}

/// Whether `name` is a DNS name a certificate can carry.
pub fn is_dns_name(name: &str) -> bool {
    DnsName::try_from(name.to_owned()).is_ok()
}

/// Whether the first certificate of the PEM chain `chain` names `node`
/// (and no other of `members`): a node checks its own at start, so a
/// swapped certificate fails there, not as refusals at its peers.
pub fn pem_names_member(chain: &[u8], node: NodeId, members: &[NodeId]) -> bool {
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(chain)
        .next()
        .and_then(Result::ok)
        .is_some_and(|leaf| member_named_by(&leaf, members) == Some(node))
}

/// A TLS error with its causes: tonic's own message says only "transport error".
pub fn tls_error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut reason = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        reason.push_str(": ");
        reason.push_str(&inner.to_string());
        cause = inner.source();
    }
    reason
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
