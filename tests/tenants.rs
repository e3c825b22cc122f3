//! Tenants on nodes with token keys: every Floret and Admin call needs a
//! bearer token; a tenant produces only into its queues and only as its own
//! producers (stored as `tenant/producer`), consumes and acks only its
//! queues, and needs `admin` for policies, dead letters and cluster-wide
//! figures. Every refusal leaves the node serving, and nothing acknowledged
//! is lost through them.

use std::path::Path;
use std::time::Duration;

use floret_client::{
    Client, ClientError, ClientTls, ConsumerEvent, Delivery, Message, Policy, RetryPolicy,
};
use floret_proto::v1;
use floret_server::auth::{Role, SigningKey, TokenClaims};
use tonic::Code;

use super::harness::{Cluster, FloretProcess, floret_binary, one_cluster_at_a_time};

/// Waits for one consumer event this long at most.
const EVENT_DEADLINE: Duration = Duration::from_secs(10);

/// Signs tokens for the tests, and knows where its public key is.
struct Issuer {
    key: SigningKey,
    public_key: std::path::PathBuf,
}

impl Issuer {
    fn new(dir: &Path) -> Self {
        let key = SigningKey::generate().unwrap();
        let public_key = dir.join("token.pub");
        std::fs::write(&public_key, key.public_pem()).unwrap();
        Self { key, public_key }
    }

    fn token(&self, tenant: &str, roles: &[Role], queues: &[&str], ttl_s: i64) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        self.key
            .sign(&TokenClaims {
                tenant: tenant.into(),
                roles: roles.to_vec(),
                queues: queues.iter().map(|queue| queue.to_string()).collect(),
                exp: now.saturating_add_signed(ttl_s),
                iat: now,
            })
            .unwrap()
    }

    /// A node under `dir` that takes tokens signed by this issuer.
    fn start_node(&self, dir: &Path) -> FloretProcess {
        let flag = self.token_keys_flag();
        let args: Vec<&str> = flag.iter().map(String::as_str).collect();
        FloretProcess::start(&dir.join("node"), &args)
    }

    /// Such a node, configured by the TOML `config` too.
    fn start_configured_node(&self, dir: &Path, config: &str) -> FloretProcess {
        let config_file = dir.join("floret.toml");
        std::fs::write(&config_file, config).unwrap();
        let mut args = self.token_keys_flag().to_vec();
        args.extend(["--config".into(), config_file.display().to_string()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        FloretProcess::start(&dir.join("node"), &args)
    }

    /// Three nodes under `dir` that take tokens signed by this issuer.
    fn start_cluster(&self, dir: &Path) -> Cluster {
        let flag = self.token_keys_flag();
        let args: Vec<&str> = flag.iter().map(String::as_str).collect();
        Cluster::start(dir, 3, &args)
    }

    fn token_keys_flag(&self) -> [String; 2] {
        ["--token-keys".into(), self.public_key.display().to_string()]
    }
}

fn as_tenant(address: &str, token: &str) -> Client {
    Client::connect_lazy_as(address, None, Some(token)).unwrap()
}

/// A tenant's client that gives up at the first refusal, to see it.
fn impatient_tenant(address: &str, token: &str) -> Client {
    as_tenant(address, token).with_retry(RetryPolicy {
        give_up_after: Duration::ZERO,
        ..RetryPolicy::default()
    })
}

/// The status of a refused call.
fn refusal(result: Result<impl std::fmt::Debug, ClientError>) -> tonic::Status {
    match result {
        Err(ClientError::Status(status)) => status,
        other => panic!("not a refusal: {other:?}"),
    }
}

fn code(result: Result<impl Sized, ClientError>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(ClientError::Status(status)) => status.code(),
        Err(other) => panic!("not a status: {other}"),
    }
}

fn message(text: &str) -> Vec<Message> {
    vec![Message {
        payload: text.as_bytes().to_vec(),
        headers: Default::default(),
    }]
}

async fn next_delivery(consumer: &mut floret_client::Consumer) -> Delivery {
    loop {
        match tokio::time::timeout(EVENT_DEADLINE, consumer.next())
            .await
            .expect("a delivery within the deadline")
            .unwrap()
        {
            Some(ConsumerEvent::Delivery(delivery)) => return delivery,
            Some(_) => continue,
            None => panic!("consume stream ended"),
        }
    }
}

