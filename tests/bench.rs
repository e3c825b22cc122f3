//! `floret bench` against a real node: every scenario runs to the end,
//! accounts for every message it produced, and writes the JSON and plot it
//! promises. Small sizes: these check the tool, not the numbers (those come
//! from release builds, see BENCHMARKS.md).

mod harness;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use harness::FloretProcess;

/// Longest a small bench run may take on a loaded CI machine.
const BENCH_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `floret bench <args> --addr address --json <dir>/name.json` and
/// returns the JSON it wrote.
fn bench(dir: &Path, name: &str, address: &str, args: &[&str]) -> serde_json::Value {
    let json = dir.join(format!("{name}.json"));
    let mut child = Command::new(harness::floret_binary())
        .arg("bench")
        .args(args)
        .args(["--addr", address, "--json"])
        .arg(&json)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn floret bench");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for floret bench") {
            break status;
        }
        if started.elapsed() > BENCH_DEADLINE {
            child.kill().expect("kill floret bench");
            let output = child.wait_with_output().expect("bench output");
            panic!(
                "floret bench {args:?} ran past {BENCH_DEADLINE:?}: {}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = child.wait_with_output().expect("bench output");
    assert!(
        status.success(),
        "floret bench {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(json).expect("json written")).expect("valid json")
}

#[test]
fn noisy_neighbor_delivers_every_message_and_reports_both_groups() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let plot = dir.path().join("plot.svg");
    let report = bench(
        dir.path(),
        "noisy",
        &node.address,
        &[
            "noisy-neighbor",
            "--messages",
            "3000",
            "--quiet",
            "3",
            "--sink-rate",
            "2000",
            "--plot",
            plot.to_str().unwrap(),
        ],
    );
    let produced = report["produced"].as_u64().unwrap();
    assert!(produced >= 3_000, "{report}");
    assert_eq!(report["delivered"].as_u64(), Some(produced), "{report}");
    assert_eq!(report["not_delivered"].as_u64(), Some(0));
    assert_eq!(report["flood_latency"]["count"].as_u64(), Some(3_000));
    assert!(report["quiet_latency"]["count"].as_u64().unwrap() >= 3);
    assert!(report["quiet_latency"]["p99_ms"].as_f64().unwrap() > 0.0);
    let svg = std::fs::read_to_string(plot).expect("plot written");
    assert!(svg.contains("flooder-0") && svg.contains("quiet"));
}

#[test]
fn every_flooder_gets_an_equal_share_of_a_capped_sink() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let report = bench(
        dir.path(),
        "all-flood",
        &node.address,
        &[
            "noisy-neighbor",
            "--messages",
            "8000",
            "--flooders",
            "4",
            "--quiet",
            "0",
            "--sink-rate",
            "1500",
            "--consumers",
            "1",
        ],
    );
    let fairness = &report["fairness"];
    assert!(
        fairness["contested_windows"].as_u64().unwrap() >= 2,
        "the flooders must stay backlogged together: {report}"
    );
    assert!(
        fairness["jain_min"].as_f64().unwrap() >= 0.9,
        "one node's DRR shares a capped sink equally: {fairness}"
    );
}

#[test]
fn throughput_and_scale_account_for_what_they_sent() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let throughput = bench(
        dir.path(),
        "throughput",
        &node.address,
        &[
            "throughput",
            "--duration-s",
            "2",
            "--producers",
            "10",
            "--consumers",
            "1",
        ],
    );
    assert!(throughput["produced"].as_u64().unwrap() > 0, "{throughput}");
    assert!(throughput["produce_rate"].as_f64().unwrap() > 0.0);
    assert!(throughput["produce_latency"]["p99_ms"].as_f64().unwrap() > 0.0);
    let scale = bench(
        dir.path(),
        "scale",
        &node.address,
        &["scale", "--producers", "200,400", "--backlog", "2"],
    );
    let steps = scale["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 2);
    for (step, producers) in steps.iter().zip([200, 400]) {
        assert_eq!(step["producers"].as_u64(), Some(producers));
        assert_eq!(step["messages"].as_u64(), Some(producers * 2), "{step}");
        assert_eq!(step["delivered"].as_u64(), Some(producers * 2), "{step}");
        let resident = step["resident_mib"].as_object().expect("per node");
        assert_eq!(resident.len(), 1);
        assert!(
            resident.values().all(|mib| mib[0].as_f64().unwrap() > 1.0),
            "{step}"
        );
    }
}

#[test]
fn moves_reports_what_a_removed_node_gave_up_and_how_long_each_shard_took() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = tempfile::tempdir().unwrap();
    let cluster = harness::Cluster::start(nodes.path(), 4, &["--shards", "6"]);
    let change = format!(
        "{} cluster remove-node 4 --addr {}",
        harness::floret_binary(),
        cluster.address(1)
    );
    let first_three = (1..=3)
        .map(|node| cluster.address(node))
        .collect::<Vec<_>>()
        .join(",");
    let report = bench(
        dir.path(),
        "moves",
        &first_three,
        &[
            "moves",
            "--backlog",
            "2000",
            "--steady-s",
            "1",
            "--producers",
            "8",
            "--concurrency",
            "4",
            "--after-s",
            "2",
            "--sink-rate",
            "500",
            "--change",
            &change,
        ],
    );
    assert_eq!(report["failed_produce_calls"].as_u64(), Some(0), "{report}");
    let figures = &report["changes"][0]["figures"];
    assert_eq!(figures["members_before"], serde_json::json!([1, 2, 3, 4]));
    assert_eq!(figures["members_after"], serde_json::json!([1, 2, 3]));
    let moved = figures["shards_moved"].as_u64().unwrap();
    assert!(moved >= 1, "node 4 held replicas: {report}");
    assert_eq!(
        figures["shard_move_seconds"].as_array().unwrap().len() as u64,
        moved,
        "{report}"
    );
    assert!(figures["bytes_copied"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(figures["ideal_share"].as_f64(), Some(0.25), "{report}");
    let change = &report["changes"][0];
    assert!(
        change["produce_rate_after"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let jain = change["jain_after_median"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&jain), "{report}");
}
