//! Bearer tokens: what a token claims, how a node checks one, and how
//! `floret token create` signs one.
//!
//! A token is a JSON Web Token signed with Ed25519 (`EdDSA`): its subject is
//! the tenant, and it names the tenant's roles, the queue patterns it may
//! use and an expiry. Nodes hold only public keys (`PUBLIC KEY` PEM files,
//! any number at once, so a new key can be rolled out before the old one is
//! retired); the signing key (`PRIVATE KEY`, PKCS#8) stays with whoever
//! issues tokens. The header's `kid` names the key that signed, as
//! [`key_id`] derives it from the public key.
//!
//! Verification takes the time as an argument, so expiry is tested without
//! clocks.
//!
//! IMPLEMENTATION CAVEATS
//! - No revocation list: a token is good until it expires or its key is
//!   removed from every node.
//! - Only Ed25519; HMAC secrets and client certificates that map to a
//!   tenant are not taken.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use ring::signature::KeyPair as _;
use serde::{Deserialize, Serialize};

use super::{QueuePattern, Role, TenantName};

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo; the 32 key bytes follow.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
/// Longest token taken, so a huge header cannot cost a node much.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// What a token says about its bearer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenClaims {
    /// The tenant.
    #[serde(rename = "sub")]
    pub tenant: String,
    /// What it may do.
    pub roles: Vec<Role>,
    /// The queues it may use, as patterns (`*` matches any run of characters).
    pub queues: Vec<String>,
    /// When it stops being valid, in seconds since the Unix epoch.
    pub exp: u64,
    /// When it was signed, in seconds since the Unix epoch.
    pub iat: u64,
}

/// Why a token is not taken; said to the caller as UNAUTHENTICATED.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    /// Not three base64url parts with a JSON header and claims.
    #[error("malformed token: {0}")]
    Malformed(String),
    /// Over [`MAX_TOKEN_BYTES`].
    #[error("token too long: {len} bytes > {MAX_TOKEN_BYTES}")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Signed with an algorithm other than EdDSA.
    #[error("token signed with {0}: only EdDSA (Ed25519) tokens are taken")]
    Algorithm(String),
    /// Its `kid` names no key this node holds.
    #[error(
        "token signed by key {0:?}, which this node does not hold (rotated out, or another cluster's)"
    )]
    UnknownKey(String),
    /// The signature does not verify.
    #[error("token signature does not verify")]
    BadSignature,
    /// Past its expiry.
    #[error("token expired {ago_s} s ago")]
    Expired {
        /// Seconds since it expired.
        ago_s: u64,
    },
    /// Verified, but what it claims cannot be used.
    #[error("token claims are not valid: {0}")]
    BadClaims(String),
}

/// A public key that verifies tokens.
#[derive(Clone)]
pub struct VerifyKey {
    id: String,
    key: DecodingKey,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("VerifyKey")
            .field("id", &self.id)
            .finish()
    }
}

impl VerifyKey {
    /// A key from a `PUBLIC KEY` PEM (Ed25519 SubjectPublicKeyInfo).
    pub fn from_pem(text: &str) -> Result<Self, String> {
        let der = pem_body(text, "PUBLIC KEY")?;
        let raw = der
            .strip_prefix(&ED25519_SPKI_PREFIX[..])
            .filter(|raw| raw.len() == 32)
            .ok_or("not an Ed25519 public key")?;
        Ok(Self {
            id: key_id(raw),
            key: DecodingKey::from_ed_der(raw),
        })
    }

    /// The id tokens signed by the matching private key carry.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// A private key that signs tokens.
pub struct SigningKey {
    pkcs8: Vec<u8>,
    public: Vec<u8>,
}

impl SigningKey {
    /// A new random key.
    pub fn generate() -> Result<Self, String> {
        let random = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&random)
            .map_err(|_| "cannot generate an Ed25519 key")?;
        Self::from_pkcs8(pkcs8.as_ref())
    }

    /// A key from a `PRIVATE KEY` PEM (PKCS#8 v2, as [`SigningKey::to_pem`] writes).
    pub fn from_pem(text: &str) -> Result<Self, String> {
        Self::from_pkcs8(&pem_body(text, "PRIVATE KEY")?)
    }

