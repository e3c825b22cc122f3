//! The console's JSON: the Admin service's cluster status and queue
//! statistics, cut to what the page shows (the largest producers of each
//! queue) and named for it.

use floret_proto::v1;
use serde::Serialize;

use super::PRODUCERS_SHOWN;

/// What `/api/overview` answers.
#[derive(Debug, Serialize)]
pub struct Overview {
    /// The node that answered.
    pub node: u64,
    /// When, in Unix ms.
    pub at_unix_ms: i64,
    pub nodes: Vec<NodeRow>,
    pub shards: Vec<ShardRow>,
    pub queues: Vec<QueueRow>,
}

#[derive(Debug, Serialize)]
pub struct NodeRow {
    pub id: u64,
    pub address: String,
    pub reachable: bool,
    /// Gossip's verdict (empty on a one-node cluster).
    pub liveness: String,
    pub shards_led: u32,
    pub resident_bytes: u64,
    /// Why it stopped serving, if it did.
    pub fault: String,
    pub error: String,
}

#[derive(Debug, Serialize)]
pub struct ShardRow {
    pub id: u32,
    /// 0 with no known leader.
    pub leader: u64,
    pub term: u64,
    pub replicas: Vec<ReplicaRow>,
}

#[derive(Debug, Serialize)]
pub struct ReplicaRow {
    pub node: u64,
    pub reachable: bool,
    /// Entries the leader has that the replica has not applied.
    pub lag: u64,
}

#[derive(Debug, Serialize)]
pub struct QueueRow {
    pub name: String,
    pub backlog_messages: u64,
    pub backlog_bytes: u64,
    pub in_flight: u64,
    pub consumers: u64,
    pub jain_index: f64,
    /// Producers in the queue, of which `producers` lists the largest.
    pub producer_count: usize,
    pub producers: Vec<ProducerRow>,
}

#[derive(Debug, Serialize)]
pub struct ProducerRow {
    pub id: String,
    pub backlog_messages: u64,
    pub in_flight: u64,
    pub dwell_p99_ms: u64,
    /// Deliveries in the recent fairness window, across the cluster.
    pub window_deliveries: u64,
    pub weight: u32,
}

/// One dead letter as `/api/dead-letters` lists it (no payload).
#[derive(Debug, Serialize)]
pub struct DeadLetterRow {
    pub queue: String,
    pub id: String,
    pub producer: String,
    pub reason: String,
    pub attempts: u32,
    pub dead_lettered_at_unix_ms: i64,
}

impl DeadLetterRow {
    pub fn new(queue: &str, letter: v1::DeadLetter) -> Self {
        Self {
            queue: queue.to_owned(),
            id: letter.id,
            producer: letter.producer_id,
            reason: letter.reason,
            attempts: letter.attempts,
            dead_lettered_at_unix_ms: letter.dead_lettered_at_unix_ms,
        }
    }
}

impl Overview {
    /// The page's view of `status` and `stats`, answered by `node` at `at_unix_ms`.
    pub fn new(
        status: v1::ClusterStatusResponse,
        stats: v1::QueueStatsResponse,
        at_unix_ms: i64,
    ) -> Self {
        Self {
            node: status.node_id,
            at_unix_ms,
            nodes: status
                .nodes
                .into_iter()
                .map(|node| NodeRow {
                    id: node.node_id,
                    address: node.address,
                    reachable: node.reachable,
                    liveness: node.liveness,
                    shards_led: node.shards_led,
                    resident_bytes: node.resident_bytes,
                    fault: node.fault,
                    error: node.error,
                })
                .collect(),
            shards: status
                .shards
                .into_iter()
                .map(|shard| ShardRow {
                    id: shard.shard_id,
                    leader: shard.leader_id,
                    term: shard.term,
                    replicas: shard
                        .replicas
                        .into_iter()
                        .map(|replica| ReplicaRow {
                            node: replica.node_id,
                            reachable: replica.reachable,
                            lag: replica.lag,
                        })
                        .collect(),
                })
                .collect(),
            queues: stats.queues.into_iter().map(queue_row).collect(),
        }
    }
}

fn queue_row(mut queue: v1::QueueStat) -> QueueRow {
    let producer_count = queue.producers.len();
    queue.producers.sort_by(|a, b| {
        b.backlog_messages
            .cmp(&a.backlog_messages)
            .then(b.window_deliveries.cmp(&a.window_deliveries))
            .then(a.producer_id.cmp(&b.producer_id))
    });
    queue.producers.truncate(PRODUCERS_SHOWN);
    QueueRow {
        name: queue.queue,
        backlog_messages: queue.backlog_messages,
        backlog_bytes: queue.backlog_bytes,
        in_flight: queue.in_flight,
        consumers: queue.consumers,
        jain_index: queue.jain_index,
        producer_count,
        producers: queue
            .producers
            .into_iter()
            .map(|producer| ProducerRow {
                id: producer.producer_id,
                backlog_messages: producer.backlog_messages,
                in_flight: producer.in_flight,
                dwell_p99_ms: producer.dwell_p99_ms,
                window_deliveries: producer.window_deliveries,
                weight: producer.weight,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_with_thousands_of_producers_sent_them_all_to_the_page() {
        let producers = (0..1_000)
            .map(|n| v1::ProducerStat {
                producer_id: format!("p{n}"),
                backlog_messages: n,
                ..Default::default()
            })
            .collect();
        let row = queue_row(v1::QueueStat {
            queue: "q".into(),
            producers,
            ..Default::default()
        });
        assert_eq!(row.producer_count, 1_000);
        assert_eq!(row.producers.len(), PRODUCERS_SHOWN);
        assert_eq!(row.producers[0].id, "p999", "largest backlog first");
    }
}
