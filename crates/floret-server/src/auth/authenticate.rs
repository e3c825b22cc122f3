//! The interceptor that names the caller of every Floret and Admin call:
//! reads `authorization: Bearer <token>` and verifies the token against the
//! node's keys (remembering tokens it verified, until they expire), or
//! without a token takes the tenant the connection's client certificate
//! stands for, and leaves a [`Caller`] in the request; without keys or
//! client certificates every call is the anonymous tenant. Refusals are
//! UNAUTHENTICATED, logged under `audit` and counted.

use std::sync::{Arc, LazyLock};

use tonic::{Request, Status};

use super::{Caller, CertificateTenants, TokenRefusal, TokenVerifier, VerifyKey, count_refusal};

/// Most verified tokens remembered; past it the memory starts again empty.
const MAX_VERIFIED_TOKENS: usize = 4_096;

/// Tokens already verified, with the caller each names: a client sends the
/// same token on every call, and an Ed25519 check costs about 57 us, a
/// lookup well under one. Only tokens that verified are kept, so strangers
/// cannot fill it; an entry is used only until its token's expiry.
#[derive(Debug, Default)]
struct VerifiedTokens {
    callers: std::sync::Mutex<std::collections::HashMap<String, Arc<Caller>>>,
}

impl VerifiedTokens {
    fn get(&self, token: &str, now_unix_s: u64) -> Option<Arc<Caller>> {
        let callers = self
            .callers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        callers
            .get(token)
            .filter(|caller| caller.expires_unix_s().is_some_and(|exp| exp > now_unix_s))
            .cloned()
    }

    fn insert(&self, token: &str, caller: &Arc<Caller>) {
        let mut callers = self
            .callers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if callers.len() >= MAX_VERIFIED_TOKENS {
            callers.clear();
        }
        callers.insert(token.to_owned(), caller.clone());
    }
}

/// The caller of every call to a node without token keys, shared.
static ANONYMOUS: LazyLock<Arc<Caller>> = LazyLock::new(|| Arc::new(Caller::anonymous()));

/// The interceptor that names the caller of every Floret and Admin call.
#[derive(Debug, Clone)]
pub struct Authenticate {
    verifier: Option<std::sync::Arc<TokenVerifier>>,
    verified: std::sync::Arc<VerifiedTokens>,
    certificates: Option<Arc<CertificateTenants>>,
}

impl Authenticate {
    /// Checks tokens against `verifier` and client certificates against
    /// `certificates`; neither: every call is anonymous.
    pub fn new(verifier: Option<TokenVerifier>, certificates: Option<CertificateTenants>) -> Self {
        Self {
            verifier: verifier.map(std::sync::Arc::new),
            verified: std::sync::Arc::default(),
            certificates: certificates.map(Arc::new),
        }
    }

    /// The caller a request's metadata names, or else the client
    /// certificate `leaf` (DER) its connection presented, at `now_unix_s`.
    pub fn caller(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        leaf: Option<&[u8]>,
        now_unix_s: u64,
    ) -> Result<Arc<Caller>, Unauthenticated> {
        if self.verifier.is_none() && self.certificates.is_none() {
            return Ok(ANONYMOUS.clone());
        }
        let Some(header) = metadata.get("authorization") else {
            return self.certificate_caller(leaf);
        };
        let Some(verifier) = &self.verifier else {
            return Err(Unauthenticated::new(
                "malformed",
                "this node takes no tokens (it has no token keys): present a client certificate that stands for your tenant".into(),
            ));
        };
        let text = header.to_str().map_err(|_| {
            Unauthenticated::new("malformed", "authorization metadata is not ASCII".into())
        })?;
        let token = text.strip_prefix("Bearer ").ok_or(Unauthenticated::new(
            "malformed",
            "authorization metadata must be `Bearer <token>`".into(),
        ))?;
        let token = token.trim();
        if let Some(caller) = self.verified.get(token, now_unix_s) {
            return Ok(caller);
        }
        let claims = verifier.verify(token, now_unix_s).map_err(|refusal| {
            Unauthenticated::new(refusal_reason(&refusal), refusal.to_string())
        })?;
        let caller = Arc::new(
            Caller::from_claims(claims).map_err(|why| Unauthenticated::new("claims", why))?,
        );
        self.verified.insert(token, &caller);
        Ok(caller)
    }

    /// The tenant the client certificate `leaf` stands for, when a call
    /// carries no token.
    fn certificate_caller(&self, leaf: Option<&[u8]>) -> Result<Arc<Caller>, Unauthenticated> {
        match (&self.certificates, leaf) {
            (Some(certificates), Some(leaf)) => certificates.caller(leaf).ok_or_else(|| {
                Unauthenticated::new(
                    "certificate",
                    "the client certificate stands for no tenant of this node (auth.client_certificates); send a token instead".into(),
                )
            }),
            (Some(_), None) => Err(Unauthenticated::new(
                "missing",
                "no authorization metadata and no client certificate: this node needs `authorization: Bearer <token>` (floret --token, FLORET_TOKEN) or a client certificate that stands for a tenant".into(),
            )),
            (None, _) => Err(Unauthenticated::new(
                "missing",
                "no authorization metadata: this node needs `authorization: Bearer <token>` on every call (floret --token, FLORET_TOKEN)".into(),
            )),
        }
    }
}

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let now_unix_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let certificates = request.peer_certs();
        let leaf = certificates
            .as_ref()
            .and_then(|chain| chain.first())
            .map(|leaf| leaf.as_ref());
        match self.caller(request.metadata(), leaf, now_unix_s) {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
                Ok(request)
            }
            Err(refusal) => {
                tracing::warn!(target: "audit", reason = refusal.reason, message = ?refusal.message, "call refused: not authenticated");
                count_refusal(refusal.reason);
                Err(Status::unauthenticated(refusal.message))
            }
        }
    }
}

/// A call without a token this node takes: UNAUTHENTICATED.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unauthenticated {
    /// The metric's `reason` label.
    pub reason: &'static str,
    /// What was wrong.
    pub message: String,
}

impl Unauthenticated {
    fn new(reason: &'static str, message: String) -> Self {
        Self { reason, message }
    }
}

/// The verifier over the public keys in `paths`; none when there are none
/// (development mode).
pub fn load_verifier(paths: &[std::path::PathBuf]) -> Result<Option<TokenVerifier>, String> {
    if paths.is_empty() {
        return Ok(None);
    }
    let keys = paths
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .map_err(|error| format!("cannot read token key {}: {error}", path.display()))?;
            VerifyKey::from_pem(&text)
                .map_err(|why| format!("token key {} is not usable: {why}", path.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(TokenVerifier::new(keys)))
}

fn refusal_reason(refusal: &TokenRefusal) -> &'static str {
    match refusal {
        TokenRefusal::Malformed(_) | TokenRefusal::TooLong { .. } => "malformed",
        TokenRefusal::Algorithm(_) | TokenRefusal::UnknownKey(_) => "unknown_key",
        TokenRefusal::BadSignature => "bad_signature",
        TokenRefusal::Expired { .. } => "expired",
        TokenRefusal::BadClaims(_) => "claims",
    }
}
