//! `floret dev` gives a newcomer a working cluster in one command, over TLS
//! with certificates it makes itself.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use floret_client::{Client, ClientTls, ConsumerEvent, Message};

use super::harness::{START_DEADLINE, floret_binary, one_cluster_at_a_time};

/// Kills the `floret dev` process when the test ends, however it ends.
struct DevProcess(std::process::Child);

impl Drop for DevProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_cluster_needs_more_than_one_command() {
    let _one = one_cluster_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    // Client ports base..base+2, peer ports base+100..base+102.
    let base = floret_chaos::ports::free_loopback_range(103).unwrap();
    let mut child = Command::new(floret_binary())
        .args(["dev", "--base-port", &base.to_string(), "--data-dir"])
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .env(
            "FLORET_MIN_FREE_BYTES",
            floret_chaos::process::TEST_MIN_FREE_BYTES,
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _dev = DevProcess(child);
    let (lines, printed) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut ca = None;
    loop {
        let line = printed
            .recv_timeout(START_DEADLINE)
            .expect("floret dev printed its greeting");
        if let Some((_, path)) = line.split_once("export FLORET_TLS_CA=") {
            ca = Some(path.trim().to_owned());
        }
        if line.starts_with("try:") {
            break;
        }
    }
    let ca = ca.expect("floret dev says how to trust its nodes");
    let tls = ClientTls::from_ca_file(&ca).unwrap();
    let first = format!("127.0.0.1:{base}");
    let last = format!("127.0.0.1:{}", base + 2);
    Client::connect_lazy_tls(&first, &tls)
        .unwrap()
        .produce(
            "default",
            "newcomer",
            vec![Message {
                payload: b"hello".to_vec(),
                headers: Default::default(),
            }],
        )
        .await
        .expect("a produce over TLS");
    let mut consumer = Client::connect_lazy_tls(&last, &tls)
        .unwrap()
        .consume("default", 1)
        .await
        .unwrap();
    let delivery = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(ConsumerEvent::Delivery(delivery)) = consumer.next().await.unwrap() {
                return delivery;
            }
        }
    })
    .await
    .expect("the message delivered through another node");
    assert_eq!(delivery.payload, b"hello");

    let health = tokio::process::Command::new(floret_binary())
        .args(["health", "--addr", &last, "--tls-ca", &ca])
        .output()
        .await
        .unwrap();
    assert!(
        health.status.success() && String::from_utf8_lossy(&health.stdout).contains("SERVING"),
        "floret health: {health:?}"
    );

    let plaintext = Client::connect_lazy(&first).unwrap();
    assert!(
        plaintext.cluster_status().await.is_err(),
        "a dev node answered plaintext"
    );
}
