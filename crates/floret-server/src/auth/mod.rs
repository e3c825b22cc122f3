//! Who is calling, and what they may do: the tenant behind each call on the
//! client port, its roles and queues, and the checks every service makes
//! before it acts.
//!
//! With token keys configured (`auth.token_keys`), every Floret and Admin
//! call must carry `authorization: Bearer <token>` ([`token`]), or come on
//! a TLS connection whose client certificate stands for a tenant
//! (`auth.client_certificates`, [`CertificateTenants`]); the
//! [`Authenticate`] interceptor checks it and leaves a [`Caller`] in the
//! request's extensions. Without either (development mode, loopback only
//! unless `--insecure`) every call is the anonymous tenant, which may do
//! everything. Health and reflection need no token.
//!
//! A tenant's producers live in its own namespace: the node stores and
//! shows tenant `acme`'s producer `p1` as `acme/p1` ([`Caller::producer_id`]),
//! so no tenant can produce as another's producer. Refusals are logged
//! under the tracing target `audit` and counted in
//! `floret_auth_refusals_total{reason}`.
//!
//! IMPLEMENTATION CAVEATS
//! - A client certificate is checked when its connection is made: calls on
//!   a connection go on after the certificate expires, until it closes.
//! - A request that did not pass [`Authenticate`] is taken as the anonymous
//!   tenant ([`Caller::of`]); every Floret and Admin service is behind it.

mod authenticate;
mod certificates;
pub mod token;

use serde::{Deserialize, Serialize};
use tonic::{Request, Status};

pub use authenticate::{Authenticate, Unauthenticated, load_verifier};
pub use certificates::{CertificateTenants, tenant_certificate_name};
pub use token::{SigningKey, TokenClaims, TokenRefusal, TokenVerifier, VerifyKey};

/// Longest tenant name.
pub const MAX_TENANT_BYTES: usize = 64;
/// What separates a tenant from its producer in a stored producer id.
pub const TENANT_SEPARATOR: char = floret_store::PRODUCER_GROUP_SEPARATOR;

/// What a tenant may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Produce into its queues.
    Produce,
    /// Consume, ack and nack its queues, and read their statistics.
    Consume,
    /// Everything, on every queue: policies, dead letters, cluster status.
    Admin,
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "produce" => Ok(Self::Produce),
            "consume" => Ok(Self::Consume),
            "admin" => Ok(Self::Admin),
            other => Err(format!(
                "unknown role {other:?}: use produce, consume or admin"
            )),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Self::Produce => "produce",
            Self::Consume => "consume",
            Self::Admin => "admin",
        })
    }
}

/// A tenant's name: 1..=64 ASCII letters, digits, `_` or `-`. No `.`, so
/// that the queue pattern `acme.*` cannot match a queue of tenant
/// `acme-eu` (`acme-eu.orders`) the way `acme-*` would.
pub struct TenantName;

impl TenantName {
    /// Checks `name`.
    pub fn parse(name: &str) -> Result<&str, String> {
        if name.is_empty() || name.len() > MAX_TENANT_BYTES {
            return Err(format!(
                "tenant name must be 1 to {MAX_TENANT_BYTES} bytes, not {}",
                name.len()
            ));
        }
        match name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-')))
        {
            Some(bad) => Err(format!(
                "tenant name {name:?} has {bad:?}: use ASCII letters, digits, '_' or '-'"
            )),
            None => Ok(name),
        }
    }
}

/// A queue name pattern: `*` matches any run of characters (none included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuePattern(String);

impl QueuePattern {
    /// Checks `pattern`: the characters of a queue name, and `*`.
    pub fn parse(pattern: &str) -> Result<Self, String> {
        if pattern.is_empty() || pattern.len() > 2 * crate::request::MAX_QUEUE_NAME_BYTES {
            return Err(format!("queue pattern {pattern:?} is empty or too long"));
        }
        match pattern
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '*')))
        {
            Some(bad) => Err(format!(
                "queue pattern {pattern:?} has {bad:?}: use a queue name's characters and '*'"
            )),
            None => Ok(Self(pattern.to_owned())),
        }
    }

    /// Whether `queue` matches.
    pub fn matches(&self, queue: &str) -> bool {
        glob_matches(self.0.as_bytes(), queue.as_bytes())
    }
}

