//! The deploy files name only what floret has: every `floret serve` flag
//! they pass is in `floret serve --help`, and every `FLORET_*` variable
//! they set for a node is one the node reads (by name, or a setting's path
//! such as `FLORET_RAFT__HEARTBEAT_MS`); and `floret config print` shows
//! such a variable's setting and where it came from. The Kubernetes pods'
//! start script founds the cluster on the first three pods and, on a pod
//! past them, makes its node a member and joins.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use super::harness::floret_binary;

/// Variables the deploy files set for the `floret` commands and scripts
/// around the node, not for the node itself.
const NOT_FOR_THE_NODE: [&str; 3] = ["FLORET_TOKEN", "FLORET_BASE_PORT", "FLORET_DEV_DIR"];

fn deploy_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The `FLORET_*` names in `text`.
fn variables(text: &str) -> BTreeSet<String> {
    text.match_indices("FLORET_")
        .map(|(at, _)| {
            text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
        })
        .collect()
}

/// The `--flags` on the lines of `text` from a `floret serve` (or `" serve`)
/// up to the end of that command (lines continued with `\`).
fn serve_flags(text: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let mut in_serve = false;
    for line in text.lines() {
        if line.contains("floret serve") || line.contains("\" serve") {
            in_serve = true;
        }
        if in_serve {
            for word in line.split_whitespace() {
                if let Some(flag) = word.strip_prefix("--") {
                    flags.insert(format!(
                        "--{}",
                        flag.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-')
                    ));
                }
            }
            in_serve = line.trim_end().ends_with('\\');
        }
    }
    flags
}

#[test]
fn a_deploy_file_sets_a_variable_or_flag_floret_does_not_have() {
    let files = [
        "Dockerfile",
        "k8s/floret.yaml",
        "compose/compose.yaml",
        "systemd/floret.service",
        "systemd/floret.env.example",
        "local-cluster.sh",
        "k8s/start-node.sh",
    ];
    let read: BTreeSet<String> = floret_server::config::Config::environment_variables()
        .into_iter()
        .collect();
    let help = Command::new(floret_binary())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let mut flags_checked = 0;
    for name in files {
        let text = deploy_file(name);
        for variable in variables(&text) {
            let names_a_setting = variable.contains("__")
                && !floret_server::config::Config::load_overlaid(
                    None,
                    |_| None,
                    [(variable.clone(), "1".to_owned())],
                )
                .is_err_and(|error| error.to_string().contains("unknown field"));
            assert!(
                read.contains(&variable)
                    || names_a_setting
                    || NOT_FOR_THE_NODE.contains(&variable.as_str()),
                "deploy/{name} sets {variable}, which the node does not read (it reads {read:?})"
            );
        }
        for flag in serve_flags(&text) {
            flags_checked += 1;
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "deploy/{name} passes `floret serve {flag}`, which `floret serve --help` does not list"
            );
        }
    }
    assert!(
        flags_checked >= 9,
        "the flag scan found the serve commands: {flags_checked}"
    );
    assert!(
        read.contains("FLORET_TOKEN_KEYS") && read.contains("FLORET_PEERS"),
        "{read:?}"
    );
}

#[test]
fn the_image_builds_with_the_lock_file_and_without_target() {
    assert!(deploy_file("Dockerfile").contains("cargo build --release --locked"));
    let ignored =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.dockerignore"))
            .unwrap();
    assert!(
        ignored.lines().any(|line| line.trim() == "target"),
        "{ignored}"
    );
}

#[test]
fn the_systemd_unit_has_a_key_systemd_does_not_know() {
    let Ok(probe) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("no systemd-analyze on this machine: the unit is not verified");
        return;
    };
    assert!(probe.status.success());
    let dir = tempfile::tempdir().unwrap();
    let unit = dir.path().join("floret.service");
    std::fs::write(
        &unit,
        deploy_file("systemd/floret.service").replace("/usr/local/bin/floret", floret_binary()),
    )
    .unwrap();
    let verified = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verified.stderr);
    assert!(
        verified.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
}

