//! Bad input over the public API, one named class each, against a real
//! node with token keys. Every class asserts the status code and what its
//! message says, that the node still serves, and, at the end, that every
//! message acknowledged before and between them is delivered.
//!
//! The classes:
//!  1. no_token                       UNAUTHENTICATED
//!  2. not_a_bearer_token             UNAUTHENTICATED
//!  3. garbled_token                  UNAUTHENTICATED
//!  4. expired_token                  UNAUTHENTICATED
//!  5. token_of_another_key           UNAUTHENTICATED
//!  6. token_with_changed_claims      UNAUTHENTICATED
//!  7. hmac_token_with_the_keys_id    UNAUTHENTICATED
//!  8. oversized_token                UNAUTHENTICATED
//!  9. token_for_another_queue        PERMISSION_DENIED
//! 10. token_without_the_role         PERMISSION_DENIED
//! 11. consume_of_another_queue       PERMISSION_DENIED
//! 12. set_policy_without_admin       PERMISSION_DENIED
//! 13. dead_letters_without_admin     PERMISSION_DENIED
//! 14. cluster_status_without_admin   PERMISSION_DENIED
//! 15. stats_of_every_queue_without_admin PERMISSION_DENIED
//! 16. unary_ack_of_another_queue     PERMISSION_DENIED
//! 17. stream_ack_of_another_queue    PERMISSION_DENIED (settle outcome)
//! 18. producer_id_of_another_tenant  OK, stored in the caller's namespace
//! 19. empty_producer_id              INVALID_ARGUMENT
//! 20. producer_id_too_long           INVALID_ARGUMENT
//! 21. producer_id_with_control_char  INVALID_ARGUMENT
//! 22. queue_name_with_a_slash        INVALID_ARGUMENT
//! 23. queue_name_too_long            INVALID_ARGUMENT
//! 24. produce_without_messages       INVALID_ARGUMENT
//! 25. payload_over_the_limit         INVALID_ARGUMENT
//! 26. too_many_headers               INVALID_ARGUMENT
//! 27. empty_header_name              INVALID_ARGUMENT
//! 28. empty_produce_many             INVALID_ARGUMENT
//! 29. empty_ack                      INVALID_ARGUMENT
//! 30. malformed_delivery_id          not OK, names the id
//! 31. credit_of_zero                 INVALID_ARGUMENT
//! 32. stream_not_opened_by_a_subscribe INVALID_ARGUMENT
//! 33. delivery_too_far_ahead         INVALID_ARGUMENT
//! 34. malformed_dead_letter_id       INVALID_ARGUMENT
//! 35. produce_many_into_another_queue PERMISSION_DENIED (per produce)
//! 36. stream_nack_of_another_queue   PERMISSION_DENIED (settle outcome)
//! 37. get_policy_without_admin       PERMISSION_DENIED
//! 38. replay_dead_letters_without_admin PERMISSION_DENIED
//! 39. replica_digests_without_admin  PERMISSION_DENIED
//! 40. producer_id_over_256_bytes_with_a_tenant INVALID_ARGUMENT, says 256
//! 41. tenant_policy_with_a_producers_setting INVALID_ARGUMENT
//! 42. policy_of_a_producer_and_a_tenant INVALID_ARGUMENT
//! 43. tenant_policy_of_a_bad_name    INVALID_ARGUMENT
//! 44. tenant_policy_as_a_producer_id INVALID_ARGUMENT

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine as _;
use floret_proto::v1::{self, admin_client::AdminClient, floret_client::FloretClient};
use floret_server::auth::{Role, SigningKey, TokenClaims};
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use super::harness::FloretProcess;

/// Messages acknowledged before the bad input, checked at the end.
const ACKNOWLEDGED_BEFORE: usize = 20;

type Authorized = InterceptedService<Channel, Authorization>;

/// Sends a fixed `authorization` value (or none) on every call.
#[derive(Clone)]
struct Authorization(Option<String>);

impl tonic::service::Interceptor for Authorization {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            let value: MetadataValue<_> = value.parse().expect("ASCII metadata");
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

struct Node {
    channel: Channel,
    key: SigningKey,
}

impl Node {
    fn token(&self, claims: TokenClaims) -> String {
        self.key.sign(&claims).unwrap()
    }

