//! Gossip sealed with the cluster's secret: members see each other, and a
//! stranger's datagrams (well-formed chitchat, sealed with another secret
//! or not at all) are dropped and counted without touching the view.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use floret_cluster::{Gossip, GossipConfig, GossipSecret, Liveness};

const INTERVAL: Duration = Duration::from_millis(100);
const DEADLINE: Duration = Duration::from_secs(15);

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|socket| socket.local_addr())
        .map(|address| address.port())
        .unwrap()
}

async fn agent(node: u64, port: u16, seeds: &[u16], secret: Option<&[u8]>) -> Gossip {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let config = GossipConfig {
        listen: address,
        advertise: address,
        seeds: seeds.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
        interval: INTERVAL,
        phi_threshold: 8.0,
        cluster_name: "floret".into(),
        secret: secret.map(|secret| GossipSecret::new(secret).unwrap()),
    };
    Gossip::start(node, &address.to_string(), config)
        .await
        .unwrap()
}

async fn eventually(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let until = Instant::now() + DEADLINE;
    while !condition().await {
        assert!(Instant::now() < until, "{what} within {DEADLINE:?}");
        tokio::time::sleep(INTERVAL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_gossip_datagram_rewrites_the_view() {
    let secret = b"the cluster's own gossip secret";
    let ports: Vec<u16> = (0..4).map(|_| free_udp_port()).collect();
    let one = agent(1, ports[0], &ports[1..2], Some(secret)).await;
    let two = agent(2, ports[1], &ports[0..1], Some(secret)).await;
    eventually("node 1 sees node 2 alive", async || {
        one.view()
            .await
            .get(&2)
            .is_some_and(|node| node.liveness == Liveness::Alive)
    })
    .await;
    let dropped_before = one.traffic().dropped();

    let other_secret = agent(3, ports[2], &ports[0..1], Some(b"another cluster's secret")).await;
    let unsealed = agent(4, ports[3], &ports[0..1], None).await;
    eventually("node 1 drops the strangers' datagrams", async || {
        one.traffic().dropped() >= dropped_before + 4
    })
    .await;
    tokio::time::sleep(INTERVAL * 10).await;
    let view = one.view().await;
    assert_eq!(
        view.keys().copied().collect::<Vec<_>>(),
        vec![1, 2],
        "strangers entered the view"
    );
    assert!(
        !other_secret.view().await.contains_key(&1),
        "a stranger learnt node 1's state"
    );
    for gossip in [one, two, other_secret, unsealed] {
        gossip.shutdown().await;
    }
}