#[test]
fn a_nested_variable_did_not_show_in_config_print() {
    let printed = Command::new(floret_binary())
        .args(["config", "print"])
        .env("FLORET_RAFT__ELECTION_TIMEOUT_MIN_MS", "300")
        .env("FLORET_NODE_ID", "2")
        .output()
        .unwrap();
    assert!(printed.status.success(), "{printed:?}");
    let printed = String::from_utf8(printed.stdout).unwrap();
    let line = |path: &str| {
        printed
            .lines()
            .find(|line| line.starts_with(&format!("{path} = ")))
            .unwrap_or_else(|| panic!("{path} not printed:\n{printed}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        line("raft.election_timeout_min_ms"),
        "raft.election_timeout_min_ms = 300 # FLORET_RAFT__ELECTION_TIMEOUT_MIN_MS"
    );
    assert_eq!(line("node_id"), "node_id = 2 # FLORET_NODE_ID");
    assert_eq!(
        line("raft.heartbeat_ms"),
        "raft.heartbeat_ms = 100 # default"
    );
}

/// The founding members as the StatefulSet names them.
const K8S_PEERS: &str =
    "1=floret-0.floret-peers:7801,2=floret-1.floret-peers:7801,3=floret-2.floret-peers:7801";

/// Runs `deploy/k8s/start-node.sh` as pod `hostname` would, with a
/// stand-in `floret` on the PATH that records each call (its arguments and
/// the variables it was given) and fails its first `failing_calls` calls
/// to `floret cluster`. Returns the recorded calls.
fn start_pod(hostname: &str, failing_calls: u32) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("calls");
    let failures = dir.path().join("failures");
    std::fs::write(&failures, "x".repeat(failing_calls as usize)).unwrap();
    let stand_in = dir.path().join("floret");
    std::fs::write(
        &stand_in,
        r#"#!/bin/sh
echo "$* | node=$FLORET_NODE_ID cert=$FLORET_TLS_CERT peers=${FLORET_PEERS:-} join=${FLORET_JOIN:-} token=${FLORET_TOKEN:-}" >> "$RECORD"
left=$(cat "$FAILURES")
if [ "$1" = cluster ] && [ -n "$left" ]; then
    printf '%s' "${left#x}" > "$FAILURES"
    exit 1
fi
"#,
    )
    .unwrap();
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "admin-token").unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/k8s/start-node.sh");
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let status = Command::new("sh")
        .arg(&script)
        .env_clear()
        .env("PATH", path)
        .env("HOSTNAME", hostname)
        .env("FLORET_PEERS", K8S_PEERS)
        .env("FOUNDING_NODES", "3")
        .env("TLS_DIR", "/tls")
        .env("ADMIN_TOKEN_FILE", &token)
        .env("JOIN_RETRY_SECONDS", "0")
        .env("RECORD", &record)
        .env("FAILURES", &failures)
        .status()
        .unwrap();
    assert!(status.success(), "start-node.sh as {hostname}: {status}");
    std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_pod_of_the_founding_three_joins_instead_of_founding_or_the_reverse() {
    assert_eq!(
        start_pod("floret-1", 0),
        [format!(
            "serve | node=2 cert=/tls/node-2.pem peers={K8S_PEERS} join= token="
        )]
    );
}

#[test]
fn a_pod_scaled_up_past_the_founding_three_serves_before_it_is_a_member() {
    let add_node = "cluster add-node --id 4 --peer-addr floret-3.floret-peers:7801 --addr floret:7701 | node=4 cert=/tls/node-4.pem";
    assert_eq!(
        start_pod("floret-3", 1),
        [
            format!("{add_node} peers={K8S_PEERS} join= token=admin-token"),
            format!("{add_node} peers={K8S_PEERS} join= token=admin-token"),
            format!("serve | node=4 cert=/tls/node-4.pem peers= join={K8S_PEERS} token="),
        ]
    );
}
