use super::*;

fn tenant(name: &str, roles: &[Role], queues: &[&str]) -> Caller {
    Caller::from_claims(TokenClaims {
        tenant: name.into(),
        roles: roles.to_vec(),
        queues: queues.iter().map(|q| q.to_string()).collect(),
        exp: u64::MAX,
        iat: 0,
    })
    .unwrap()
}

#[test]
fn queue_patterns_match_only_what_they_say() {
    let cases = [
        ("orders*", "orders", true),
        ("orders*", "orders-eu", true),
        ("orders*", "order", false),
        ("*-eu", "orders-eu", true),
        ("*-eu", "orders-us", false),
        ("a*b*c", "abc", true),
        ("a*b*c", "axxbyyc", true),
        ("a*b*c", "axxbyy", false),
        ("*", "anything", true),
        ("exact", "exact", true),
        ("exact", "exactly", false),
        ("*ab", "aab", true),
        ("a*a", "aaa", true),
        ("a*a", "ab", false),
        ("*a*b*", "xxaxxbxx", true),
        ("**", "", true),
    ];
    for (pattern, queue, expected) in cases {
        assert_eq!(
            QueuePattern::parse(pattern).unwrap().matches(queue),
            expected,
            "{pattern} ~ {queue}"
        );
    }
    assert!(QueuePattern::parse("orders/x").is_err());
    assert!(QueuePattern::parse("").is_err());
}

#[test]
fn a_tenant_produces_into_another_tenants_queue() {
    let acme = tenant("acme", &[Role::Produce], &["acme.*"]);
    assert!(acme.require(Role::Produce, "acme.orders").is_ok());
    let denied = acme.require(Role::Produce, "globex.orders").unwrap_err();
    assert_eq!(denied.reason, "queue");
    assert!(denied.message.contains("globex.orders"));
    assert_eq!(
        acme.require(Role::Consume, "acme.orders")
            .unwrap_err()
            .reason,
        "role"
    );
}

#[test]
fn a_tenant_produces_as_another_tenants_producer() {
    let acme = tenant("acme", &[Role::Produce], &["*"]);
    assert_eq!(acme.producer_id("p1"), "acme/p1");
    assert_eq!(acme.producer_id("globex/p1"), "acme/globex/p1");
    assert!(acme.owns_producer("acme/p1"));
    assert!(!acme.owns_producer("acme2/p1"));
    assert!(!acme.owns_producer("globex/p1"));
    assert_eq!(Caller::anonymous().producer_id("p1"), "p1");
}

#[test]
fn a_tenant_reaches_a_queue_of_a_tenant_whose_name_extends_its_own() {
    assert!(TenantName::parse("acme-eu").is_ok());
    assert!(TenantName::parse("acme.eu").is_err());
    let acme = tenant("acme", &[Role::Produce], &["acme.*"]);
    assert!(acme.require(Role::Produce, "acme.orders").is_ok());
    assert!(acme.require(Role::Produce, "acme-eu.orders").is_err());
}

#[test]
fn a_consumer_reading_stats_of_a_queue_it_lacks_is_told_about_the_role() {
    let reader = tenant("acme", &[Role::Consume], &["acme.*"]);
    assert!(reader.require_any("acme.orders").is_ok());
    let denied = reader.require_any("globex.orders").unwrap_err();
    assert_eq!(denied.reason, "queue");
}

#[test]
fn a_non_admin_changes_policies() {
    let acme = tenant("acme", &[Role::Produce, Role::Consume], &["*"]);
    assert_eq!(acme.require_admin("SetPolicy").unwrap_err().reason, "admin");
    let root = tenant("ops", &[Role::Admin], &[]);
    assert!(root.require_admin("SetPolicy").is_ok());
    assert!(root.require(Role::Consume, "any").is_ok());
    assert!(Caller::anonymous().require_admin("SetPolicy").is_ok());
}

