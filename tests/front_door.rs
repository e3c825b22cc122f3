//! The front door of one real `floret serve` process: `ProduceMany`
//! answers each produce on its own, the Rust client folds concurrent
//! calls into it without mixing up their answers, and a producer with too
//! many calls waiting is refused while the others are not.

mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use floret_client::Message;
use floret_proto::v1::{
    ProduceManyRequest, ProduceRequest, floret_client::FloretClient, produce_outcome,
};
use harness::{FloretProcess, eventually};
use tonic::Code;
use tonic::transport::Channel;

async fn raw_client(node: &FloretProcess) -> FloretClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.address))
        .expect("valid address")
        .connect()
        .await
        .expect("connect");
    FloretClient::new(channel)
}

fn produce(producer: &str, payloads: &[&str]) -> ProduceRequest {
    ProduceRequest {
        queue: "default".into(),
        producer_id: producer.into(),
        messages: payloads
            .iter()
            .map(|payload| Message {
                payload: payload.as_bytes().to_vec(),
                headers: Default::default(),
            })
            .collect(),
        producer_sequence: None,
        deliver_at_unix_ms: 0,
    }
}

/// Sends one `ProduceMany` and collects every outcome by index.
async fn produce_many(
    client: &mut FloretClient<Channel>,
    produces: Vec<ProduceRequest>,
) -> BTreeMap<u32, produce_outcome::Result> {
    let mut replies = client
        .produce_many(ProduceManyRequest { produces })
        .await
        .expect("ProduceMany accepted")
        .into_inner();
    let mut outcomes = BTreeMap::new();
    while let Some(reply) = replies.message().await.expect("outcome stream") {
        for outcome in reply.outcomes {
            let result = outcome.result.expect("every outcome has a result");
            assert!(
                outcomes.insert(outcome.index, result).is_none(),
                "produce {} answered twice",
                outcome.index
            );
        }
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_produce_in_a_produce_many_fails_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let mut client = raw_client(&node).await;
    let outcomes = produce_many(
        &mut client,
        vec![
            produce("alice", &["a1", "a2"]),
            produce("", &["nobody"]),
            produce("bob", &["b1"]),
        ],
    )
    .await;
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    let Some(produce_outcome::Result::Produced(alice)) = &outcomes.get(&0) else {
        panic!("alice's produce failed: {outcomes:?}");
    };
    assert_eq!(alice.sequences.len(), 2);
    let Some(produce_outcome::Result::Refused(refusal)) = &outcomes.get(&1) else {
        panic!("the produce without a producer was taken: {outcomes:?}");
    };
    assert_eq!(refusal.code, Code::InvalidArgument as i32);
    assert!(refusal.message.contains("producer_id"), "{refusal:?}");
    let Some(produce_outcome::Result::Produced(bob)) = &outcomes.get(&2) else {
        panic!("bob's produce failed: {outcomes:?}");
    };
    assert_eq!(bob.sequences.len(), 1);

    let empty = client
        .produce_many(ProduceManyRequest { produces: vec![] })
        .await
        .expect_err("an empty ProduceMany is refused");
    assert_eq!(empty.code(), Code::InvalidArgument);
    let stats = node
        .client()
        .queue_stats("default")
        .await
        .expect("the node still serves");
    let backlog: u64 = stats.queues.iter().map(|q| q.backlog_messages).sum();
    assert_eq!(
        backlog, 3,
        "alice's two messages and bob's one, nothing else"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_produce_calls_get_each_others_answers() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let client = node.client();
    let calls = (0..400u64).map(|call| {
        let client = client.clone();
        let producer = format!("producer-{}", call % 8);
        async move {
            let payload = format!("{producer}:{call}");
            let message = Message {
                payload: payload.clone().into_bytes(),
                headers: Default::default(),
            };
            let answer = client
                .produce("default", &producer, vec![message])
                .await
                .expect("produce");
            (producer, answer.sequences)
        }
    });
    let answers = futures::future::join_all(calls).await;
    let mut sequences: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for (producer, answer) in answers {
        assert_eq!(answer.len(), 1, "one message, one sequence");
        assert!(
            sequences.entry(producer).or_default().insert(answer[0]),
            "two calls were given the same sequence"
        );
    }
    assert_eq!(sequences.len(), 8);
    for (producer, given) in &sequences {
        let (first, last) = (given.first().unwrap(), given.last().unwrap());
        assert!(
            given.len() == 50 && last - first == 49,
            "{producer}'s calls were not given 50 consecutive sequences: {given:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_producer_holds_up_a_quiet_one_past_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("floret.toml");
    std::fs::write(&config, "[batching]\nmax_queued_calls_per_producer = 2\n").unwrap();
    let config = config.to_str().unwrap().to_owned();
    let node = FloretProcess::start(&dir.path().join("node"), &["--config", &config]);
    let client = raw_client(&node).await;
    eventually(
        Duration::from_secs(30),
        "a flooding producer refused past its bound",
        || {
            let mut client = client.clone();
            async move {
                let mut produces: Vec<_> = (0..300).map(|_| produce("flood", &["f"])).collect();
                produces.push(produce("quiet", &["q"]));
                let outcomes = produce_many(&mut client, produces).await;
                assert_eq!(outcomes.len(), 301);
                let quiet = &outcomes[&300];
                assert!(
                    matches!(quiet, produce_outcome::Result::Produced(_)),
                    "the quiet producer was held up: {quiet:?}"
                );
                outcomes
                    .values()
                    .filter_map(|outcome| match outcome {
                        produce_outcome::Result::Refused(refusal) => Some(refusal.clone()),
                        produce_outcome::Result::Produced(_) => None,
                    })
                    .inspect(|refusal| {
                        assert_eq!(refusal.code, Code::ResourceExhausted as i32, "{refusal:?}");
                        assert!(refusal.message.contains("\"flood\""), "{refusal:?}");
                        assert!(refusal.retry_after_ms > 0, "no retry hint: {refusal:?}");
                    })
                    .count()
                    > 0
            }
        },
    )
    .await;
    let mut client = client;
    client
        .produce(produce("flood", &["after"]))
        .await
        .expect("the flooding producer is taken again once its line drains");
}