/// `*`-only glob matching, linear in practice: on a mismatch it retries
/// from just after the last `*` with one more character swallowed.
fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut last_star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            last_star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star, swallowed)) = last_star {
            p = star + 1;
            t = swallowed + 1;
            last_star = Some((star, swallowed + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// The tenant behind a call, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// None: the anonymous tenant of a node without token keys.
    tenant: Option<String>,
    roles: Vec<Role>,
    queues: Vec<QueuePattern>,
    /// When the token stops being valid, in seconds since the Unix epoch
    /// (none for the anonymous tenant).
    expires_unix_s: Option<u64>,
}

impl Caller {
    /// The one tenant of a node without token keys: every role, every queue,
    /// producer ids as given.
    pub fn anonymous() -> Self {
        Self {
            tenant: None,
            roles: vec![Role::Admin],
            queues: Vec::new(),
            expires_unix_s: None,
        }
    }

    /// The tenant a verified token names.
    pub fn from_claims(claims: TokenClaims) -> Result<Self, String> {
        Self::named(
            &claims.tenant,
            claims.roles,
            &claims.queues,
            Some(claims.exp),
        )
    }

    /// The tenant a client certificate stands for (`auth.client_certificates`):
    /// valid as long as the connection that presented it.
    pub fn from_certificate(mapping: &crate::config::CertificateTenant) -> Result<Self, String> {
        Self::named(
            &mapping.tenant,
            mapping.roles.clone(),
            &mapping.queues,
            None,
        )
    }

    fn named(
        tenant: &str,
        roles: Vec<Role>,
        queues: &[String],
        expires_unix_s: Option<u64>,
    ) -> Result<Self, String> {
        let queues = queues
            .iter()
            .map(|pattern| QueuePattern::parse(pattern))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            tenant: Some(TenantName::parse(tenant)?.to_owned()),
            roles,
            queues,
            expires_unix_s,
        })
    }

    /// When the caller's token expires, in seconds since the Unix epoch:
    /// a consume stream it opened ends then.
    pub fn expires_unix_s(&self) -> Option<u64> {
        self.expires_unix_s
    }

    /// The tenant's name, for logs (`-` when anonymous).
    pub fn tenant(&self) -> &str {
        self.tenant.as_deref().unwrap_or("-")
    }

    /// Whether the caller is an administrator.
    pub fn is_admin(&self) -> bool {
        self.roles.contains(&Role::Admin)
    }

    /// Passes if the caller holds `role` (or admin) on `queue`.
    pub fn require(&self, role: Role, queue: &str) -> Result<(), Denied> {
        if self.is_admin() {
            return Ok(());
        }
        if !self.roles.contains(&role) {
            return Err(Denied::new(
                "role",
                format!(
                    "tenant {} lacks the {role} role this call needs",
                    self.tenant()
                ),
            ));
        }
        if !self.queues.iter().any(|pattern| pattern.matches(queue)) {
            return Err(Denied::new(
                "queue",
                format!(
                    "tenant {} may not use queue {queue:?}: its token's queue patterns do not match it",
                    self.tenant()
                ),
            ));
        }
        Ok(())
    }

    /// Passes if the caller may produce into or consume `queue` (for
    /// reading its statistics).
    pub fn require_any(&self, queue: &str) -> Result<(), Denied> {
        let consume = self.require(Role::Consume, queue);
        match consume {
            Err(denied) if denied.reason == "role" => self.require(Role::Produce, queue),
            decided => decided,
        }
    }

    /// Passes if the caller is an administrator.
    pub fn require_admin(&self, action: &str) -> Result<(), Denied> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(Denied::new(
                "admin",
                format!(
                    "{action} needs the admin role; tenant {} does not have it",
                    self.tenant()
                ),
            ))
        }
    }

    /// The stored id of the caller's producer `producer`: `tenant/producer`,
    /// or `producer` itself for the anonymous tenant.
    pub fn producer_id(&self, producer: &str) -> String {
        match &self.tenant {
            Some(tenant) => format!("{tenant}{TENANT_SEPARATOR}{producer}"),
            None => producer.to_owned(),
        }
    }

    /// Whether a stored producer id is one of the caller's producers.
    pub fn owns_producer(&self, producer_id: &str) -> bool {
        match &self.tenant {
            None => true,
            Some(tenant) => producer_id
                .strip_prefix(tenant.as_str())
                .is_some_and(|rest| rest.starts_with(TENANT_SEPARATOR)),
        }
    }

    /// The caller of `request`, as [`Authenticate`] left it (shared, not
    /// copied per call); anonymous for requests that never went through it.
    pub fn of<T>(request: &Request<T>) -> std::sync::Arc<Self> {
        request
            .extensions()
            .get::<std::sync::Arc<Caller>>()
            .cloned()
            .unwrap_or_else(|| std::sync::Arc::new(Self::anonymous()))
    }
}

/// A call the caller is not allowed to make: PERMISSION_DENIED.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Denied {
    /// Which check refused it (the metric's `reason` label).
    pub reason: &'static str,
    /// What was wrong.
    pub message: String,
}

impl Denied {
    fn new(reason: &'static str, message: String) -> Self {
        Self { reason, message }
    }

    /// Logs and counts the refusal of `method` for `caller`.
    pub fn audit(&self, caller: &Caller, method: &str) {
        tracing::warn!(target: "audit", tenant = caller.tenant(), method, reason = self.reason, message = ?self.message, "call refused");
        count_refusal(self.reason);
    }
}

impl From<Denied> for Status {
    fn from(denied: Denied) -> Self {
        Status::permission_denied(denied.message)
    }
}

/// Counts a refusal in `floret_auth_refusals_total`.
pub(crate) fn count_refusal(reason: &'static str) {
    metrics::counter!("floret_auth_refusals_total", "reason" => reason).increment(1);
}

/// Logs an administrator's action under the `audit` target.
pub fn audit_admin_action(caller: &Caller, action: &str, detail: &str) {
    tracing::info!(target: "audit", tenant = caller.tenant(), action, detail, "admin action");
}

#[cfg(test)]
mod tests;