#[test]
fn calls_without_a_good_bearer_token_get_through() {
    let key = SigningKey::generate().unwrap();
    let verifier = TokenVerifier::new(vec![VerifyKey::from_pem(&key.public_pem()).unwrap()]);
    let authenticate = Authenticate::new(Some(verifier), None);
    let mut metadata = tonic::metadata::MetadataMap::new();
    assert_eq!(
        authenticate
            .caller(&metadata, None, 100)
            .unwrap_err()
            .reason,
        "missing"
    );
    metadata.insert("authorization", "Basic abc".parse().unwrap());
    assert_eq!(
        authenticate
            .caller(&metadata, None, 100)
            .unwrap_err()
            .reason,
        "malformed"
    );
    metadata.insert("authorization", "Bearer x.y.z".parse().unwrap());
    assert_eq!(
        authenticate
            .caller(&metadata, None, 100)
            .unwrap_err()
            .reason,
        "malformed"
    );
    let token = key
        .sign(&TokenClaims {
            tenant: "acme".into(),
            roles: vec![Role::Produce],
            queues: vec!["*".into()],
            exp: 200,
            iat: 0,
        })
        .unwrap();
    metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
    assert_eq!(
        authenticate.caller(&metadata, None, 100).unwrap().tenant(),
        "acme"
    );
    assert_eq!(
        authenticate.caller(&metadata, None, 150).unwrap().tenant(),
        "acme",
        "the second call takes the token verified by the first"
    );
    assert_eq!(
        authenticate
            .caller(&metadata, None, 300)
            .unwrap_err()
            .reason,
        "expired",
        "a token verified before still expires"
    );
    let anonymous = Authenticate::new(None, None);
    assert_eq!(
        anonymous.caller(&tonic::metadata::MetadataMap::new(), None, 0),
        Ok(std::sync::Arc::new(Caller::anonymous()))
    );
}

/// A certificate carrying the DNS names `names` (DER), as a CA would sign it.
fn certificate_carrying(names: &[&str]) -> Vec<u8> {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(
        names
            .iter()
            .map(|name| name.to_string())
            .collect::<Vec<_>>(),
    )
    .unwrap();
    params.self_signed(&key).unwrap().der().to_vec()
}

#[test]
fn a_client_certificate_stands_for_the_tenant_its_name_maps_to() {
    let mapping = |name: &str, tenant: &str| crate::config::CertificateTenant {
        name: name.into(),
        tenant: tenant.into(),
        roles: vec![Role::Produce],
        queues: vec![format!("{tenant}.*")],
    };
    let certificates = CertificateTenants::new(&[
        mapping("acme.tenant.floret", "acme"),
        mapping("globex.tenant.floret", "globex"),
    ])
    .unwrap();
    let authenticate = Authenticate::new(None, certificates);
    let no_token = tonic::metadata::MetadataMap::new();
    let globex = certificate_carrying(&["globex.tenant.floret"]);
    let caller = authenticate.caller(&no_token, Some(&globex), 0).unwrap();
    assert_eq!(caller.tenant(), "globex");
    assert!(caller.require(Role::Produce, "globex.orders").is_ok());
    assert!(caller.require(Role::Produce, "acme.orders").is_err());
    assert_eq!(caller.expires_unix_s(), None);
    let stranger = certificate_carrying(&["stranger.example.com"]);
    let refused = authenticate
        .caller(&no_token, Some(&stranger), 0)
        .unwrap_err();
    assert_eq!(refused.reason, "certificate");
    assert!(
        !refused.message.contains("acme") && !refused.message.contains("globex"),
        "a refusal names no tenant: {}",
        refused.message
    );
    assert_eq!(
        authenticate.caller(&no_token, None, 0).unwrap_err().reason,
        "missing"
    );
    let mut with_token = tonic::metadata::MetadataMap::new();
    with_token.insert("authorization", "Bearer x.y.z".parse().unwrap());
    let refused = authenticate
        .caller(&with_token, Some(&globex), 0)
        .unwrap_err();
    assert!(
        refused.message.contains("takes no tokens"),
        "{}",
        refused.message
    );
}
