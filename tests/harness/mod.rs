//! Starts and stops real `floret serve` processes for black-box tests.
//!
//! Each node listens on 127.0.0.1 with a port the OS picks (`--listen
//! 127.0.0.1:0`); the harness reads the address from the node's ready line.
//! Every wait has a deadline; every process is killed when its handle drops.

#![allow(dead_code)]

mod failed;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use floret_chaos::process::{
    ClusterCerts, LOG_FILTER, ServeArgs, TEST_MIN_FREE_BYTES, peers_flag, poll, ready_address,
    shard_leader,
};
use floret_client::Client;

pub use floret_chaos::process::START_DEADLINE;

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
        let mut args = vec!["--listen".to_owned(), "127.0.0.1:0".to_owned()];
        args.extend(extra_args.iter().map(|a| (*a).to_owned()));
        Self::spawn(data_dir, &args).wait_ready()
    }

    /// Starts `floret serve --data-dir data_dir args...` without waiting for it.
    pub fn spawn(data_dir: &Path, args: &[String]) -> Starting {
        Self::spawn_with_failpoints(data_dir, args, "")
    }

    /// Like [`Self::spawn`], with `FAILPOINTS` set to `failpoints` (needs
    /// `floret` built with the `failpoints` feature).
    pub fn spawn_with_failpoints(data_dir: &Path, args: &[String], failpoints: &str) -> Starting {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data_dir.with_extension("log"))
            .expect("node log file");
        let serve = ServeArgs {
            data_dir: data_dir.to_path_buf(),
            extra: args.to_vec(),
            ..ServeArgs::default()
        };
        let mut command = Command::new(floret_binary());
        if !failpoints.is_empty() {
            command.env("FAILPOINTS", failpoints);
        }
        let mut child = command
            .args(serve.to_args())
            .env("RUST_LOG", LOG_FILTER)
            .env("FLORET_MIN_FREE_BYTES", TEST_MIN_FREE_BYTES)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn floret serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(address) = ready_address(&line) {
                    let _ = ready_tx.send(address.to_owned());
                }
            }
        });
        Starting {
            child: Some(child),
            ready: ready_rx,
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

/// A `floret serve` process that has not said it serves yet.
pub struct Starting {
    child: Option<Child>,
    ready: mpsc::Receiver<String>,
    data_dir: PathBuf,
}

impl Starting {
    /// Waits for the node's ready line; panics with its log after [`START_DEADLINE`].
    pub fn wait_ready(mut self) -> FloretProcess {
        let mut child = self.child.take().expect("not waited twice");
        match self.ready.recv_timeout(START_DEADLINE) {
            Ok(address) => FloretProcess {
                child,
                address,
                data_dir: self.data_dir.clone(),
            },
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(self.data_dir.with_extension("log"))
                    .unwrap_or_default();
                panic!("floret did not become ready within {START_DEADLINE:?}; its log:\n{log}");
            }
        }
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Serialises tests that start clusters: two clusters at once on two cores
/// would starve each other's heartbeats.
pub async fn one_cluster_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static CLUSTERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    CLUSTERS.lock().await
}

/// Several `floret serve` processes forming one cluster on loopback.
pub struct Cluster {
    root: PathBuf,
    /// Each node's client port.
    ports: Vec<u16>,
    /// Each node's peer port.
    peer_ports: Vec<u16>,
    extra_args: Vec<String>,
    /// The certificates of a cluster that runs over TLS.
    tls: Option<ClusterCerts>,
    /// `FAILPOINTS` of every node (empty: none).
    failpoints: String,
    /// Each node's gossip port, when it is not its peer port's number.
    gossip_ports: Option<Vec<u16>>,
    /// How many nodes founded the cluster (ids `1..=founders`); later ids
    /// joined it.
    founders: usize,
    /// The peer port of the next node to join, once asked for.
    next_peer_port: Option<u16>,
    nodes: Vec<Option<FloretProcess>>,
}

impl Cluster {
    /// Starts `size` nodes (ids 1..=size) under `root`, all at once, and
    /// waits until every one serves.
    pub fn start(root: &Path, size: usize, extra_args: &[&str]) -> Self {
        Self::start_with(root, size, extra_args, None, "")
    }

    /// Like [`Cluster::start`], every node (restarts included) with
    /// `FAILPOINTS` set to `failpoints` (needs `floret` built with the
    /// `failpoints` feature).
    pub fn start_with_failpoints(
        root: &Path,
        size: usize,
        extra_args: &[&str],
        failpoints: &str,
    ) -> Self {
        Self::start_with(root, size, extra_args, None, failpoints)
    }

    /// Like [`Cluster::start`], every node gossiping on a UDP port other
    /// than its peer port's number (`--gossip-listen`), which no other
    /// node is told.
    pub fn start_gossiping_elsewhere(root: &Path, size: usize, extra_args: &[&str]) -> Self {
        let mut cluster = Self::prepare(root, size, extra_args, None, "");
        cluster.gossip_ports =
            Some(floret_chaos::ports::free_loopback_ports(size).expect("free loopback ports"));
        cluster.start_all()
    }

    /// Like [`Cluster::start`], every node serving TLS on its client port
    /// and mutual TLS on its peer port, with certificates `floret certs`
    /// makes under `root`.
    pub fn start_tls(root: &Path, size: usize, extra_args: &[&str]) -> Self {
        let certs = ClusterCerts::make(Path::new(floret_binary()), &root.join("certs"), size)
            .expect("floret certs");
        Self::start_with(root, size, extra_args, Some(certs), "")
    }

    fn start_with(
        root: &Path,
        size: usize,
        extra_args: &[&str],
        tls: Option<ClusterCerts>,
        failpoints: &str,
    ) -> Self {
        Self::prepare(root, size, extra_args, tls, failpoints).start_all()
    }

    /// A cluster of `size` nodes with their ports picked, none started.
    fn prepare(
        root: &Path,
        size: usize,
        extra_args: &[&str],
        tls: Option<ClusterCerts>,
        failpoints: &str,
    ) -> Self {
        let mut ports =
            floret_chaos::ports::free_loopback_ports(2 * size).expect("free loopback ports");
        let peer_ports = ports.split_off(size);
        Self {
            root: root.to_path_buf(),
            ports,
            peer_ports,
            extra_args: extra_args.iter().map(|a| (*a).to_owned()).collect(),
            tls,
            failpoints: failpoints.to_owned(),
            gossip_ports: None,
            founders: size,
            next_peer_port: None,
            nodes: (0..size).map(|_| None).collect(),
        }
    }

    /// Starts a new node (the next id) that joins the running cluster by
    /// asking its founders (`--join`), on ports of its own (over TLS, with
    /// a certificate `floret certs` adds with the cluster's CA), and waits
    /// until it serves. Make it a member first (`Client::add_node` with
    /// [`Cluster::next_peer_address`]).
    pub fn join(&mut self) -> u64 {
        let next_peer_address = self.next_peer_address();
        let port = floret_chaos::ports::free_loopback_ports(1).expect("a free loopback port")[0];
        let peer_port: u16 = next_peer_address
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .expect("a peer address");
        self.ports.push(port);
        self.peer_ports.push(peer_port);
        self.nodes.push(None);
        let id = self.nodes.len() as u64;
        self.next_peer_port = None;
        if let Some(certs) = &self.tls {
            certs
                .add_node(Path::new(floret_binary()), id)
                .expect("floret certs for the new node");
        }
        let node = self.spawn(id).wait_ready();
        self.nodes[id as usize - 1] = Some(node);
        id
    }

    /// The peer address the next node [`Cluster::join`] starts will listen
    /// on (picked once, then kept until it joins).
    pub fn next_peer_address(&mut self) -> String {
        let port = *self.next_peer_port.get_or_insert_with(|| {
            floret_chaos::ports::free_loopback_ports(1).expect("a free loopback port")[0]
        });
        format!("127.0.0.1:{port}")
    }

    /// Starts every node at once and waits until each serves.
    fn start_all(mut self) -> Self {
        let starting: Vec<Starting> = (1..=self.nodes.len() as u64)
            .map(|id| self.spawn(id))
            .collect();
        for (index, node) in starting.into_iter().enumerate() {
            self.nodes[index] = Some(node.wait_ready());
        }
        self
    }

    fn spawn(&self, id: u64) -> Starting {
        let founders = peers_flag(
            (1..)
                .zip(&self.peer_ports[..self.founders])
                .map(|(id, port)| (id, format!("127.0.0.1:{port}"))),
        );
        let mut args = vec![
            "--node-id".to_owned(),
            id.to_string(),
            "--listen".to_owned(),
            self.address(id),
        ];
        if id as usize <= self.founders {
            args.extend(["--peers".to_owned(), founders]);
        } else {
            args.extend([
                "--join".to_owned(),
                founders,
                "--peer-listen".to_owned(),
                self.peer_address(id),
            ]);
        }
        if let Some(certs) = &self.tls {
            args.extend(certs.serve_flags(id));
        }
        if let Some(gossip_ports) = &self.gossip_ports {
            args.push("--gossip-listen".to_owned());
            args.push(format!("127.0.0.1:{}", gossip_ports[id as usize - 1]));
        }
        args.extend(self.extra_args.iter().cloned());
        FloretProcess::spawn_with_failpoints(&self.data_dir(id), &args, &self.failpoints)
    }

    /// Node `id`'s data dir.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.root.join(format!("node-{id}"))
    }

    /// `host:port` of node `id` (whether it runs or not).
    pub fn address(&self, id: u64) -> String {
        format!("127.0.0.1:{}", self.ports[id as usize - 1])
    }

    /// `host:port` of node `id`'s peer port (whether it runs or not).
    pub fn peer_address(&self, id: u64) -> String {
        format!("127.0.0.1:{}", self.peer_ports[id as usize - 1])
    }

    /// Every node's address, comma-separated, as the client takes them.
    pub fn addresses(&self) -> String {
        (1..=self.ports.len() as u64)
            .map(|id| self.address(id))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A client of node `id`.
    pub fn client(&self, id: u64) -> Client {
        self.client_of(&self.address(id))
    }

    /// A client of the nodes at `address` (one or several), over TLS when
    /// the cluster runs over TLS.
    pub fn client_of(&self, address: &str) -> Client {
        match &self.tls {
            Some(certs) => certs.client(address),
            None => Client::connect_lazy(address),
        }
        .expect("valid address")
    }

    /// The cluster's certificates, when it runs over TLS.
    pub fn certs(&self) -> Option<&ClusterCerts> {
        self.tls.as_ref()
    }

    /// SIGKILL of node `id`.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut node) = self.nodes[id as usize - 1].take() {
            node.kill();
        }
    }

    /// SIGTERM of node `id`; waits up to `deadline` for it to exit and
    /// returns how it exited (None: it was not running or did not exit).
    pub fn terminate(&mut self, id: u64, deadline: Duration) -> Option<std::process::ExitStatus> {
        let mut node = self.nodes[id as usize - 1].take()?;
        node.terminate();
        node.wait_exit(deadline)
    }

    /// Node `id`'s log (its stderr).
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(self.data_dir(id).with_extension("log")).unwrap_or_default()
    }

    /// Starts node `id` again (on whatever its data dir holds) and waits until it serves.
    pub fn restart(&mut self, id: u64) {
        self.kill(id);
        let node = self.spawn(id).wait_ready();
        self.nodes[id as usize - 1] = Some(node);
    }

    /// Like [`Cluster::restart`], this start of node `id` alone with
    /// `FAILPOINTS` set to `failpoints`.
    pub fn restart_with_failpoints(&mut self, id: u64, failpoints: &str) {
        let armed = std::mem::replace(&mut self.failpoints, failpoints.to_owned());
        self.restart(id);
        self.failpoints = armed;
    }

    /// Waits until every shard is led by its preferred replica, as node
    /// `via` reports it (panics after [`START_DEADLINE`]).
    pub async fn wait_for_preferred_leaders(&self, via: u64) {
        let client = self.client(via);
        let led = poll(START_DEADLINE, Duration::from_millis(50), || async {
            let status = client.cluster_status().await.ok()?;
            let all_preferred = !status.shards.is_empty()
                && status
                    .shards
                    .iter()
                    .all(|s| s.leader_id != 0 && s.leader_id == s.preferred_leader_id);
            all_preferred.then_some(())
        })
        .await;
        assert!(
            led.is_some(),
            "shards not led by their preferred replicas after {START_DEADLINE:?}"
        );
    }

    /// The leader of `shard` as node `via` reports it, once there is one
    /// (panics after [`START_DEADLINE`]).
    pub async fn leader_of(&self, shard: u32, via: u64) -> u64 {
        let client = self.client(via);
        let leader = poll(START_DEADLINE, Duration::from_millis(50), || async {
            let status = client.cluster_status().await.ok()?;
            let leader = shard_leader(&status, shard)?;
            let reachable = status
                .nodes
                .iter()
                .any(|n| n.node_id == leader && n.reachable);
            reachable.then_some(leader)
        })
        .await;
        leader.unwrap_or_else(|| {
            panic!("shard {shard} has no reachable leader after {START_DEADLINE:?}")
        })
    }
}

/// Runs `floret serve` (on 127.0.0.1:0 unless `extra_args` has a
/// `--listen`) expecting it to fail at start; returns its stderr.
pub fn start_expecting_failure(data_dir: &Path, extra_args: &[&str]) -> String {
    let listen: &[&str] = if extra_args.contains(&"--listen") {
        &[]
    } else {
        &["--listen", "127.0.0.1:0"]
    };
    let output = Command::new(floret_binary())
        .arg("serve")
        .args(listen)
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra_args)
        .env("FLORET_MIN_FREE_BYTES", TEST_MIN_FREE_BYTES)
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
    let held = poll(deadline, Duration::from_millis(20), || {
        let holds = condition();
        async move { holds.await.then_some(()) }
    })
    .await;
    assert!(held.is_some(), "{what} did not happen within {deadline:?}");
}

/// The services the server at the other end of `channel` lists by reflection.
pub async fn reflected_services(channel: tonic::transport::Channel) -> Vec<String> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        responses.message().await.unwrap().unwrap().message_response
    else {
        panic!("reflection did not list services");
    };
    list.service
        .into_iter()
        .map(|service| service.name)
        .collect()
}
