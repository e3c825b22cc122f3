//! The monitoring files in `deploy/grafana/` ask only for what a node
//! exports: every `floret_*` name in the dashboard's queries and in the
//! alert rules' expressions is in the catalog (a histogram only through its
//! `_bucket`, `_sum` or `_count` series), and a real node after traffic
//! exports it with the catalog's kind. Every panel of the dashboard queries
//! its data source variable, so it imports into any Grafana.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use floret_client::{ConsumerEvent, Message};
use floret_server::metric_catalog::{METRICS, Metric, MetricKind};
use serde_json::Value;

use super::harness::FloretProcess;
use super::metrics::scrape;

/// Metrics a lone node that produced, delivered and acked has no series of:
/// counted only when their event happens, or only on a leader with
/// followers. These are checked against the catalog (and their kind, if
/// exported after all), not required in the scrape.
const NOT_ON_A_LONE_NODE: [&str; 5] = [
    // A producer with too many calls waiting for a raft entry.
    "floret_produce_queue_full_total",
    // The data dir's filesystem below storage.min_free_bytes.
    "floret_produce_refused_disk_total",
    // Followers: a lone node leads shards without any.
    "floret_shard_replica_lag_entries",
    "floret_raft_append_seconds",
    // Set by the gossip reach check, which a lone node (no gossip) does not run.
    "floret_gossip_isolated",
];

/// How long the node may take to sample its gauges after the traffic.
const SAMPLED_WITHIN: Duration = Duration::from_secs(30);

fn monitoring_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/grafana")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// Each `floret_*` metric of the page with the kind its `# TYPE` line gives.
fn exported_types(page: &str) -> BTreeMap<String, String> {
    page.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| line.split_once(' '))
        .filter(|(name, _)| name.starts_with("floret_"))
        .map(|(name, kind)| (name.to_owned(), kind.trim().to_owned()))
        .collect()
}

/// The queries of a dashboard: panels' and targets' `expr`, and template
/// variables' `query` and `definition`.
fn dashboard_queries(value: &Value, queries: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            for (key, inner) in fields {
                match (key.as_str(), inner) {
                    ("expr" | "query" | "definition", Value::String(text)) => {
                        queries.push(text.clone())
                    }
                    _ => dashboard_queries(inner, queries),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                dashboard_queries(item, queries);
            }
        }
        _ => {}
    }
}

fn indentation(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The `expr:` values of a rule file, plain or block scalars (`|`, `>`).
fn rule_expressions(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut expressions = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        at += 1;
        let key = line.trim_start().trim_start_matches("- ");
        let Some(value) = key.strip_prefix("expr:") else {
            continue;
        };
        let value = value.trim();
        if !value.is_empty() && !value.starts_with(['|', '>']) {
            expressions.push(
                value
                    .trim_matches(|c: char| c == '"' || c == '\'')
                    .to_owned(),
            );
            continue;
        }
        let mut block = String::new();
        while at < lines.len()
            && (lines[at].trim().is_empty() || indentation(lines[at]) > indentation(line))
        {
            block.push_str(lines[at].trim());
            block.push(' ');
            at += 1;
        }
        expressions.push(block);
    }
    expressions
}

