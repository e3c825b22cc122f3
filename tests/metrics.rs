//! The Prometheus endpoint of a real node after traffic: every `floret_*`
//! metric it exports is in the catalog (`docs/metrics.md`), with its kind
//! and help text, and histograms come with buckets.

use std::io::{Read, Write};
use std::time::Duration;

use floret_client::{ConsumerEvent, Message};
use floret_server::metric_catalog::{METRICS, MetricKind};

use super::harness::{FloretProcess, eventually};

/// The text `GET /metrics` answers at `address`.
pub(super) fn scrape(address: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metric_was_exported_without_help_or_outside_the_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let port = floret_chaos::ports::free_loopback_ports(1).unwrap()[0];
    let metrics_address = format!("127.0.0.1:{port}");
    let node = FloretProcess::start(
        &dir.path().join("node"),
        &["--metrics-listen", &metrics_address],
    );
    let client = node.client();
    for producer in ["a", "b"] {
        client
            .produce(
                "q",
                producer,
                vec![Message {
                    payload: b"hello".to_vec(),
                    headers: Default::default(),
                }],
            )
            .await
            .unwrap();
    }
    let mut consumer = client.consume("q", 10).await.unwrap();
    let mut delivered = 0;
    while delivered < 2 {
        if let Some(ConsumerEvent::Delivery(delivery)) =
            tokio::time::timeout(Duration::from_secs(10), consumer.next())
                .await
                .unwrap()
                .unwrap()
        {
            consumer.ack(vec![delivery.delivery_id]).await.unwrap();
            delivered += 1;
        }
    }

    // The per-queue series come with the sampler's next round.
    let sampled = "floret_queue_backlog_messages{queue=\"q\"}";
    eventually(Duration::from_secs(20), sampled, || async {
        scrape(&metrics_address).contains(sampled)
    })
    .await;
    let exported = scrape(&metrics_address);
    let typed: Vec<(&str, &str)> = exported
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| line.split_once(' '))
        .filter(|(name, _)| name.starts_with("floret_"))
        .collect();
    for (name, kind) in &typed {
        let listed = METRICS
            .iter()
            .find(|metric| metric.name == *name)
            .unwrap_or_else(|| panic!("{name} is exported but not in the catalog"));
        assert_eq!(*kind, listed.kind.prometheus_type(), "{name}");
        assert!(
            exported.contains(&format!("# HELP {name} {}", listed.help)),
            "{name} has no help text:\n{exported}"
        );
        if let MetricKind::Histogram(_) = listed.kind {
            let buckets = format!("{name}_bucket{{");
            assert!(
                exported
                    .lines()
                    .any(|line| line.starts_with(&buckets) && line.contains("le=\"")),
                "{name} has no buckets"
            );
        }
        for line in exported.lines().filter(|line| {
            line.strip_prefix(*name)
                .is_some_and(|rest| rest.starts_with('{'))
        }) {
            for label in listed.labels {
                assert!(
                    line.contains(&format!("{label}=\"")),
                    "{line} lacks the label {label}"
                );
            }
        }
    }
    for expected in [
        "floret_produced_messages_total{queue=\"q\"} 2",
        "floret_deliveries_total{queue=\"q\"} 2",
        "floret_acked_messages_total{queue=\"q\"} 2",
        "floret_nacked_messages_total{queue=\"q\"} 0",
        "floret_queue_backlog_messages{queue=\"q\"} 0",
        "floret_producer_delivery_share{queue=\"q\",producer=\"a\"} 0.5",
        "floret_shards_led ",
        "floret_dwell_seconds_count{queue=\"q\"} 2",
        "floret_produce_seconds_count 2",
        "floret_ack_seconds_count ",
        "floret_apply_seconds_count ",
        "floret_store_sync_seconds_count ",
        "floret_entry_ops_count ",
    ] {
        assert!(
            exported.lines().any(|line| line.starts_with(expected)),
            "{expected} missing after traffic:\n{exported}"
        );
    }
}

#[test]
fn docs_metrics_md_left_out_a_metric() {
    let listed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/metrics.md"),
    )
    .unwrap();
    for metric in METRICS {
        assert!(
            listed.contains(&format!("`{}`", metric.name)),
            "docs/metrics.md does not list {}",
            metric.name
        );
    }
}
