//! Client certificates that stand for tenants: `auth.client_certificates`
//! maps a DNS name a certificate carries to a tenant with its roles and
//! queues. The TLS handshake has already checked the certificate against
//! `auth.client_ca`; this module only finds whose it is.
//!
//! IMPLEMENTATION CAVEATS
//! - Names are matched one mapping after another: fine for the tens of
//!   certificates a cluster's services present, not for thousands.

use std::sync::Arc;

use floret_cluster::certificate_carries_name;

use super::Caller;
use crate::config::CertificateTenant;

/// The DNS name `floret certs --tenant <tenant>` puts in a tenant's client
/// certificate.
pub fn tenant_certificate_name(tenant: &str) -> String {
    format!("{tenant}.tenant.floret")
}

/// The tenants client certificates stand for.
#[derive(Debug)]
pub struct CertificateTenants {
    /// The DNS name a certificate carries, and the caller it makes.
    by_name: Vec<(String, Arc<Caller>)>,
}

impl CertificateTenants {
    /// The tenants `mappings` name; none when there are none.
    pub fn new(mappings: &[CertificateTenant]) -> Result<Option<Self>, String> {
        if mappings.is_empty() {
            return Ok(None);
        }
        let by_name = mappings
            .iter()
            .map(|mapping| {
                let caller = Caller::from_certificate(mapping).map_err(|why| {
                    format!("auth.client_certificates entry {:?}: {why}", mapping.name)
                })?;
                Ok((mapping.name.clone(), Arc::new(caller)))
            })
            .collect::<Result<_, String>>()?;
        Ok(Some(Self { by_name }))
    }

    /// The caller whose name the verified client certificate `leaf` (DER)
    /// carries, if any (the first listed, should it carry several).
    pub fn caller(&self, leaf: &[u8]) -> Option<Arc<Caller>> {
        self.by_name
            .iter()
            .find(|(name, _)| certificate_carries_name(leaf, name))
            .map(|(_, caller)| caller.clone())
    }
}