async fn next_settled(consumer: &mut floret_client::Consumer) -> Vec<v1::SettleOutcome> {
    loop {
        match tokio::time::timeout(EVENT_DEADLINE, consumer.next())
            .await
            .expect("settle outcomes within the deadline")
            .unwrap()
        {
            Some(ConsumerEvent::Settled(outcomes)) => return outcomes,
            Some(_) => continue,
            None => panic!("consume stream ended"),
        }
    }
}

#[tokio::test]
async fn any_caller_can_act_as_any_tenant_on_a_node_with_token_keys() {
    let dir = tempfile::tempdir().unwrap();
    let issuer = Issuer::new(dir.path());
    let node = issuer.start_node(dir.path());
    let address = node.address.as_str();
    let both = [Role::Produce, Role::Consume];
    let acme = as_tenant(
        address,
        &issuer.token("acme", &both, &["acme.*", "shared.*"], 600),
    );
    let globex = as_tenant(
        address,
        &issuer.token("globex", &both, &["globex.*", "shared.*"], 600),
    );
    let admin = as_tenant(address, &issuer.token("ops", &[Role::Admin], &[], 600));

    // No, garbled, expired or foreign tokens: UNAUTHENTICATED, and health still answers.
    let anonymous = Client::connect_lazy(address).unwrap();
    let other_dir = dir.path().join("other");
    std::fs::create_dir_all(&other_dir).unwrap();
    let foreign = Issuer::new(&other_dir);
    let strangers = [
        ("no token", anonymous),
        ("garbled", as_tenant(address, "not.a.token")),
        (
            "expired",
            as_tenant(address, &issuer.token("acme", &both, &["acme.*"], -5)),
        ),
        (
            "another key",
            as_tenant(address, &foreign.token("acme", &both, &["acme.*"], 600)),
        ),
    ];
    for (what, stranger) in &strangers {
        assert_eq!(
            code(stranger.produce("acme.orders", "p1", message("x")).await),
            Code::Unauthenticated,
            "{what}"
        );
        assert_eq!(
            code(stranger.queue_stats("acme.orders").await),
            Code::Unauthenticated,
            "{what}"
        );
        assert!(stranger.serving().await.unwrap(), "{what}: health answers");
    }

    // acme produces into its queue as its own producer.
    let sequences = acme
        .produce("acme.orders", "p1", message("acme's"))
        .await
        .unwrap()
        .sequences;
    assert_eq!(sequences.len(), 1);

    // globex may not produce into, consume, or read acme's queue.
    assert_eq!(
        code(globex.produce("acme.orders", "p1", message("x")).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(globex.consume("acme.orders", 10).await.map(drop)),
        Code::PermissionDenied
    );
    assert_eq!(
        code(globex.queue_stats("acme.orders").await),
        Code::PermissionDenied
    );
    // Naming acme's producer from globex's side makes globex's own producer.
    globex
        .produce("globex.orders", "acme/p1", message("globex's"))
        .await
        .unwrap();

    // acme gets its message, from its namespaced producer.
    let mut consumer = acme.consume("acme.orders", 10).await.unwrap();
    let delivery = next_delivery(&mut consumer).await;
    assert_eq!(delivery.producer_id, "acme/p1");
    assert_eq!(delivery.payload, b"acme's");

    // globex cannot ack it; acme can.
    assert_eq!(
        code(globex.ack(vec![delivery.delivery_id.clone()]).await),
        Code::PermissionDenied
    );
    // Without admin: no policies, dead letters or cluster-wide figures.
    let policy = Policy {
        weight: Some(100),
        ..Policy::default()
    };
    assert_eq!(
        code(
            acme.set_policy("acme.orders", "acme/p1", policy, false)
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(
            acme.delete_dead_letters("acme.orders", vec!["1".into()])
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(code(acme.cluster_status().await), Code::PermissionDenied);
    assert_eq!(code(acme.queue_stats("").await), Code::PermissionDenied);
    acme.ack(vec![delivery.delivery_id.clone()]).await.unwrap();

    // acme's stream cannot settle globex's delivery either.
    let mut globex_consumer = globex.consume("globex.orders", 10).await.unwrap();
    let globex_delivery = next_delivery(&mut globex_consumer).await;
    assert_eq!(globex_delivery.producer_id, "globex/acme/p1");
    consumer
        .ack(vec![globex_delivery.delivery_id.clone()])
        .await
        .unwrap();
    let outcomes = next_settled(&mut consumer).await;
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].code, Code::PermissionDenied as i32);

    // The admin may; in a queue both use, acme's statistics show acme's producers alone.
    admin
        .set_policy("acme.orders", "acme/p1", policy, false)
        .await
        .unwrap();
    acme.produce("shared.q", "p1", message("a")).await.unwrap();
    globex
        .produce("shared.q", "p1", message("g"))
        .await
        .unwrap();
    let stats = acme.queue_stats("shared.q").await.unwrap();
    let producers: Vec<_> = stats.queues[0]
        .producers
        .iter()
        .map(|producer| producer.producer_id.as_str())
        .collect();
    assert_eq!(producers, ["acme/p1"]);
    let shared = admin.queue_stats("shared.q").await.unwrap();
    assert_eq!(shared.queues[0].producers.len(), 2, "the admin sees both");
    let all = admin.queue_stats("").await.unwrap();
    let globex_stats = all
        .queues
        .iter()
        .find(|queue| queue.queue == "globex.orders")
        .expect("globex's queue");
    assert_eq!(globex_stats.producers[0].producer_id, "globex/acme/p1");
    assert_eq!(
        globex_stats.backlog_messages, 1,
        "globex's message is kept (leased to globex, not acked)"
    );

    // Refusals are logged for audit; the node serves on.
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap();
    let refusals: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("audit") && line.contains("refused"))
        .collect();
    assert!(
        refusals.iter().any(|line| line.contains("globex")),
        "globex's refusals in the node's audit log: {refusals:#?}"
    );
    assert!(admin.serving().await.unwrap());
}

#[tokio::test]
async fn a_tenants_calls_through_another_node_lose_its_namespace() {
    let _one_cluster = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let issuer = Issuer::new(dir.path());
    let cluster = issuer.start_cluster(dir.path());
    let both = [Role::Produce, Role::Consume];
    let acme_token = issuer.token("acme", &both, &["acme.*"], 600);
    let globex_token = issuer.token("globex", &both, &["globex.*"], 600);
    let producers = ["p1", "p2", "p3", "p4", "p5", "p6"];
    for (index, producer) in producers.iter().enumerate() {
        let via = cluster.address(1 + index as u64 % 3);
        as_tenant(&via, &acme_token)
            .produce("acme.orders", producer, message(producer))
            .await
            .unwrap();
    }
    for node in 1..=3 {
        let globex = as_tenant(&cluster.address(node), &globex_token);
        assert_eq!(
            code(globex.produce("acme.orders", "p1", message("x")).await),
            Code::PermissionDenied
        );
        assert_eq!(
            code(globex.consume("acme.orders", 10).await.map(drop)),
            Code::PermissionDenied
        );
    }
    let acme = as_tenant(&cluster.address(2), &acme_token);
    let mut consumer = acme.consume("acme.orders", 100).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < producers.len() {
        let delivery = next_delivery(&mut consumer).await;
        consumer
            .ack(vec![delivery.delivery_id.clone()])
            .await
            .unwrap();
        seen.push(delivery.producer_id);
    }
    seen.sort();
    let expected: Vec<String> = producers
        .iter()
        .map(|producer| format!("acme/{producer}"))
        .collect();
    assert_eq!(seen, expected);
}

/// Swaps the random part of a delivery id (`shard-sequence-attempt-nonce-...`)
/// for another, as someone guessing ids would.
fn guessed(delivery_id: &str) -> String {
    let parts: Vec<&str> = delivery_id.splitn(5, '-').collect();
    let nonce = u64::from_str_radix(parts[3], 16).unwrap();
    format!(
        "{}-{}-{}-{:016x}-{}",
        parts[0],
        parts[1],
        parts[2],
        nonce ^ 1,
        parts[4]
    )
}

#[tokio::test]
async fn a_tenant_settles_another_tenants_deliveries_in_a_queue_both_consume() {
    let _one_cluster = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let issuer = Issuer::new(dir.path());
    let cluster = issuer.start_cluster(dir.path());
    let both = [Role::Produce, Role::Consume];
    let acme_token = issuer.token("acme", &both, &["shared.*"], 600);
    let globex_token = issuer.token("globex", &both, &["shared.*"], 600);
    let producers = ["p1", "p2", "p3", "p4", "p5", "p6"];
    for (index, producer) in producers.iter().enumerate() {
        as_tenant(&cluster.address(1 + index as u64 % 3), &acme_token)
            .produce("shared.jobs", producer, message(producer))
            .await
            .unwrap();
    }
    // acme consumes through node 2: the messages come from every leader.
    let acme = as_tenant(&cluster.address(2), &acme_token);
    let mut acme_stream = acme.consume("shared.jobs", 100).await.unwrap();
    let mut ids = Vec::new();
    while ids.len() < producers.len() {
        ids.push(next_delivery(&mut acme_stream).await.delivery_id);
    }

    // globex may consume the queue, but not settle what acme was given:
    // not through Ack on any node, nor on a stream of its own (with no
    // credits, so it gets nothing itself), nor by guessing an id.
    for node in 1..=3 {
        let globex = as_tenant(&cluster.address(node), &globex_token);
        for id in &ids {
            assert_eq!(
                code(globex.ack(vec![id.clone()]).await),
                Code::PermissionDenied,
                "globex acked {id} through node {node}"
            );
        }
    }
    let globex = as_tenant(&cluster.address(3), &globex_token);
    let mut globex_stream = globex.consume("shared.jobs", 0).await.unwrap();
    globex_stream.nack(ids.clone()).await.unwrap();
    let outcomes = next_settled(&mut globex_stream).await;
    assert_eq!(outcomes.len(), ids.len());
    assert!(
        outcomes
            .iter()
            .all(|outcome| outcome.code == Code::PermissionDenied as i32),
        "globex's stream settled acme's deliveries: {outcomes:?}"
    );
    let guesses: Vec<String> = ids.iter().map(|id| guessed(id)).collect();
    acme_stream.ack(guesses).await.unwrap();
    let outcomes = next_settled(&mut acme_stream).await;
    assert!(
        outcomes
            .iter()
            .all(|outcome| outcome.code == Code::NotFound as i32),
        "a guessed id settled a delivery: {outcomes:?}"
    );

    // Another stream of acme's own cannot settle them either; acme's Ack,
    // through any node, can.
    let mut second_stream = acme.consume("shared.jobs", 0).await.unwrap();
    second_stream.ack(ids.clone()).await.unwrap();
    let outcomes = next_settled(&mut second_stream).await;
    assert!(
        outcomes
            .iter()
            .all(|outcome| outcome.code == Code::PermissionDenied as i32),
        "another stream settled them: {outcomes:?}"
    );
    let acme_elsewhere = as_tenant(&cluster.address(1), &acme_token);
    acme_elsewhere.ack(ids).await.unwrap();
    let stats = as_tenant(&cluster.address(1), &acme_token)
        .queue_stats("shared.jobs")
        .await
        .unwrap();
    let left: u64 = stats
        .queues
        .iter()
        .map(|queue| queue.backlog_messages)
        .sum();
    assert_eq!(left, 0, "acme's acks removed its messages");
    assert!(globex.serving().await.unwrap());
}

#[tokio::test]
async fn a_tenant_with_a_hundred_producers_takes_a_hundred_shares() {
    let dir = tempfile::tempdir().unwrap();
    let issuer = Issuer::new(dir.path());
    let node = issuer.start_node(dir.path());
    let address = node.address.as_str();
    let produce_only = [Role::Produce];
    let sybil = as_tenant(
        address,
        &issuer.token("sybil", &produce_only, &["shared.*"], 600),
    );
    let honest = as_tenant(
        address,
        &issuer.token("honest", &produce_only, &["shared.*"], 600),
    );
    let sink = as_tenant(
        address,
        &issuer.token("sink", &[Role::Consume], &["shared.*"], 600),
    );
    let batch = |count: usize, tag: &str| -> Vec<Message> {
        (0..count).flat_map(|_| message(tag)).collect()
    };
    for producer in 0..100 {
        sybil
            .produce("shared.q", &format!("p{producer}"), batch(20, "s"))
            .await
            .unwrap();
    }
    for _ in 0..20 {
        honest
            .produce("shared.q", "only", batch(100, "h"))
            .await
            .unwrap();
    }
    let mut consumer = sink.consume("shared.q", 100).await.unwrap();
    let mut per_tenant: std::collections::BTreeMap<String, usize> = Default::default();
    let mut per_sybil_producer: std::collections::BTreeMap<String, usize> = Default::default();
    for _ in 0..1_000 {
        let delivery = next_delivery(&mut consumer).await;
        let (tenant, producer) = delivery.producer_id.split_once('/').unwrap();
        *per_tenant.entry(tenant.to_owned()).or_default() += 1;
        if tenant == "sybil" {
            *per_sybil_producer.entry(producer.to_owned()).or_default() += 1;
        }
        consumer.ack(vec![delivery.delivery_id]).await.unwrap();
        consumer.credit(1).await.unwrap();
    }
    let sybil_share = per_tenant["sybil"] as f64 / 1_000.0;
    assert!(
        (0.45..=0.55).contains(&sybil_share),
        "each tenant gets half, however many producers it opens: {per_tenant:?}"
    );
    let counts: Vec<f64> = per_sybil_producer.values().map(|&n| n as f64).collect();
    let jain = counts.iter().sum::<f64>().powi(2)
        / (counts.len() as f64 * counts.iter().map(|n| n * n).sum::<f64>());
    assert_eq!(counts.len(), 100, "every one of its producers was served");
    assert!(
        jain >= 0.95,
        "its producers share its half evenly: Jain {jain}"
    );
}

/// Jain's index of `counts`: 1 when all are equal.
fn jain(counts: &[f64]) -> f64 {
    counts.iter().sum::<f64>().powi(2)
        / (counts.len() as f64 * counts.iter().map(|n| n * n).sum::<f64>())
}

#[tokio::test]
async fn a_tenant_spread_over_three_nodes_takes_a_share_from_each() {
    let _one_cluster = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let issuer = Issuer::new(dir.path());
    let cluster = issuer.start_cluster(dir.path());
    let produce_only = [Role::Produce];
    let sybil_token = issuer.token("sybil", &produce_only, &["shared.*"], 600);
    let honest_token = issuer.token("honest", &produce_only, &["shared.*"], 600);
    let batch = |count: usize, tag: &str| -> Vec<Message> {
        (0..count).flat_map(|_| message(tag)).collect()
    };
    // sybil: 100 producers, spread over the shards of all three nodes;
    // honest: one producer. Both keep a backlog for the whole run.
    for producer in 0..100u64 {
        as_tenant(&cluster.address(1 + producer % 3), &sybil_token)
            .produce("shared.q", &format!("p{producer}"), batch(60, "s"))
            .await
            .unwrap();
    }
    let honest = as_tenant(&cluster.address(2), &honest_token);
    for _ in 0..60 {
        honest
            .produce("shared.q", "only", batch(100, "h"))
            .await
            .unwrap();
    }

    // One consumer through node 1, about 300 deliveries a second: two
    // windows of 5 s at equal weights, then sybil's weight goes to 3 and,
    // after a second to take effect, one more window.
    const WINDOW: Duration = Duration::from_secs(5);
    let sink = as_tenant(
        &cluster.address(1),
        &issuer.token("sink", &[Role::Consume], &["shared.*"], 600),
    );
    let admin = as_tenant(
        &cluster.address(3),
        &issuer.token("ops", &[Role::Admin], &[], 600),
    );
    let mut consumer = sink.consume("shared.q", 32).await.unwrap();
    let mut windows: Vec<std::collections::BTreeMap<String, usize>> = vec![Default::default(); 4];
    let mut per_sybil_producer: std::collections::BTreeMap<String, f64> = Default::default();
    let weighted_from = 2 * WINDOW + Duration::from_secs(1);
    let started = std::time::Instant::now();
    let mut weighted = false;
    while started.elapsed() < weighted_from + WINDOW {
        if !weighted && started.elapsed() >= 2 * WINDOW {
            let weight_three = Policy {
                weight: Some(3),
                ..Policy::default()
            };
            admin
                .set_tenant_policy("shared.q", "sybil", weight_three, false)
                .await
                .unwrap();
            weighted = true;
        }
        let delivery = next_delivery(&mut consumer).await;
        let elapsed = started.elapsed();
        let window = if elapsed < 2 * WINDOW {
            (elapsed.as_millis() / WINDOW.as_millis()) as usize
        } else if elapsed >= weighted_from {
            3
        } else {
            2
        };
        let (tenant, producer) = delivery.producer_id.split_once('/').unwrap();
        *windows[window].entry(tenant.to_owned()).or_default() += 1;
        if tenant == "sybil" && window < 2 {
            *per_sybil_producer.entry(producer.to_owned()).or_default() += 1.0;
        }
        consumer.ack(vec![delivery.delivery_id]).await.unwrap();
        consumer.credit(1).await.unwrap();
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let sybil_share = |counts: &std::collections::BTreeMap<String, usize>| {
        counts.get("sybil").copied().unwrap_or(0) as f64 / counts.values().sum::<usize>() as f64
    };
    for (index, counts) in windows[..2].iter().enumerate() {
        assert!(
            (0.45..=0.55).contains(&sybil_share(counts)),
            "window {index}: each tenant gets half, however many producers it opens on however many nodes: {counts:?}"
        );
    }
    assert!(
        (0.70..=0.80).contains(&sybil_share(&windows[3])),
        "at weights 3:1, sybil gets three quarters: {:?}",
        windows[3]
    );
    let counts: Vec<f64> = per_sybil_producer.values().copied().collect();
    assert_eq!(counts.len(), 100, "every one of its producers was served");
    let index = jain(&counts);
    assert!(
        index >= 0.95,
        "its producers share its half evenly: Jain {index}"
    );
    let stored = admin.get_tenant_policy("shared.q", "sybil").await.unwrap();
    assert_eq!(stored.tenant_policy.unwrap().weight, Some(3));
}

#[tokio::test]
async fn a_tenant_opening_more_producers_gets_more_room_on_a_full_node() {
    let dir = tempfile::tempdir().unwrap();
    let issuer = Issuer::new(dir.path());
    let node = issuer.start_configured_node(
        dir.path(),
        "[backpressure]\nhigh_watermark_bytes = 200000\nlow_watermark_bytes = 100000\nretry_after_ms = 50\n",
    );
    let address = node.address.as_str();
    let produce_only = [Role::Produce];
    let sybil = impatient_tenant(address, &issuer.token("sybil", &produce_only, &["q"], 600));
    let honest = impatient_tenant(address, &issuer.token("honest", &produce_only, &["q"], 600));
    let batch = || -> Vec<Message> {
        (0..50)
            .map(|_| Message {
                payload: vec![7; 128],
                headers: Default::default(),
            })
            .collect()
    };
    for _ in 0..6 {
        honest.produce("q", "only", batch()).await.unwrap();
    }
    let mut first_refusal = None;
    'flood: for _round in 0..100 {
        for producer in 0..20 {
            if let Err(refused) = sybil.produce("q", &format!("p{producer}"), batch()).await {
                first_refusal = Some(refusal(Err::<(), _>(refused)));
                break 'flood;
            }
        }
    }
    let first_refusal = first_refusal.expect("the node throttled the flood");
    assert_eq!(
        first_refusal.code(),
        Code::ResourceExhausted,
        "{first_refusal:?}"
    );
    assert!(
        first_refusal.message().contains("tenant \"sybil\" holds"),
        "the tenant is over its share, not each of its producers: {first_refusal:?}"
    );
    assert!(
        !first_refusal.message().contains("honest"),
        "a refusal names no other tenant: {first_refusal:?}"
    );
    let fresh = refusal(sybil.produce("q", "fresh", batch()).await);
    assert!(
        fresh.message().contains("tenant \"sybil\" holds"),
        "a new producer of a tenant over its share earns it no room: {fresh:?}"
    );
    honest
        .produce("q", "only", batch())
        .await
        .expect("a tenant under its share is admitted on a full node, one producer or a hundred");
}

#[tokio::test]
async fn a_tenant_passes_its_limits_by_spreading_its_producers_over_nodes() {
    let _one_cluster = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let issuer = Issuer::new(dir.path());
    // Four nodes holding three replicas of each shard: every node lacks
    // some shards, and counts them from what their leaders gossip.
    let flag = issuer.token_keys_flag();
    let args: Vec<&str> = flag.iter().map(String::as_str).collect();
    let cluster = Cluster::start(dir.path(), 4, &args);
    let admin = as_tenant(
        &cluster.address(1),
        &issuer.token("ops", &[Role::Admin], &[], 600),
    );
    const MAX_MESSAGES: u64 = 60;
    const RATE: u32 = 40;
    let set_policy = |tenant: &'static str, policy: Policy| {
        let admin = admin.clone();
        async move {
            admin
                .set_tenant_policy("q", tenant, policy, false)
                .await
                .unwrap()
        }
    };
    set_policy(
        "acme",
        Policy {
            max_messages: Some(MAX_MESSAGES),
            ..Policy::default()
        },
    )
    .await;
    set_policy(
        "globex",
        Policy {
            produce_rate: Some(RATE),
            ..Policy::default()
        },
    )
    .await;
    let clients_of = |tenant: &str| -> Vec<Client> {
        let token = issuer.token(tenant, &[Role::Produce, Role::Consume], &["q"], 600);
        (1..=4)
            .map(|node| impatient_tenant(&cluster.address(node), &token))
            .collect()
    };
    let acme = clients_of("acme");
    const PRODUCERS: usize = 24;
    let attempt = |clients: &[Client], round: usize| {
        let client = clients[round % clients.len()].clone();
        async move {
            client
                .produce("q", &format!("p{}", round % PRODUCERS), message("m"))
                .await
        }
    };

    // Stored messages: one at a time, round robin over producers and nodes.
    let mut acknowledged = 0u64;
    for round in 0..200 {
        match attempt(&acme, round).await {
            Ok(_) => acknowledged += 1,
            Err(refused) => {
                let refused = refusal(Err::<(), _>(refused));
                assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
                assert!(
                    refused.message().contains("tenant \"acme\" stores"),
                    "{refused:?}"
                );
            }
        }
    }
    // Produces admitted within a gossip round (for shards a leader does
    // not hold) or an apply (for those it does) pass the limit by that much.
    assert!(
        (MAX_MESSAGES..=MAX_MESSAGES * 2).contains(&acknowledged),
        "acme stores about its limit over {PRODUCERS} producers on 4 nodes: {acknowledged}"
    );
    // Once gossip has gone round, every leader refuses every producer.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for round in 0..PRODUCERS {
        let refused = refusal(attempt(&acme, round).await);
        assert!(
            refused.message().contains("tenant \"acme\" stores"),
            "producer p{round} through node {}: {refused:?}",
            1 + round % 4
        );
    }
    // Draining frees room.
    let mut consumer = acme[0].consume("q", 100).await.unwrap();
    for _ in 0..acknowledged {
        let delivery = next_delivery(&mut consumer).await;
        consumer.ack(vec![delivery.delivery_id]).await.unwrap();
    }
    let produced_again = floret_chaos::process::poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { attempt(&acme, 0).await.ok() },
    )
    .await;
    assert!(
        produced_again.is_some(),
        "acme may produce again once drained"
    );

    // Rate: globex's 24 producers together get about RATE a second.
    let globex = clients_of("globex");
    // Until every node has heard the others' demand (a gossip round or
    // two), each refills at the whole rate: only the last 2 s are counted.
    let started = std::time::Instant::now();
    let (mut admitted, mut round) = (0u32, 0);
    while started.elapsed() < Duration::from_secs(3) {
        match attempt(&globex, round).await {
            Ok(_) if started.elapsed() >= Duration::from_secs(1) => admitted += 1,
            Ok(_) => {}
            Err(refused) => {
                let refused = refusal(Err::<(), _>(refused));
                assert!(
                    refused
                        .message()
                        .contains(&format!("over its produce_rate of {RATE}")),
                    "{refused:?}"
                );
            }
        }
        round += 1;
    }
    assert!(
        round as u32 > 4 * admitted,
        "most of the {round} attempts were refused: {admitted} admitted"
    );
    assert!(
        (RATE..=RATE * 2 + RATE + 8).contains(&admitted),
        "2 s at {RATE}/s, plus what the buckets held (at most a second's worth, rounded up per node): {admitted}"
    );
}

