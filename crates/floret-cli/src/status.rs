//! `floret status`: the cluster's nodes (reachable, shards led), the
//! member list as the membership group holds it, every
//! shard with its leader, preferred leader and each replica's lag, then
//! per-queue and per-producer statistics; tables in human units
//! (`table.rs`), or `--json` with raw figures.

use crate::DEFAULT_ADDRESS;
use crate::table::{Align, Table, bytes, count, millis};

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
                "dispatch_rate": n.dispatch_rate, "stale_replicas": n.stale_replicas,
            })).collect::<Vec<_>>(),
            "membership": cluster.membership.as_ref().map(|m| serde_json::json!({
                "epoch": m.epoch, "leader_id": m.leader_id,
                "members": m.members.iter().map(|member| serde_json::json!({
                    "node_id": member.node_id, "peer_address": member.peer_address, "voter": member.voter,
                    "leaving": member.leaving,
                    "seat": member.seat,
                })).collect::<Vec<_>>(),
            })),
            "shards": cluster.shards.iter().map(|s| serde_json::json!({
                "shard_id": s.shard_id, "leader_id": s.leader_id, "preferred_leader_id": s.preferred_leader_id,
                "term": s.term, "applied_index": s.applied_index, "last_log_index": s.last_log_index,
                "voters": s.voters, "learners": s.learners, "placed": s.placed,
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
        "asked node {} ({} nodes)\n",
        cluster.node_id,
        cluster.nodes.len()
    );
    let mut nodes = Table::new(&[
        ("node", Align::Right),
        ("address", Align::Left),
        ("state", Align::Left),
        ("gossip", Align::Left),
        ("heard", Align::Right),
        ("shards led", Align::Right),
        ("backlog", Align::Right),
        ("bytes", Align::Right),
        ("deliv/s", Align::Right),
        ("note", Align::Left),
    ]);
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
        let note = if !node.fault.is_empty() {
            format!("stopped serving: {}; restart it", node.fault)
        } else if !node.gossip_warning.is_empty() {
            format!("gossip: {}", node.gossip_warning)
        } else if !node.stale_replicas.is_empty() {
            let shards: Vec<String> = node.stale_replicas.iter().map(u32::to_string).collect();
            format!(
                "replicas moved away, to delete: shards {}",
                shards.join(", ")
            )
        } else {
            node.error.clone()
        };
        nodes.row(vec![
            node.node_id.to_string(),
            address,
            state.to_owned(),
            if node.liveness.is_empty() {
                "-".to_owned()
            } else {
                node.liveness.clone()
            },
            format!("{} ago", millis(node.heartbeat_age_ms)),
            count(u64::from(node.shards_led)),
            count(node.backlog_messages),
            bytes(node.backlog_bytes),
            count(node.dispatch_rate.round() as u64),
            note,
        ]);
    }
    println!("{}", nodes.render(""));
    println!("{}\n", members_line(cluster.membership.as_ref()));
    let mut shards = Table::new(&[
        ("shard", Align::Right),
        ("leader", Align::Right),
        ("preferred", Align::Right),
        ("term", Align::Right),
        ("last log", Align::Right),
        ("replicas (node:lag, ? = no answer)", Align::Left),
    ]);
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
        shards.row(vec![
            shard.shard_id.to_string(),
            leader,
            shard.preferred_leader_id.to_string(),
            shard.term.to_string(),
            count(shard.last_log_index),
            replicas.join(" "),
        ]);
    }
    println!("\n{}", shards.render(""));
    for queue in &stats.queues {
        println!(
            "\nqueue {}: backlog {} msgs / {}, in flight {}, delivered {}, acked {}, redelivered {}, consumers {}, oldest {}, Jain {:.3} over {} s",
            queue.queue,
            count(queue.backlog_messages),
            bytes(queue.backlog_bytes),
            count(queue.in_flight),
            count(queue.delivered),
            count(queue.acked),
            count(queue.redelivered),
            queue.consumers,
            millis(queue.oldest_message_age_ms),
            queue.jain_index,
            queue.fairness_window_seconds
        );
        let mut producers: Vec<_> = queue.producers.iter().collect();
        producers.sort_by(|a, b| {
            b.backlog_messages
                .cmp(&a.backlog_messages)
                .then(a.producer_id.cmp(&b.producer_id))
        });
        let mut table = Table::new(&[
            ("producer", Align::Left),
            ("backlog", Align::Right),
            ("bytes", Align::Right),
            ("in flight", Align::Right),
            ("acked", Align::Right),
            ("oldest", Align::Right),
            ("window", Align::Right),
            ("dwell p50", Align::Right),
            ("dwell p99", Align::Right),
            ("weight", Align::Right),
        ]);
        for producer in producers.iter().take(args.top) {
            table.row(vec![
                producer.producer_id.clone(),
                count(producer.backlog_messages),
                bytes(producer.backlog_bytes),
                count(producer.in_flight),
                count(producer.acked),
                millis(producer.oldest_message_age_ms),
                count(producer.window_deliveries),
                millis(producer.dwell_p50_ms),
                millis(producer.dwell_p99_ms),
                producer.weight.to_string(),
            ]);
        }
        println!("{}", table.render("  "));
        if producers.len() > args.top {
            println!("  ... {} more producers", producers.len() - args.top);
        }
    }
    Ok(())
}

/// The member list in one line: its epoch, and each member with its peer
/// address, the membership group's leader marked `*`, learners `(learner)`.
pub(crate) fn members_line(membership: Option<&floret_client::Membership>) -> String {
    let Some(membership) = membership.filter(|m| m.epoch.is_some()) else {
        return "members: the membership group is not founded yet".to_owned();
    };
    let members: Vec<String> = membership
        .members
        .iter()
        .map(|member| {
            let leader = if member.node_id == membership.leader_id {
                "*"
            } else {
                ""
            };
            let learner = match (member.voter, member.leaving) {
                (_, true) => " (leaving)",
                (false, false) => " (learner)",
                (true, false) => "",
            };
            let seat = if member.seat != 0 && member.seat != member.node_id {
                format!(" (in seat {})", member.seat)
            } else {
                String::new()
            };
            format!(
                "{}{leader} {}{seat}{learner}",
                member.node_id, member.peer_address
            )
        })
        .collect();
    format!(
        "members at epoch {}: {}",
        membership.epoch.unwrap_or_default(),
        members.join(", ")
    )
}
