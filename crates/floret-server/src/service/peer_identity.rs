//! Who calls on the peer port. Under mutual TLS, an interceptor finds the
//! member that the caller's certificate names ([`identify_members`]) and
//! refuses a certificate that names none; the raft handlers then refuse a
//! message that claims to come from another node ([`check_sender`]), so a
//! node's certificate cannot be used to vote or lead as another.
//!
//! IMPLEMENTATION CAVEATS
//! - Without TLS (a loopback or `insecure` cluster) callers are not
//!   identified and every claim is taken as is.
//! - Calls that name no sender (forwarded produces, settles, status) are
//!   open to every member.

use std::sync::Arc;

use floret_cluster::{Peers, member_name, member_named_by};
use floret_store::NodeId;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// The member the caller's certificate names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIdentity(pub NodeId);

/// Identifies every caller as one of the members `peers` holds at the
/// time of the call, by its certificate (`mutual_tls`), refusing with
/// PERMISSION_DENIED one whose certificate names no member; without TLS
/// lets every call through unidentified.
pub fn identify_members(
    peers: Arc<Peers>,
    mutual_tls: bool,
) -> impl Interceptor + Clone + Send + Sync + 'static {
    move |mut request: Request<()>| {
        if !mutual_tls {
            return Ok(request);
        }
        let members = peers.node_ids();
        let named = request
            .peer_certs()
            .and_then(|chain| chain.first().map(|leaf| member_named_by(leaf, &members)));
        match named {
            Some(Some(node)) => {
                request.extensions_mut().insert(PeerIdentity(node));
                Ok(request)
            }
            Some(None) => Err(Status::permission_denied(format!(
                "the peer certificate names no member of this cluster (members' certificates name {})",
                members
                    .iter()
                    .map(|&node| member_name(node))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
            None => Err(Status::permission_denied(
                "the peer port takes only members presenting their certificate",
            )),
        }
    }
}

/// The identified caller of `request`, if the peer port identifies them.
pub fn caller<T>(request: &Request<T>) -> Option<NodeId> {
    request
        .extensions()
        .get::<PeerIdentity>()
        .map(|identity| identity.0)
}

/// A raft message claiming to come from `claimed` is taken only from that
/// member (or from anyone when callers are not identified).
pub fn check_sender(caller: Option<NodeId>, claimed: NodeId) -> Result<(), Status> {
    match caller {
        Some(caller) if caller != claimed => Err(Status::permission_denied(format!(
            "the caller's certificate names node {caller}, but the raft message claims to come from node {claimed}"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_cannot_send_raft_messages_as_another() {
        assert!(check_sender(Some(2), 2).is_ok());
        let refused = check_sender(Some(3), 1).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(refused.message().contains("node 3"), "{refused:?}");
        assert!(check_sender(None, 1).is_ok());
    }
}