    fn from_pkcs8(pkcs8: &[u8]) -> Result<Self, String> {
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8)
            .map_err(|error| format!("not an Ed25519 PKCS#8 v2 private key: {error}"))?;
        Ok(Self {
            pkcs8: pkcs8.to_vec(),
            public: pair.public_key().as_ref().to_vec(),
        })
    }

    /// The private key as PEM.
    pub fn to_pem(&self) -> String {
        pem("PRIVATE KEY", &self.pkcs8)
    }

    /// The matching public key as PEM, for the nodes.
    pub fn public_pem(&self) -> String {
        let mut der = ED25519_SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.public);
        pem("PUBLIC KEY", &der)
    }

    /// The id of this key pair.
    pub fn id(&self) -> String {
        key_id(&self.public)
    }

    /// A token carrying `claims`, signed by this key.
    pub fn sign(&self, claims: &TokenClaims) -> Result<String, String> {
        check_claims(claims)?;
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.id());
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_ed_der(&self.pkcs8))
            .map_err(|error| format!("cannot sign the token: {error}"))
    }
}

/// The keys a node verifies tokens with.
#[derive(Debug, Clone)]
pub struct TokenVerifier {
    keys: Vec<VerifyKey>,
}

impl TokenVerifier {
    /// A verifier over `keys` (at least one).
    pub fn new(keys: Vec<VerifyKey>) -> Self {
        Self { keys }
    }

    /// The claims of `token` if one of the keys signed it and it has not
    /// expired at `now_unix_s`.
    pub fn verify(&self, token: &str, now_unix_s: u64) -> Result<TokenClaims, TokenRefusal> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(TokenRefusal::TooLong { len: token.len() });
        }
        let header = jsonwebtoken::decode_header(token)
            .map_err(|error| TokenRefusal::Malformed(error.to_string()))?;
        if header.alg != Algorithm::EdDSA {
            return Err(TokenRefusal::Algorithm(format!("{:?}", header.alg)));
        }
        let kid = header.kid.unwrap_or_default();
        let key = self
            .keys
            .iter()
            .find(|key| key.id == kid)
            .ok_or(TokenRefusal::UnknownKey(kid))?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.validate_exp = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let claims = jsonwebtoken::decode::<TokenClaims>(token, &key.key, &validation)
            .map_err(|error| match error.kind() {
                jsonwebtoken::errors::ErrorKind::InvalidSignature => TokenRefusal::BadSignature,
                jsonwebtoken::errors::ErrorKind::Json(_) => {
                    TokenRefusal::BadClaims(error.to_string())
                }
                _ => TokenRefusal::Malformed(error.to_string()),
            })?
            .claims;
        if claims.exp <= now_unix_s {
            return Err(TokenRefusal::Expired {
                ago_s: now_unix_s - claims.exp,
            });
        }
        check_claims(&claims).map_err(TokenRefusal::BadClaims)?;
        Ok(claims)
    }
}

/// Claims that a node can act on: a valid tenant name, known roles, valid
/// queue patterns.
fn check_claims(claims: &TokenClaims) -> Result<(), String> {
    TenantName::parse(&claims.tenant)?;
    if claims.roles.is_empty() {
        return Err("no roles".into());
    }
    for pattern in &claims.queues {
        QueuePattern::parse(pattern)?;
    }
    Ok(())
}

/// The id of a public key: the first 8 bytes of its SHA-256, in hex.
fn key_id(public: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, public);
    digest.as_ref()[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Base64 text between `-----BEGIN label-----` and `-----END label-----`.
fn pem_body(text: &str, label: &str) -> Result<Vec<u8>, String> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text
        .find(&begin)
        .ok_or_else(|| format!("no {begin} line"))?
        + begin.len();
    let stop = text[start..]
        .find(&end)
        .ok_or_else(|| format!("no {end} line"))?
        + start;
    let body: String = text[start..stop]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    STANDARD
        .decode(body)
        .map_err(|error| format!("bad base64 in the {label}: {error}"))
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let mut text = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        text.push_str(&String::from_utf8_lossy(line));
        text.push('\n');
    }
    text.push_str(&format!("-----END {label}-----\n"));
    text
}

#[cfg(test)]
mod tests;
