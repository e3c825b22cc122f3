//! `floret status`: the cluster's nodes (reachable, shards led), every
//! shard with its leader, preferred leader and each replica's lag, then
//! per-queue and per-producer statistics; a table, or `--json`.

use crate::DEFAULT_ADDRESS;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Node to ask.
    #[arg(long, default_value = DEFAULT_ADDRESS)]
    addr: String,
    /// Only this queue's statistics.
    #[arg(long, default_value = "")]
    queue: String,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Producers listed per queue in the table (the busiest first).
    #[arg(long, default_value_t = 20)]
    top: usize,
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let client = crate::dial(&args.addr)?;
    let cluster = client.cluster_status().await?;
    let stats = client.queue_stats(&args.queue).await?;
    if args.json {
        let json = serde_json::json!({
            "node_id": cluster.node_id,
            "nodes": cluster.nodes.iter().map(|n| serde_json::json!({
                "node_id": n.node_id, "address": n.address, "peer_address": n.peer_address, "reachable": n.reachable, "fault": n.fault,
                "shards_led": n.shards_led, "error": n.error, "liveness": n.liveness,
                "gossip_address": n.gossip_address, "gossip_warning": n.gossip_warning,
                "heartbeat_age_ms": n.heartbeat_age_ms, "backlog_messages": n.backlog_messages,
                "backlog_bytes": n.backlog_bytes, "backlogged_producers": n.backlogged_producers,
                "dispatch_rate": n.dispatch_rate,
            })).collect::<Vec<_>>(),
            "shards": cluster.shards.iter().map(|s| serde_json::json!({
                "shard_id": s.shard_id, "leader_id": s.leader_id, "preferred_leader_id": s.preferred_leader_id,
                "term": s.term, "applied_index": s.applied_index, "last_log_index": s.last_log_index,
                "voters": s.voters,
                "replicas": s.replicas.iter().map(|r| serde_json::json!({
                    "node_id": r.node_id, "reachable": r.reachable, "applied_index": r.applied_index, "lag": r.lag,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "queues": stats.queues.iter().map(|q| serde_json::json!({
                "queue": q.queue, "backlog_messages": q.backlog_messages, "backlog_bytes": q.backlog_bytes,
                "in_flight": q.in_flight, "delivered": q.delivered, "acked": q.acked, "redelivered": q.redelivered,
                "consumers": q.consumers, "oldest_message_age_ms": q.oldest_message_age_ms,
                "jain_index": q.jain_index, "fairness_window_seconds": q.fairness_window_seconds,
                "producers": q.producers.iter().map(|p| serde_json::json!({
                    "producer_id": p.producer_id, "backlog_messages": p.backlog_messages, "backlog_bytes": p.backlog_bytes,
                    "in_flight": p.in_flight, "delivered": p.delivered, "acked": p.acked,
                    "oldest_message_age_ms": p.oldest_message_age_ms,
                    "window_deliveries": p.window_deliveries, "dwell_p50_ms": p.dwell_p50_ms,
                    "dwell_p99_ms": p.dwell_p99_ms, "weight": p.weight, "deficit": p.deficit,
                    "ready": p.ready,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    println!(
        "asked node {} ({} nodes)\n\n{:>5}  {:<24}  {:<11}  {:<9}  {:>7}  {:>10}  {:>10}  {:>12}  {:>9}",
        cluster.node_id,
        cluster.nodes.len(),
        "node",
        "address",
        "state",
        "gossip",
        "age ms",
        "shards led",
        "backlog",
        "bytes",
        "deliv/s"
    );
    for node in &cluster.nodes {
        let state = match (node.reachable, node.fault.is_empty()) {
            (false, _) => "unreachable",
            (true, false) => "FAULT",
            (true, true) => "up",
        };
        let address = if node.address.is_empty() {
            format!("peer {}", node.peer_address)
        } else {
            node.address.clone()
        };
        println!(
            "{:>5}  {:<24}  {:<11}  {:<9}  {:>7}  {:>10}  {:>10}  {:>12}  {:>9.0}{}",
            node.node_id,
            address,
            state,
            if node.liveness.is_empty() {
                "-"
            } else {
                &node.liveness
            },
            node.heartbeat_age_ms,
            node.shards_led,
            node.backlog_messages,
            node.backlog_bytes,
            node.dispatch_rate,
            if !node.fault.is_empty() {
                format!("  (stopped serving: {}; restart it)", node.fault)
            } else if !node.gossip_warning.is_empty() {
                format!("  (gossip: {})", node.gossip_warning)
            } else if node.error.is_empty() {
                String::new()
            } else {
                format!("  ({})", node.error)
            }
        );
    }
    println!(
        "\n{:>5}  {:>6}  {:>9}  {:>5}  {:>10}  replicas (node:lag, ? = no answer)",
        "shard", "leader", "preferred", "term", "last log"
    );
    for shard in &cluster.shards {
        let leader = if shard.leader_id == 0 {
            "-".to_owned()
        } else {
            shard.leader_id.to_string()
        };
        let replicas: Vec<String> = shard
            .replicas
            .iter()
            .map(|r| {
                if r.reachable {
                    format!("{}:{}", r.node_id, r.lag)
                } else {
                    format!("{}:?", r.node_id)
                }
            })
            .collect();
        println!(
            "{:>5}  {:>6}  {:>9}  {:>5}  {:>10}  {}",
            shard.shard_id,
            leader,
            shard.preferred_leader_id,
            shard.term,
            shard.last_log_index,
            replicas.join(" ")
        );
    }
    for queue in &stats.queues {
        println!(
            "\nqueue {}: backlog {} msgs / {} B, in flight {}, delivered {}, acked {}, redelivered {}, consumers {}, oldest {} ms, Jain {:.3} over {} s",
            queue.queue,
            queue.backlog_messages,
            queue.backlog_bytes,
            queue.in_flight,
            queue.delivered,
            queue.acked,
            queue.redelivered,
            queue.consumers,
            queue.oldest_message_age_ms,
            queue.jain_index,
            queue.fairness_window_seconds
        );
        let mut producers: Vec<_> = queue.producers.iter().collect();
        producers.sort_by(|a, b| {
            b.backlog_messages
                .cmp(&a.backlog_messages)
                .then(a.producer_id.cmp(&b.producer_id))
        });
        println!(
            "  {:<32}  {:>10}  {:>10}  {:>9}  {:>10}  {:>10}  {:>8}  {:>9}  {:>9}  {:>6}",
            "producer",
            "backlog",
            "bytes",
            "in flight",
            "acked",
            "oldest ms",
            "window",
            "dwell p50",
            "dwell p99",
            "weight"
        );
        for producer in producers.iter().take(args.top) {
            println!(
                "  {:<32}  {:>10}  {:>10}  {:>9}  {:>10}  {:>10}  {:>8}  {:>9}  {:>9}  {:>6}",
                producer.producer_id,
                producer.backlog_messages,
                producer.backlog_bytes,
                producer.in_flight,
                producer.acked,
                producer.oldest_message_age_ms,
                producer.window_deliveries,
                producer.dwell_p50_ms,
                producer.dwell_p99_ms,
                producer.weight
            );
        }
        if producers.len() > args.top {
            println!("  ... {} more producers", producers.len() - args.top);
        }
    }
    Ok(())
}
