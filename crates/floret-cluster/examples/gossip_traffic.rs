//! Gossip traffic per node for a cluster of N nodes, measured on loopback:
//! N gossip agents in this process, each publishing a load report for Q
//! queues that changes every round (the worst case: every value is new),
//! for T seconds.
//!
//!     cargo run --release -p floret-cluster --example gossip_traffic -- 30 1 20
//!
//! Arguments: nodes (3), queues per node (1), seconds (10).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use floret_cluster::{Gossip, GossipConfig, GossipSecret, Liveness, NodeReport, QueueLoad};

const INTERVAL: Duration = Duration::from_millis(200);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let nodes = args.first().copied().unwrap_or(3);
    let queues = args.get(1).copied().unwrap_or(1);
    let seconds = args.get(2).copied().unwrap_or(10);
    let ports: Vec<u16> = (0..nodes)
        .map(|_| {
            std::net::UdpSocket::bind("127.0.0.1:0")
                .and_then(|s| s.local_addr())
                .map(|a| a.port())
        })
        .collect::<Result<_, _>>()?;
    let mut agents = Vec::new();
    for (index, port) in ports.iter().enumerate() {
        let address = SocketAddr::from(([127, 0, 0, 1], *port));
        let seeds = ports
            .iter()
            .take(3)
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let config = GossipConfig {
            listen: address,
            advertise: address,
            seeds,
            interval: INTERVAL,
            phi_threshold: 8.0,
            cluster_name: "floret".into(),
            secret: Some(GossipSecret::new(b"the example's gossip secret")?),
        };
        agents.push(Gossip::start(index as u64 + 1, &address.to_string(), config).await?);
    }
    let started = Instant::now();
    let mut round = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        round += 1;
        for (index, agent) in agents.iter().enumerate() {
            let report = NodeReport {
                shards_led: vec![index as u32],
                queues: (0..queues)
                    .map(|q| {
                        let load = QueueLoad {
                            backlogged_producers: round % 100,
                            backlogged_weight: round % 100,
                            messages: round * 10,
                            bytes: round * 1_280,
                            dispatch_rate: round as f64,
                            consumers: 1,
                        };
                        (format!("queue-{q}"), load)
                    })
                    .collect::<BTreeMap<_, _>>(),
                tenants: BTreeMap::new(),
            };
            agent.publish(&report).await;
        }
        tokio::time::sleep(INTERVAL).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let alive = agents[0]
        .view()
        .await
        .values()
        .filter(|n| n.liveness == Liveness::Alive)
        .count();
    let (mut sent, mut received) = (0u64, 0u64);
    for agent in &agents {
        let (s, r) = agent.traffic().totals();
        sent += s;
        received += r;
    }
    println!(
        "{nodes} nodes, {queues} queue(s) each, {elapsed:.0} s: per node {:.0} B/s sent, {:.0} B/s received; node 1 sees {alive} alive",
        sent as f64 / nodes as f64 / elapsed,
        received as f64 / nodes as f64 / elapsed
    );
    for agent in agents {
        agent.shutdown().await;
    }
    Ok(())
}