/// Runs `floret certs` for one node into `dir`, with client certificates
/// for `tenants`.
fn make_certs(dir: &Path, tenants: &str) {
    let made = std::process::Command::new(floret_binary())
        .args(["certs", "--nodes", "1", "--tenant", tenants, "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
}

#[tokio::test]
async fn a_client_certificate_is_taken_for_any_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    make_certs(&certs, "acme,globex");
    let stranger_certs = dir.path().join("stranger");
    make_certs(&stranger_certs, "acme");
    let issuer = Issuer::new(dir.path());
    let file = |name: &str| certs.join(name).display().to_string();
    // acme's certificate stands for acme; globex's, signed by the same CA,
    // for no one.
    let config = format!(
        "[tls]\ncert = {:?}\nkey = {:?}\n\n[auth]\nclient_ca = {:?}\n\n[[auth.client_certificates]]\nname = \"acme.tenant.floret\"\ntenant = \"acme\"\nroles = [\"produce\", \"consume\"]\nqueues = [\"acme.*\"]\n",
        file("node-1.pem"),
        file("node-1.key"),
        file("ca.pem"),
    );
    let node = issuer.start_configured_node(dir.path(), &config);
    let address = node.address.as_str();
    let trust = ClientTls::from_ca_file(certs.join("ca.pem")).unwrap();
    let presenting = |dir: &Path, tenant: &str| {
        let tls = trust
            .clone()
            .with_client_certificate_files(
                dir.join(format!("tenant-{tenant}.pem")),
                dir.join(format!("tenant-{tenant}.key")),
            )
            .unwrap();
        Client::connect_lazy_tls(address, &tls)
            .unwrap()
            .with_retry(RetryPolicy {
                give_up_after: Duration::ZERO,
                ..RetryPolicy::default()
            })
    };

    let acme = presenting(&certs, "acme");
    acme.produce("acme.orders", "p1", message("by certificate"))
        .await
        .expect("acme's certificate stands for acme");
    let mut consumer = acme.consume("acme.orders", 1).await.unwrap();
    let delivery = next_delivery(&mut consumer).await;
    assert_eq!(
        delivery.producer_id, "acme/p1",
        "stored in acme's namespace"
    );
    consumer.ack(vec![delivery.delivery_id]).await.unwrap();
    let denied = refusal(acme.produce("globex.orders", "p1", message("x")).await);
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");

    let globex = presenting(&certs, "globex");
    let unmapped = refusal(globex.produce("globex.orders", "p1", message("x")).await);
    assert_eq!(unmapped.code(), Code::Unauthenticated, "{unmapped:?}");
    assert!(
        unmapped.message().contains("stands for no tenant") && !unmapped.message().contains("acme"),
        "{unmapped:?}"
    );
    let bare = Client::connect_lazy_tls(address, &trust)
        .unwrap()
        .with_retry(RetryPolicy {
            give_up_after: Duration::ZERO,
            ..RetryPolicy::default()
        });
    let nothing = refusal(bare.produce("acme.orders", "p1", message("x")).await);
    assert_eq!(nothing.code(), Code::Unauthenticated, "{nothing:?}");
    assert!(
        nothing.message().contains("client certificate"),
        "{nothing:?}"
    );
    let stranger = presenting(&stranger_certs, "acme");
    assert!(
        stranger
            .produce("acme.orders", "p1", message("x"))
            .await
            .is_err(),
        "a certificate another CA signed does not get through the handshake"
    );

    // A token on a connection with a certificate: the token names the caller.
    let admin_token = issuer.token("ops", &[Role::Admin], &[], 600);
    let admin = Client::connect_lazy_as(
        address,
        Some(
            &trust
                .clone()
                .with_client_certificate_files(
                    certs.join("tenant-acme.pem"),
                    certs.join("tenant-acme.key"),
                )
                .unwrap(),
        ),
        Some(&admin_token),
    )
    .unwrap();
    admin
        .set_tenant_policy(
            "acme.orders",
            "acme",
            Policy {
                weight: Some(2),
                ..Policy::default()
            },
            false,
        )
        .await
        .expect("the token's admin role, not the certificate's tenant");
    acme.produce("acme.orders", "p1", message("still serving"))
        .await
        .expect("every refusal left the node serving");
}
