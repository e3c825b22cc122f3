//! Starts and stops real `floret serve` processes for black-box tests.
//!
//! Each node listens on 127.0.0.1 with a port the OS picks (`--listen
//! 127.0.0.1:0`); the harness reads the address from the node's ready line.
//! Every wait has a deadline; every process is killed when its handle drops.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use floret_client::Client;

/// How long a node may take to start and elect itself.
pub const START_DEADLINE: Duration = Duration::from_secs(60);

/// A running `floret serve` process.
pub struct FloretProcess {
    child: Child,
    /// `host:port` of its gRPC server.
    pub address: String,
    /// Its data dir.
    pub data_dir: PathBuf,
}

/// The floret binary cargo built for these tests.
pub fn floret_binary() -> &'static str {
    env!("CARGO_BIN_EXE_floret")
}

impl FloretProcess {
    /// Starts a node on `data_dir` and waits until it serves.
    pub fn start(data_dir: &Path, extra_args: &[&str]) -> Self {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data_dir.with_extension("log"))
            .expect("node log file");
        let mut child = Command::new(floret_binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(extra_args)
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn floret serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some((_, address)) = line.split_once(" serving on ") {
                    let _ = ready_tx.send(address.trim().to_owned());
                }
            }
        });
        let address = match ready_rx.recv_timeout(START_DEADLINE) {
            Ok(address) => address,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let log =
                    std::fs::read_to_string(data_dir.with_extension("log")).unwrap_or_default();
                panic!("floret did not become ready within {START_DEADLINE:?}; its log:\n{log}");
            }
        };
        Self {
            child,
            address,
            data_dir: data_dir.to_path_buf(),
        }
    }

    /// A client of this node.
    pub fn client(&self) -> Client {
        Client::connect_lazy(&self.address).expect("valid address")
    }

    /// SIGKILL: no shutdown, no final sync.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM: asks for a graceful shutdown.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits for the process to exit by itself, up to `deadline`.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + deadline;
        while Instant::now() < until {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for FloretProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `floret serve` expecting it to fail at start; returns its stderr.
pub fn start_expecting_failure(data_dir: &Path) -> String {
    let output = Command::new(floret_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .stdin(Stdio::null())
        .output()
        .expect("run floret serve");
    assert!(
        !output.status.success(),
        "floret serve started on {}",
        data_dir.display()
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Polls `condition` until it holds or `deadline` passes.
pub async fn eventually<F, Fut>(deadline: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + deadline;
    while Instant::now() < until {
        if condition().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what} did not happen within {deadline:?}");
}
