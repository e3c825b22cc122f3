//! What naming the caller costs per call: the client port's interceptor
//! without token keys (every call anonymous), against one taking an Ed25519
//! bearer token it verified before (what a client's every call after its
//! first costs), and one verifying it for the first time.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use floret_server::auth::{Authenticate, Role, SigningKey, TokenClaims, TokenVerifier, VerifyKey};
use tonic::metadata::MetadataMap;

/// The time the calls are made at, inside the token's validity.
const NOW_UNIX_S: u64 = 1_800_000_000;

fn name_the_caller(c: &mut Criterion) {
    let key = SigningKey::generate().expect("a key");
    let token = key
        .sign(&TokenClaims {
            tenant: "acme".into(),
            roles: vec![Role::Produce, Role::Consume],
            queues: vec!["acme.*".into()],
            exp: NOW_UNIX_S + 3_600,
            iat: NOW_UNIX_S,
        })
        .expect("a token");
    let mut metadata = MetadataMap::new();
    metadata.insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ASCII"),
    );
    let verifier = TokenVerifier::new(vec![
        VerifyKey::from_pem(&key.public_pem()).expect("the public key"),
    ]);
    let with_keys = Authenticate::new(Some(verifier.clone()), None);
    let without_keys = Authenticate::new(None, None);
    let mut group = c.benchmark_group("name_the_caller");
    group.bench_function("without_token_keys", |b| {
        b.iter(|| black_box(without_keys.caller(black_box(&metadata), None, NOW_UNIX_S)))
    });
    group.bench_function("ed25519_bearer_token_seen_before", |b| {
        b.iter(|| {
            black_box(with_keys.caller(black_box(&metadata), None, NOW_UNIX_S))
                .expect("a valid token")
        })
    });
    group.bench_function("ed25519_bearer_token_first_seen", |b| {
        b.iter_batched(
            || Authenticate::new(Some(verifier.clone()), None),
            |fresh| {
                black_box(fresh.caller(black_box(&metadata), None, NOW_UNIX_S))
                    .expect("a valid token")
            },
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, name_the_caller);
criterion_main!(benches);