/// The `floret_*` names in a query.
fn metric_names(query: &str) -> BTreeSet<String> {
    query
        .match_indices("floret_")
        .filter(|(at, _)| !query[..*at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
        .map(|(at, _)| {
            query[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
        })
        .collect()
}

/// The catalog's metric a series name belongs to: itself, or the histogram
/// whose `_bucket`, `_sum` or `_count` series it is.
fn catalog_metric(series: &str) -> Option<&'static Metric> {
    if let Some(metric) = METRICS.iter().find(|metric| metric.name == series) {
        return Some(metric);
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|suffix| series.strip_suffix(suffix))
        .find_map(|base| {
            METRICS.iter().find(|metric| {
                metric.name == base && matches!(metric.kind, MetricKind::Histogram(_))
            })
        })
}

/// Every panel of the dashboard, those inside collapsed rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut found = Vec::new();
    let mut pending: Vec<&Value> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    while let Some(panel) = pending.pop() {
        pending.extend(panel["panels"].as_array().into_iter().flatten());
        found.push(panel);
    }
    found
}

fn uses_the_datasource_variable(datasource: &Value) -> bool {
    matches!(
        datasource["uid"].as_str(),
        Some("${datasource}" | "$datasource")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_or_alert_used_a_metric_the_node_does_not_export() {
    let dashboard_text = monitoring_file("floret-dashboard.json");
    let dashboard: Value = serde_json::from_str(&dashboard_text)
        .unwrap_or_else(|error| panic!("floret-dashboard.json does not parse: {error}"));
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    assert!(
        variables
            .iter()
            .any(|variable| variable["name"] == "datasource"
                && variable["type"] == "datasource"
                && variable["query"] == "prometheus"),
        "the dashboard has no `datasource` variable of Prometheus data sources"
    );
    for variable in variables
        .iter()
        .filter(|variable| variable["type"] == "query")
    {
        assert!(
            uses_the_datasource_variable(&variable["datasource"]),
            "variable {} does not query ${{datasource}}",
            variable["name"]
        );
    }
    let panels = panels(&dashboard);
    assert!(
        panels.iter().any(|panel| panel["targets"].is_array()),
        "no panel queries anything"
    );
    for panel in panels.iter().filter(|panel| panel["type"] != "row") {
        assert!(
            uses_the_datasource_variable(&panel["datasource"]),
            "panel {} does not query ${{datasource}}: {}",
            panel["title"],
            panel["datasource"]
        );
        for target in panel["targets"].as_array().into_iter().flatten() {
            assert!(
                uses_the_datasource_variable(&target["datasource"]),
                "a query of panel {} does not use ${{datasource}}",
                panel["title"]
            );
        }
    }

    let mut used: BTreeMap<String, &str> = BTreeMap::new();
    let mut queries = Vec::new();
    dashboard_queries(&dashboard, &mut queries);
    for query in &queries {
        for name in metric_names(query) {
            used.entry(name).or_insert("floret-dashboard.json");
        }
    }
    let rules = monitoring_file("alerts.yml");
    let expressions = rule_expressions(&rules);
    assert_eq!(
        expressions.len(),
        rules.matches("- alert:").count(),
        "an alert of alerts.yml without an expr, or an expr not found: {expressions:?}"
    );
    for expression in &expressions {
        for name in metric_names(expression) {
            used.entry(name).or_insert("alerts.yml");
        }
    }
    assert!(
        used.len() > 10,
        "too few metrics found, is the scan broken? {used:?}"
    );

    let mut wanted: BTreeMap<&'static str, &'static Metric> = BTreeMap::new();
    for (series, file) in &used {
        let metric = catalog_metric(series)
            .unwrap_or_else(|| panic!("{file} uses {series}, which is not in the catalog"));
        assert!(
            !matches!(metric.kind, MetricKind::Histogram(_)) || metric.name != series.as_str(),
            "{file} uses the histogram {series} bare: Prometheus has only its _bucket, _sum and _count series"
        );
        wanted.insert(metric.name, metric);
    }

    let dir = tempfile::tempdir().unwrap();
    let port = floret_chaos::ports::free_loopback_ports(1).unwrap()[0];
    let metrics_address = format!("127.0.0.1:{port}");
    let node = FloretProcess::start(
        &dir.path().join("node"),
        &["--metrics-listen", &metrics_address],
    );
    let client = node.client();
    for producer in ["a", "b"] {
        let messages = (0..10)
            .map(|_| Message {
                payload: b"hello".to_vec(),
                headers: Default::default(),
            })
            .collect();
        client.produce("q", producer, messages).await.unwrap();
    }
    // Two credits: two deliveries, acked, and both producers stay
    // backlogged, so the queue's fairness index and per-producer gauges
    // have series; the consumer stays subscribed until the scrape.
    let mut consumer = client.consume("q", 2).await.unwrap();
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

    let all_there = |exported: &BTreeMap<String, String>| {
        wanted
            .keys()
            .filter(|name| !NOT_ON_A_LONE_NODE.contains(*name))
            .all(|name| exported.contains_key(*name))
    };
    let sampled = floret_chaos::process::poll(SAMPLED_WITHIN, Duration::from_millis(500), || {
        let page = scrape(&metrics_address);
        let exported = exported_types(&page);
        std::future::ready(all_there(&exported).then_some((page, exported)))
    })
    .await;
    // Past the deadline, the last page says what is missing.
    let (page, exported) = sampled.unwrap_or_else(|| {
        let page = scrape(&metrics_address);
        let exported = exported_types(&page);
        (page, exported)
    });
    let mut missing = Vec::new();
    for (name, metric) in &wanted {
        match exported.get(*name) {
            Some(kind) => assert_eq!(
                kind,
                metric.kind.prometheus_type(),
                "{name} is exported as a {kind}, the catalog says {}",
                metric.kind.prometheus_type()
            ),
            None if NOT_ON_A_LONE_NODE.contains(name) => {}
            None => missing.push(*name),
        }
    }
    assert!(
        missing.is_empty(),
        "the monitoring files use {missing:?}, which the node did not export within {SAMPLED_WITHIN:?}:\n{page}"
    );
    drop(consumer);
}
