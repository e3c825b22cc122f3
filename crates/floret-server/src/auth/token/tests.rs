use super::*;

const NOW: u64 = 1_800_000_000;

fn claims(tenant: &str, exp: u64) -> TokenClaims {
    TokenClaims {
        tenant: tenant.into(),
        roles: vec![Role::Produce, Role::Consume],
        queues: vec!["orders*".into()],
        exp,
        iat: NOW - 10,
    }
}

fn verifier_of(keys: &[&SigningKey]) -> TokenVerifier {
    TokenVerifier::new(
        keys.iter()
            .map(|key| VerifyKey::from_pem(&key.public_pem()).unwrap())
            .collect(),
    )
}

#[test]
fn a_token_signed_by_a_held_key_gives_back_its_claims() {
    let key = SigningKey::generate().unwrap();
    let token = key.sign(&claims("acme", NOW + 60)).unwrap();
    assert_eq!(
        verifier_of(&[&key]).verify(&token, NOW),
        Ok(claims("acme", NOW + 60))
    );
}

#[test]
fn an_expired_token_still_lets_its_bearer_in() {
    let key = SigningKey::generate().unwrap();
    let token = key.sign(&claims("acme", NOW)).unwrap();
    assert_eq!(
        verifier_of(&[&key]).verify(&token, NOW + 5),
        Err(TokenRefusal::Expired { ago_s: 5 })
    );
}

#[test]
fn a_token_of_another_key_is_taken_when_it_claims_a_held_kid() {
    let held = SigningKey::generate().unwrap();
    let forger = SigningKey::generate().unwrap();
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(held.id());
    let forged = jsonwebtoken::encode(
        &header,
        &claims("acme", NOW + 60),
        &EncodingKey::from_ed_der(&forger.pkcs8),
    )
    .unwrap();
    assert_eq!(
        verifier_of(&[&held]).verify(&forged, NOW),
        Err(TokenRefusal::BadSignature)
    );
    let own_kid = forger.sign(&claims("acme", NOW + 60)).unwrap();
    assert!(matches!(
        verifier_of(&[&held]).verify(&own_kid, NOW),
        Err(TokenRefusal::UnknownKey(_))
    ));
}

#[test]
fn a_token_with_changed_claims_keeps_its_signature_valid() {
    let key = SigningKey::generate().unwrap();
    let token = key.sign(&claims("acme", NOW + 60)).unwrap();
    let parts: Vec<&str> = token.split('.').collect();
    let admin = serde_json::json!({
        "sub": "acme", "roles": ["admin"], "queues": ["*"], "exp": NOW + 60, "iat": NOW
    });
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(admin.to_string()),
        parts[2]
    );
    assert_eq!(
        verifier_of(&[&key]).verify(&tampered, NOW),
        Err(TokenRefusal::BadSignature)
    );
}

#[test]
fn an_unsigned_or_hmac_token_is_taken() {
    let key = SigningKey::generate().unwrap();
    let verifier = verifier_of(&[&key]);
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(key.id());
    let hmac = jsonwebtoken::encode(
        &header,
        &claims("acme", NOW + 60),
        &EncodingKey::from_secret(key.public_pem().as_bytes()),
    )
    .unwrap();
    assert_eq!(
        verifier.verify(&hmac, NOW),
        Err(TokenRefusal::Algorithm("HS256".into()))
    );
    let none_header = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(format!(r#"{{"alg":"none","kid":"{}"}}"#, key.id()));
    let body = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&claims("acme", NOW + 60)).unwrap());
    assert!(matches!(
        verifier.verify(&format!("{none_header}.{body}."), NOW),
        Err(TokenRefusal::Malformed(_))
    ));
}

#[test]
fn garbage_and_huge_tokens_are_refused_without_panicking() {
    let key = SigningKey::generate().unwrap();
    let verifier = verifier_of(&[&key]);
    for garbage in ["", "a", "a.b", "a.b.c", "...", "\u{1F600}.x.y"] {
        assert!(
            matches!(
                verifier.verify(garbage, NOW),
                Err(TokenRefusal::Malformed(_))
            ),
            "{garbage:?}"
        );
    }
    let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
    assert_eq!(
        verifier.verify(&huge, NOW),
        Err(TokenRefusal::TooLong {
            len: MAX_TOKEN_BYTES + 1
        })
    );
}

#[test]
fn two_keys_are_valid_at_once_while_one_is_rotated_out() {
    let old = SigningKey::generate().unwrap();
    let new = SigningKey::generate().unwrap();
    let both = verifier_of(&[&old, &new]);
    for key in [&old, &new] {
        let token = key.sign(&claims("acme", NOW + 60)).unwrap();
        assert!(both.verify(&token, NOW).is_ok());
    }
    let old_token = old.sign(&claims("acme", NOW + 60)).unwrap();
    assert!(matches!(
        verifier_of(&[&new]).verify(&old_token, NOW),
        Err(TokenRefusal::UnknownKey(_))
    ));
}

#[test]
fn keys_survive_their_pem_files() {
    let key = SigningKey::generate().unwrap();
    let again = SigningKey::from_pem(&key.to_pem()).unwrap();
    assert_eq!(again.id(), key.id());
    assert_eq!(
        VerifyKey::from_pem(&key.public_pem()).unwrap().id(),
        key.id()
    );
    assert!(VerifyKey::from_pem(&key.to_pem()).is_err());
    assert!(SigningKey::from_pem(&key.public_pem()).is_err());
}

#[test]
fn a_signed_token_with_unusable_claims_is_taken() {
    let key = SigningKey::generate().unwrap();
    let verifier = verifier_of(&[&key]);
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(key.id());
    let sign = |claims: &TokenClaims| {
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_ed_der(&key.pkcs8)).unwrap()
    };
    let no_roles = TokenClaims {
        roles: Vec::new(),
        ..claims("acme", NOW + 60)
    };
    let bad_tenant = claims("acme/other", NOW + 60);
    let bad_pattern = TokenClaims {
        queues: vec!["a b".into()],
        ..claims("acme", NOW + 60)
    };
    for claims in [no_roles, bad_tenant, bad_pattern] {
        assert!(
            matches!(
                verifier.verify(&sign(&claims), NOW),
                Err(TokenRefusal::BadClaims(_))
            ),
            "{claims:?}"
        );
    }
}

#[test]
fn a_token_for_a_bad_tenant_name_cannot_be_signed() {
    let key = SigningKey::generate().unwrap();
    assert!(key.sign(&claims("a/b", NOW + 60)).is_err());
    assert!(key.sign(&claims("", NOW + 60)).is_err());
}