    fn floret(&self, authorization: Option<String>) -> FloretClient<Authorized> {
        FloretClient::with_interceptor(self.channel.clone(), Authorization(authorization))
    }

    fn admin(&self, authorization: Option<String>) -> AdminClient<Authorized> {
        AdminClient::with_interceptor(self.channel.clone(), Authorization(authorization))
    }

    fn bearer(&self, tenant: &str, roles: &[Role], queues: &[&str]) -> Option<String> {
        Some(format!(
            "Bearer {}",
            self.token(claims(tenant, roles, queues, 600))
        ))
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(tenant: &str, roles: &[Role], queues: &[&str], ttl_s: i64) -> TokenClaims {
    TokenClaims {
        tenant: tenant.into(),
        roles: roles.to_vec(),
        queues: queues.iter().map(|queue| queue.to_string()).collect(),
        exp: now_s().saturating_add_signed(ttl_s),
        iat: now_s(),
    }
}

fn produce(queue: &str, producer: &str, payloads: &[&[u8]]) -> v1::ProduceRequest {
    v1::ProduceRequest {
        queue: queue.into(),
        producer_id: producer.into(),
        messages: payloads
            .iter()
            .map(|payload| v1::Message {
                payload: payload.to_vec(),
                headers: Default::default(),
            })
            .collect(),
        ..Default::default()
    }
}

fn subscribe(queue: &str, credits: u32) -> v1::ConsumeRequest {
    v1::ConsumeRequest {
        request: Some(v1::consume_request::Request::Subscribe(v1::Subscribe {
            queue: queue.into(),
            credits,
        })),
    }
}

fn ack_request(ids: Vec<String>) -> v1::ConsumeRequest {
    v1::ConsumeRequest {
        request: Some(v1::consume_request::Request::Ack(v1::Settle {
            delivery_ids: ids,
            ..Default::default()
        })),
    }
}

/// Asserts that `result` failed with `code` and a message containing `says`.
fn refused<T: std::fmt::Debug>(class: &str, result: Result<T, Status>, code: Code, says: &str) {
    match result {
        Ok(answer) => panic!("{class}: expected {code:?}, got OK: {answer:?}"),
        Err(status) => {
            assert_eq!(status.code(), code, "{class}: {}", status.message());
            assert!(
                status.message().contains(says),
                "{class}: {:?} does not say {says:?}",
                status.message()
            );
        }
    }
}

/// Opens a consume stream and returns it with the first response.
async fn open_stream(
    client: &mut FloretClient<Authorized>,
    first: Vec<v1::ConsumeRequest>,
) -> (
    tokio::sync::mpsc::UnboundedSender<v1::ConsumeRequest>,
    Result<tonic::Streaming<v1::ConsumeResponse>, Status>,
) {
    let (send, receive) = tokio::sync::mpsc::unbounded_channel();
    for request in first {
        send.send(request).unwrap();
    }
    let stream = client
        .consume(tokio_stream::wrappers::UnboundedReceiverStream::new(
            receive,
        ))
        .await
        .map(tonic::Response::into_inner);
    (send, stream)
}

/// The next delivery or settle result on a stream, within a deadline.
async fn next_response(
    stream: &mut tonic::Streaming<v1::ConsumeResponse>,
) -> Result<v1::consume_response::Response, Status> {
    let response = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no response within 10 s"))??
        .ok_or_else(|| Status::cancelled("stream ended"))?;
    response
        .response
        .ok_or_else(|| Status::internal("empty response"))
}

async fn next_delivery(stream: &mut tonic::Streaming<v1::ConsumeResponse>) -> v1::Delivery {
    loop {
        if let v1::consume_response::Response::Delivery(delivery) =
            next_response(stream).await.unwrap()
        {
            return delivery;
        }
    }
}

#[tokio::test]
async fn bad_input_stops_the_node_or_loses_what_it_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let key = SigningKey::generate().unwrap();
    let public_key = dir.path().join("token.pub");
    std::fs::write(&public_key, key.public_pem()).unwrap();
    let process = FloretProcess::start(
        &dir.path().join("node"),
        &["--token-keys", public_key.to_str().unwrap()],
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", process.address))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let node = Node { channel, key };
    let both = [Role::Produce, Role::Consume];
    let acme = node.bearer("acme", &both, &["acme.*"]);
    let globex = node.bearer("globex", &both, &["globex.*"]);
    let mut acme_floret = node.floret(acme.clone());
    let mut acknowledged: BTreeSet<Vec<u8>> = BTreeSet::new();

    let produce_acknowledged = async |floret: &mut FloretClient<Authorized>, tag: &str| {
        let payloads: Vec<Vec<u8>> = (0..ACKNOWLEDGED_BEFORE)
            .map(|index| format!("{tag}-{index}").into_bytes())
            .collect();
        let slices: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        floret
            .produce(produce("acme.orders", "steady", &slices))
            .await
            .unwrap();
        payloads
    };
    acknowledged.extend(produce_acknowledged(&mut acme_floret, "before").await);

    // 1-8: calls without a token this node takes.
    let acme_claims = claims("acme", &both, &["acme.*"], 600);
    let other_key = SigningKey::generate().unwrap();
    let good = node.token(acme_claims.clone());
    let parts: Vec<&str> = good.split('.').collect();
    let admin_claims = serde_json::json!({
        "sub": "acme", "roles": ["admin"], "queues": ["*"], "exp": now_s() + 600, "iat": now_s()
    });
    let changed_claims = format!(
        "{}.{}.{}",
        parts[0],
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(admin_claims.to_string()),
        parts[2]
    );
    let hmac = {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some(node.key.id());
        jsonwebtoken::encode(
            &header,
            &acme_claims,
            &jsonwebtoken::EncodingKey::from_secret(node.key.public_pem().as_bytes()),
        )
        .unwrap()
    };
    let unauthenticated = [
        ("no_token", None, "no authorization metadata"),
        (
            "not_a_bearer_token",
            Some(format!("Basic {good}")),
            "Bearer",
        ),
        (
            "garbled_token",
            Some("Bearer x.y.z".into()),
            "malformed token",
        ),
        (
            "expired_token",
            Some(format!(
                "Bearer {}",
                node.token(claims("acme", &both, &["acme.*"], -30))
            )),
            "expired",
        ),
        (
            "token_of_another_key",
            Some(format!("Bearer {}", other_key.sign(&acme_claims).unwrap())),
            "does not hold",
        ),
        (
            "token_with_changed_claims",
            Some(format!("Bearer {changed_claims}")),
            "signature",
        ),
        (
            "hmac_token_with_the_keys_id",
            Some(format!("Bearer {hmac}")),
            "EdDSA",
        ),
        (
            "oversized_token",
            Some(format!("Bearer {}", "a".repeat(9_000))),
            "too long",
        ),
    ];
    for (class, authorization, says) in unauthenticated {
        let result = node
            .floret(authorization.clone())
            .produce(produce("acme.orders", "p", &[b"x"]))
            .await;
        refused(class, result, Code::Unauthenticated, says);
        let result = node
            .admin(authorization)
            .queue_stats(v1::QueueStatsRequest {
                queue: "acme.orders".into(),
            })
            .await;
        refused(class, result, Code::Unauthenticated, says);
    }

    // 9-17: calls the tenant is not allowed.
    refused(
        "token_for_another_queue",
        node.floret(globex.clone())
            .produce(produce("acme.orders", "p", &[b"x"]))
            .await,
        Code::PermissionDenied,
        "may not use queue \"acme.orders\"",
    );
    refused(
        "token_without_the_role",
        node.floret(node.bearer("acme", &[Role::Consume], &["acme.*"]))
            .produce(produce("acme.orders", "p", &[b"x"]))
            .await,
        Code::PermissionDenied,
        "lacks the produce role",
    );
    let (_globex_stream, result) = open_stream(
        &mut node.floret(globex.clone()),
        vec![subscribe("acme.orders", 5)],
    )
    .await;
    match result {
        Err(status) => refused::<()>(
            "consume_of_another_queue",
            Err(status),
            Code::PermissionDenied,
            "acme.orders",
        ),
        Ok(mut stream) => refused(
            "consume_of_another_queue",
            next_response(&mut stream).await,
            Code::PermissionDenied,
            "acme.orders",
        ),
    }
    let mut acme_admin = node.admin(acme.clone());
    refused(
        "set_policy_without_admin",
        acme_admin
            .set_policy(v1::SetPolicyRequest {
                queue: "acme.orders".into(),
                producer_id: "acme/steady".into(),
                policy: Some(v1::Policy {
                    weight: Some(1_000),
                    ..Default::default()
                }),
                replace: false,
                tenant: String::new(),
            })
            .await,
        Code::PermissionDenied,
        "admin role",
    );
    refused(
        "dead_letters_without_admin",
        acme_admin
            .list_dead_letters(v1::ListDeadLettersRequest {
                queue: "acme.orders".into(),
                limit: 10,
            })
            .await,
        Code::PermissionDenied,
        "admin role",
    );
    refused(
        "cluster_status_without_admin",
        acme_admin.cluster_status(v1::ClusterStatusRequest {}).await,
        Code::PermissionDenied,
        "admin role",
    );
    refused(
        "stats_of_every_queue_without_admin",
        acme_admin
            .queue_stats(v1::QueueStatsRequest { queue: "".into() })
            .await,
        Code::PermissionDenied,
        "admin role",
    );
    node.floret(globex.clone())
        .produce(produce("globex.orders", "g", &[b"globex's"]))
        .await
        .unwrap();
    let (globex_send, globex_stream) = open_stream(
        &mut node.floret(globex.clone()),
        vec![subscribe("globex.orders", 5)],
    )
    .await;
    let mut globex_stream = globex_stream.unwrap();
    let globex_delivery = next_delivery(&mut globex_stream).await;
    refused(
        "unary_ack_of_another_queue",
        acme_floret
            .ack(v1::AckRequest {
                delivery_ids: vec![globex_delivery.delivery_id.clone()],
            })
            .await,
        Code::PermissionDenied,
        "globex.orders",
    );
    let (acme_send, acme_stream) = open_stream(
        &mut acme_floret.clone(),
        vec![subscribe("acme.orders", 1_000)],
    )
    .await;
    let mut acme_stream = acme_stream.unwrap();
    acme_send
        .send(ack_request(vec![globex_delivery.delivery_id.clone()]))
        .unwrap();
    let mut acme_deliveries = Vec::new();
    let outcome = loop {
        match next_response(&mut acme_stream).await.unwrap() {
            v1::consume_response::Response::Delivery(delivery) => acme_deliveries.push(delivery),
            v1::consume_response::Response::Settled(result) => break result.outcomes,
        }
    };
    assert_eq!(outcome.len(), 1, "stream_ack_of_another_queue");
    assert_eq!(
        outcome[0].code,
        Code::PermissionDenied as i32,
        "stream_ack_of_another_queue: {}",
        outcome[0].message
    );
    acme_send
        .send(v1::ConsumeRequest {
            request: Some(v1::consume_request::Request::Nack(v1::Settle {
                delivery_ids: vec![globex_delivery.delivery_id.clone()],
                ..Default::default()
            })),
        })
        .unwrap();
    let outcome = loop {
        match next_response(&mut acme_stream).await.unwrap() {
            v1::consume_response::Response::Delivery(delivery) => acme_deliveries.push(delivery),
            v1::consume_response::Response::Settled(result) => break result.outcomes,
        }
    };
    assert_eq!(
        outcome[0].code,
        Code::PermissionDenied as i32,
        "stream_nack_of_another_queue: {}",
        outcome[0].message
    );
    globex_send
        .send(ack_request(vec![globex_delivery.delivery_id]))
        .unwrap();
    refused(
        "get_policy_without_admin",
        acme_admin
            .get_policy(v1::GetPolicyRequest {
                queue: "acme.orders".into(),
                producer_id: "acme/steady".into(),
                tenant: String::new(),
            })
            .await,
        Code::PermissionDenied,
        "admin role",
    );
    refused(
        "replay_dead_letters_without_admin",
        acme_admin
            .replay_dead_letters(v1::DeadLetterIds {
                queue: "acme.orders".into(),
                ids: vec!["0:1".into()],
            })
            .await,
        Code::PermissionDenied,
        "admin role",
    );
    refused(
        "replica_digests_without_admin",
        acme_admin
            .replica_digests(v1::ReplicaDigestsRequest {})
            .await,
        Code::PermissionDenied,
        "admin role",
    );
    let mut outcomes = node
        .floret(globex.clone())
        .produce_many(v1::ProduceManyRequest {
            produces: vec![
                produce("acme.orders", "g", &[b"x"]),
                produce("globex.orders", "g", &[b"mine"]),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let mut by_index = std::collections::BTreeMap::new();
    while let Some(reply) = outcomes.message().await.unwrap() {
        for outcome in reply.outcomes {
            by_index.insert(outcome.index, outcome.result);
        }
    }
    match &by_index[&0] {
        Some(v1::produce_outcome::Result::Refused(refusal)) => {
            assert_eq!(
                refusal.code,
                Code::PermissionDenied as i32,
                "produce_many_into_another_queue"
            );
            assert!(
                refusal.message.contains("acme.orders"),
                "{}",
                refusal.message
            );
        }
        other => panic!("produce_many_into_another_queue: {other:?}"),
    }
    assert!(
        matches!(
            &by_index[&1],
            Some(v1::produce_outcome::Result::Produced(_))
        ),
        "the other produce of the call is taken: {:?}",
        by_index[&1]
    );

    // 18: naming another tenant's producer makes one of the caller's own.
    node.floret(globex.clone())
        .produce(produce(
            "globex.orders",
            "acme/steady",
            &[b"globex as acme"],
        ))
        .await
        .unwrap();
    let stored = loop {
        match next_response(&mut globex_stream).await.unwrap() {
            v1::consume_response::Response::Delivery(delivery)
                if delivery.payload == b"globex as acme" =>
            {
                break delivery;
            }
            _ => continue,
        }
    };
    assert_eq!(
        stored.producer_id, "globex/acme/steady",
        "producer_id_of_another_tenant"
    );

    // 19-34: malformed requests.
    let long_queue = format!("acme.{}", "q".repeat(200));
    let control = "p\u{7}";
    let long_producer = "p".repeat(300);
    let big_payload = vec![0u8; 1024 * 1024 + 1];
    let malformed = [
        (
            "empty_producer_id",
            produce("acme.orders", "", &[b"x"]),
            "producer_id is empty",
        ),
        (
            "producer_id_too_long",
            produce("acme.orders", &long_producer, &[b"x"]),
            "too long",
        ),
        (
            "producer_id_with_control_char",
            produce("acme.orders", control, &[b"x"]),
            "control character",
        ),
        (
            "queue_name_with_a_slash",
            produce("acme.orders/x", "p", &[b"x"]),
            "has '/'",
        ),
        (
            "queue_name_too_long",
            produce(&long_queue, "p", &[b"x"]),
            "too long",
        ),
        (
            "produce_without_messages",
            produce("acme.orders", "p", &[]),
            "at least one message",
        ),
        (
            "payload_over_the_limit",
            produce("acme.orders", "p", &[big_payload.as_slice()]),
            "payload too large",
        ),
    ];
    refused(
        "producer_id_over_256_bytes_with_a_tenant",
        acme_floret
            .produce(produce("acme.orders", &"p".repeat(257), &[b"x"]))
            .await,
        Code::InvalidArgument,
        "257 bytes > 256",
    );
    for (class, request, says) in malformed {
        refused(
            class,
            acme_floret.produce(request).await,
            Code::InvalidArgument,
            says,
        );
    }
    let mut many_headers = produce("acme.orders", "p", &[b"x"]);
    many_headers.messages[0].headers = (0..65).map(|i| (format!("h{i}"), "v".into())).collect();
    refused(
        "too_many_headers",
        acme_floret.produce(many_headers).await,
        Code::InvalidArgument,
        "too many headers",
    );
    let mut empty_header = produce("acme.orders", "p", &[b"x"]);
    empty_header.messages[0].headers = [(String::new(), "v".into())].into();
    refused(
        "empty_header_name",
        acme_floret.produce(empty_header).await,
        Code::InvalidArgument,
        "header name",
    );
    refused(
        "empty_produce_many",
        acme_floret
            .produce_many(v1::ProduceManyRequest { produces: vec![] })
            .await,
        Code::InvalidArgument,
        "at least one produce",
    );
    refused(
        "empty_ack",
        acme_floret
            .ack(v1::AckRequest {
                delivery_ids: vec![],
            })
            .await,
        Code::InvalidArgument,
        "at least one delivery_id",
    );
    let malformed_id = acme_floret
        .ack(v1::AckRequest {
            delivery_ids: vec!["not-an-id".into()],
        })
        .await;
    match malformed_id {
        Ok(answer) => panic!("malformed_delivery_id: acked {answer:?}"),
        Err(status) => assert!(
            status.message().contains("not-an-id"),
            "malformed_delivery_id: {status:?}"
        ),
    }
    let zero_credit = v1::ConsumeRequest {
        request: Some(v1::consume_request::Request::Credit(v1::Credit {
            credits: 0,
            ..Default::default()
        })),
    };
    let (_zero, result) = open_stream(
        &mut acme_floret.clone(),
        vec![subscribe("acme.empty", 1), zero_credit],
    )
    .await;
    let zero_credits = match result {
        Err(status) => Err(status),
        Ok(mut stream) => next_response(&mut stream).await.map(drop),
    };
    refused(
        "credit_of_zero",
        zero_credits,
        Code::InvalidArgument,
        "credits must be > 0",
    );
    let (_ack_first, result) = open_stream(
        &mut acme_floret.clone(),
        vec![ack_request(vec!["x".into()])],
    )
    .await;
    let not_subscribed = match result {
        Err(status) => Err(status),
        Ok(mut stream) => next_response(&mut stream).await.map(drop),
    };
    refused(
        "stream_not_opened_by_a_subscribe",
        not_subscribed,
        Code::InvalidArgument,
        "must be a subscribe",
    );
    let mut far_ahead = produce("acme.orders", "p", &[b"x"]);
    far_ahead.deliver_at_unix_ms = (now_s() as i64 + 40 * 86_400) * 1_000;
    refused(
        "delivery_too_far_ahead",
        acme_floret.produce(far_ahead).await,
        Code::InvalidArgument,
        "30 days ahead",
    );
    refused(
        "malformed_dead_letter_id",
        node.admin(node.bearer("ops", &[Role::Admin], &[]))
            .delete_dead_letters(v1::DeadLetterIds {
                queue: "acme.orders".into(),
                ids: vec!["nope".into()],
            })
            .await,
        Code::InvalidArgument,
        "malformed dead-letter id",
    );
    let mut ops_admin = node.admin(node.bearer("ops", &[Role::Admin], &[]));
    let tenant_policy =
        |producer_id: &str, tenant: &str, policy: v1::Policy| v1::SetPolicyRequest {
            queue: "acme.orders".into(),
            producer_id: producer_id.into(),
            policy: Some(policy),
            replace: false,
            tenant: tenant.into(),
        };
    let weight_two = v1::Policy {
        weight: Some(2),
        ..Default::default()
    };
    let with_a_ttl = v1::Policy {
        ttl_ms: Some(10),
        ..weight_two
    };
    let bad_tenant_policies = [
        (
            "tenant_policy_with_a_producers_setting",
            tenant_policy("", "acme", with_a_ttl),
            "only weight, max_messages, max_bytes and produce_rate",
        ),
        (
            "policy_of_a_producer_and_a_tenant",
            tenant_policy("acme/steady", "acme", weight_two),
            "not both",
        ),
        (
            "tenant_policy_of_a_bad_name",
            tenant_policy("", "acme.eu", weight_two),
            "tenant name",
        ),
        (
            "tenant_policy_as_a_producer_id",
            tenant_policy("acme/", "", weight_two),
            "set it with `tenant`",
        ),
    ];
    for (class, request, says) in bad_tenant_policies {
        refused(
            class,
            ops_admin.set_policy(request).await,
            Code::InvalidArgument,
            says,
        );
    }

    // The node serves, and every acknowledged message is delivered.
    acknowledged.extend(produce_acknowledged(&mut acme_floret, "after").await);
    let mut delivered: BTreeSet<Vec<u8>> = acme_deliveries
        .iter()
        .map(|delivery| delivery.payload.clone())
        .collect();
    while !acknowledged.is_subset(&delivered) {
        delivered.insert(next_delivery(&mut acme_stream).await.payload);
    }
    drop(acme_send);
}
