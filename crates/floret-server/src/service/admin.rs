//! The `floret.v1.Admin` service: cluster status, queue statistics,
//! replica digests, and policies and dead letters (in `policies.rs`).
//!
//! Queue statistics combine the durable per-producer counters of every shard
//! (read from the state machines, off the async runtime) with the
//! dispatcher's in-memory delivery counters.
//!
//! Cluster status asks every peer for its own view (`local_only`) and merges
//! them: each shard as its leader sees it, with every replica's applied
//! index and lag, and every node's reachability and gossip verdict. Queue
//! statistics do the same: each producer as the leader of its shard reports
//! it (durable counters, deliveries and dwell times in the recent window,
//! DRR weight and deficit), and Jain's index is computed over the merged
//! producers.
//!
//! IMPLEMENTATION CAVEATS
//! - Statistics list every producer with stored state; there is no paging yet.
//! - A shard without a reachable leader is reported from the replica that
//!   applied the most acks, without delivery figures.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::{Shards, View};
use floret_proto::v1;
use floret_store::{NodeId, ProducerEntry};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::{now_unix_ms, status};
use crate::commit::Committer;
use crate::deliver::DispatcherHandle;
use crate::deliver::fairness::WINDOW_SECONDS;
use crate::request;
use floret_sched::jain_index;

mod policies;

/// Serves inspection of one node.
pub struct AdminService {
    shards: Arc<Shards>,
    dispatcher: DispatcherHandle,
    committer: Committer,
    address: String,
    view: Option<watch::Receiver<Arc<View>>>,
}

impl AdminService {
    /// A service over the node's shards and dispatcher; `address` is what clients dial.
    pub fn new(
        shards: Arc<Shards>,
        dispatcher: DispatcherHandle,
        committer: Committer,
        address: String,
        view: Option<watch::Receiver<Arc<View>>>,
    ) -> Self {
        Self {
            shards,
            dispatcher,
            committer,
            address,
            view,
        }
    }
}

#[tonic::async_trait]
impl v1::admin_server::Admin for AdminService {
    async fn cluster_status(
        &self,
        request: Request<v1::ClusterStatusRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        let local = self.local_view();
        if request.into_inner().local_only {
            return Ok(Response::new(local));
        }
        let mut views = self
            .ask_peers(|mut client| async move {
                client
                    .cluster_status(v1::ClusterStatusRequest { local_only: true })
                    .await
            })
            .await;
        views.insert(self.shards.node_id(), Ok(local));
        Ok(Response::new(self.merge(views)))
    }

    async fn queue_stats(
        &self,
        request: Request<v1::QueueStatsRequest>,
    ) -> Result<Response<v1::QueueStatsResponse>, Status> {
        let request = request.into_inner();
        let wanted = (!request.queue.is_empty())
            .then(|| request::queue_name(&request.queue))
            .transpose()?;
        let local = self.local_stats(wanted).await?;
        if request.local_only || self.shards.peers().others().next().is_none() {
            return Ok(Response::new(local));
        }
        let queue = request.queue;
        let mut answers: Vec<v1::QueueStatsResponse> = self
            .ask_peers(|mut client| {
                let queue = queue.clone();
                async move {
                    client
                        .queue_stats(v1::QueueStatsRequest {
                            queue,
                            local_only: true,
                        })
                        .await
                }
            })
            .await
            .into_values()
            .filter_map(Result::ok)
            .collect();
        answers.push(local);
        Ok(Response::new(merge_queue_stats(answers)))
    }

    async fn replica_digests(
        &self,
        _request: Request<v1::ReplicaDigestsRequest>,
    ) -> Result<Response<v1::ReplicaDigestsResponse>, Status> {
        let shards = self.shards.clone();
        let replicas = tokio::task::spawn_blocking(move || replica_digests(&shards))
            .await
            .map_err(|e| Status::internal(format!("digest task failed: {e}")))??;
        Ok(Response::new(v1::ReplicaDigestsResponse { replicas }))
    }

    async fn set_policy(
        &self,
        request: Request<v1::SetPolicyRequest>,
    ) -> Result<Response<v1::SetPolicyResponse>, Status> {
        self.set_policy_in_shards(request.into_inner()).await
    }

    async fn get_policy(
        &self,
        request: Request<v1::GetPolicyRequest>,
    ) -> Result<Response<v1::GetPolicyResponse>, Status> {
        self.get_policy_from_a_replica(request.into_inner()).await
    }

    async fn list_dead_letters(
        &self,
        request: Request<v1::ListDeadLettersRequest>,
    ) -> Result<Response<v1::ListDeadLettersResponse>, Status> {
        self.list_dead_letters_everywhere(request.into_inner())
            .await
    }

    async fn replay_dead_letters(
        &self,
        request: Request<v1::DeadLetterIds>,
    ) -> Result<Response<v1::DeadLettersChanged>, Status> {
        self.change_dead_letters(request.into_inner(), true).await
    }

    async fn delete_dead_letters(
        &self,
        request: Request<v1::DeadLetterIds>,
    ) -> Result<Response<v1::DeadLettersChanged>, Status> {
        self.change_dead_letters(request.into_inner(), false).await
    }
}

/// Applied index and state digest of every shard replica this node holds.
fn replica_digests(shards: &Shards) -> Result<Vec<v1::ReplicaDigest>, Status> {
    shards
        .groups()
        .map(|group| {
            let read_error = |e: floret_store::StorageError| {
                Status::internal(format!("cannot read shard {}: {e}", group.id))
            };
            let applied = group.reader.applied_state().map_err(read_error)?;
            let (digest, keys) = group.reader.digest().map_err(read_error)?;
            Ok(v1::ReplicaDigest {
                shard_id: group.id,
                applied_index: applied.last_applied.map_or(0, |id| id.index),
                digest,
                keys,
            })
        })
        .collect()
}

impl AdminService {
    /// Asks every other node's Admin service with `call` (their own view,
    /// `local_only`), each within [`PEER_STATUS_TIMEOUT`]: per node, the
    /// answer or why there is none.
    async fn ask_peers<T, F, Fut>(&self, call: F) -> BTreeMap<NodeId, Result<T, String>>
    where
        F: Fn(v1::admin_client::AdminClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        let peers = self.shards.peers();
        let asks = peers.others().map(|node| {
            let client = peers.channel(node).map(v1::admin_client::AdminClient::new);
            let call = client.map(&call);
            async move {
                let Some(call) = call else {
                    return (node, Err("not a member".to_owned()));
                };
                let answer = match tokio::time::timeout(PEER_STATUS_TIMEOUT, call).await {
                    Ok(Ok(answer)) => Ok(answer.into_inner()),
                    Ok(Err(status)) => Err(status.message().to_owned()),
                    Err(_) => Err(format!("no answer within {PEER_STATUS_TIMEOUT:?}")),
                };
                (node, answer)
            }
        });
        futures::future::join_all(asks).await.into_iter().collect()
    }

    /// This node's own figures: durable counters of every shard it holds
    /// (marked `led` where it leads the producer's shard) and its
    /// dispatcher's delivery and fairness figures.
    async fn local_stats(&self, wanted: Option<String>) -> Result<v1::QueueStatsResponse, Status> {
        let shards = self.shards.clone();
        let filter = wanted.clone();
        let producers =
            tokio::task::spawn_blocking(move || durable_producers(&shards, filter.as_deref()))
                .await
                .map_err(|e| Status::internal(format!("stats task failed: {e}")))??;
        let activity = self
            .dispatcher
            .activity(true)
            .await
            .map_err(status::from_stopped)?;
        let mut queues: BTreeMap<String, v1::QueueStat> = BTreeMap::new();
        for (name, activity) in &activity {
            if wanted.as_ref().is_none_or(|w| w == name) {
                let stat = queues.entry(name.clone()).or_default();
                stat.queue = name.clone();
                stat.in_flight = activity.in_flight;
                stat.delivered = activity.delivered;
                stat.redelivered = activity.redelivered;
                stat.consumers = activity.consumers;
            }
        }
        for (entry, oldest_age_ms) in producers {
            let queue_activity = activity.get(&entry.queue);
            let in_flight = queue_activity
                .and_then(|a| a.in_flight_by_producer.get(&entry.producer))
                .copied()
                .unwrap_or(0);
            let scheduling = queue_activity
                .and_then(|a| a.producers.get(&entry.producer))
                .cloned()
                .unwrap_or_default();
            let led = self.shards.leads(
                self.shards
                    .placement()
                    .shard_of(&entry.queue, &entry.producer),
            );
            let stat = queues.entry(entry.queue.clone()).or_default();
            stat.queue = entry.queue.clone();
            stat.producers.push(v1::ProducerStat {
                producer_id: entry.producer,
                backlog_messages: entry.record.messages,
                backlog_bytes: entry.record.bytes,
                in_flight,
                delivered: entry.record.acked + in_flight,
                acked: entry.record.acked,
                oldest_message_age_ms: oldest_age_ms,
                window_deliveries: scheduling.fairness.window_deliveries,
                dwell_p50_ms: scheduling.fairness.dwell_p50_ms,
                dwell_p99_ms: scheduling.fairness.dwell_p99_ms,
                weight: scheduling.weight.max(1),
                deficit: scheduling.deficit,
                ready: scheduling.ready,
                led,
            });
        }
        for stat in queues.values_mut() {
            summarise(stat);
        }
        Ok(v1::QueueStatsResponse {
            queues: queues.into_values().collect(),
        })
    }
}

/// Fills a queue's totals and Jain's index from its producers.
fn summarise(stat: &mut v1::QueueStat) {
    stat.backlog_messages = stat.producers.iter().map(|p| p.backlog_messages).sum();
    stat.backlog_bytes = stat.producers.iter().map(|p| p.backlog_bytes).sum();
    stat.acked = stat.producers.iter().map(|p| p.acked).sum();
    stat.oldest_message_age_ms = stat
        .producers
        .iter()
        .map(|p| p.oldest_message_age_ms)
        .max()
        .unwrap_or(0);
    let shares: Vec<f64> = stat
        .producers
        .iter()
        .filter(|p| p.window_deliveries > 0 && p.ready > 0)
        .map(|p| p.window_deliveries as f64 / f64::from(p.weight.max(1)))
        .collect();
    stat.jain_index = jain_index(&shares).unwrap_or(0.0);
    stat.fairness_window_seconds = WINDOW_SECONDS;
}

/// Every node's own figures merged: a producer's from the node leading its
/// shard (else the replica that applied the most acks), delivery counters
/// summed over the nodes' dispatchers.
fn merge_queue_stats(answers: Vec<v1::QueueStatsResponse>) -> v1::QueueStatsResponse {
    let mut queues: BTreeMap<String, v1::QueueStat> = BTreeMap::new();
    let mut producers: BTreeMap<(String, String), v1::ProducerStat> = BTreeMap::new();
    for answer in answers {
        for stat in answer.queues {
            let merged = queues.entry(stat.queue.clone()).or_default();
            merged.queue = stat.queue.clone();
            merged.in_flight += stat.in_flight;
            merged.delivered += stat.delivered;
            merged.redelivered += stat.redelivered;
            merged.consumers += stat.consumers;
            for producer in stat.producers {
                let key = (stat.queue.clone(), producer.producer_id.clone());
                let better = producers
                    .get(&key)
                    .is_none_or(|known| (producer.led, producer.acked) > (known.led, known.acked));
                if better {
                    producers.insert(key, producer);
                }
            }
        }
    }
    for ((queue, _), producer) in producers {
        queues.entry(queue).or_default().producers.push(producer);
    }
    for stat in queues.values_mut() {
        summarise(stat);
    }
    v1::QueueStatsResponse {
        queues: queues.into_values().collect(),
    }
}

/// Resident memory of this process, from `/proc/self/status` (Linux only).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kibibytes: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kibibytes * 1024)
}

/// How long the answering node waits for each peer's view.
const PEER_STATUS_TIMEOUT: Duration = Duration::from_secs(2);

impl AdminService {
    /// This node's own view: itself, and the shards it holds.
    fn local_view(&self) -> v1::ClusterStatusResponse {
        let node_id = self.shards.node_id();
        let replicas = self.shards.replicas();
        let shards: Vec<v1::ShardStatus> = self
            .shards
            .groups()
            .map(|group| {
                let metrics = group.raft.metrics().borrow().clone();
                v1::ShardStatus {
                    shard_id: group.id,
                    leader_id: metrics.current_leader.unwrap_or(0),
                    term: metrics.current_term,
                    applied_index: metrics.last_applied.map(|id| id.index).unwrap_or(0),
                    last_log_index: metrics.last_log_index.unwrap_or(0),
                    voters: metrics.membership_config.membership().voter_ids().collect(),
                    preferred_leader_id: replicas.preferred_leader(group.id),
                    replicas: Vec::new(),
                }
            })
            .collect();
        let shards_led = shards.iter().filter(|s| s.leader_id == node_id).count() as u32;
        v1::ClusterStatusResponse {
            node_id,
            nodes: vec![v1::NodeStatus {
                node_id,
                address: self.address.clone(),
                reachable: true,
                shards_led,
                resident_bytes: resident_bytes().unwrap_or(0),
                ..Default::default()
            }],
            shards,
        }
    }

    /// Every node's view merged: each shard as its leader reports it (else
    /// the replica with the highest term), with every replica's progress.
    fn merge(
        &self,
        views: BTreeMap<u64, Result<v1::ClusterStatusResponse, String>>,
    ) -> v1::ClusterStatusResponse {
        let peers = self.shards.peers();
        let mut nodes: Vec<v1::NodeStatus> = views
            .iter()
            .map(|(&node_id, view)| match view {
                Ok(view) => v1::NodeStatus {
                    address: peers.address(node_id).unwrap_or_default().to_owned(),
                    ..view.nodes.first().cloned().unwrap_or_default()
                },
                Err(error) => v1::NodeStatus {
                    node_id,
                    address: peers.address(node_id).unwrap_or_default().to_owned(),
                    reachable: false,
                    error: error.clone(),
                    ..Default::default()
                },
            })
            .collect();
        let reports: BTreeMap<(u32, u64), &v1::ShardStatus> = views
            .iter()
            .filter_map(|(&node, view)| view.as_ref().ok().map(|view| (node, view)))
            .flat_map(|(node, view)| view.shards.iter().map(move |s| ((s.shard_id, node), s)))
            .collect();
        let placement = self.shards.replicas();
        let shards = (0..self.shards.placement().shard_count())
            .map(|shard| {
                let replicas = placement.replicas(shard);
                let reported: Vec<(u64, &v1::ShardStatus)> = replicas
                    .iter()
                    .filter_map(|&node| reports.get(&(shard, node)).map(|s| (node, *s)))
                    .collect();
                let best = reported
                    .iter()
                    .max_by_key(|(node, s)| (s.leader_id == *node, s.term, s.last_log_index))
                    .map(|(_, s)| (*s).clone())
                    .unwrap_or_else(|| v1::ShardStatus {
                        shard_id: shard,
                        preferred_leader_id: placement.preferred_leader(shard),
                        ..Default::default()
                    });
                let replica_statuses = replicas
                    .iter()
                    .map(|&node| match reports.get(&(shard, node)) {
                        Some(report) => v1::ReplicaStatus {
                            node_id: node,
                            reachable: true,
                            applied_index: report.applied_index,
                            lag: best.last_log_index.saturating_sub(report.applied_index),
                        },
                        None => v1::ReplicaStatus {
                            node_id: node,
                            ..Default::default()
                        },
                    })
                    .collect();
                v1::ShardStatus {
                    replicas: replica_statuses,
                    ..best
                }
            })
            .collect();
        if let Some(view) = &self.view {
            let view = view.borrow().clone();
            for node in &mut nodes {
                let Some(seen) = view.get(&node.node_id) else {
                    node.liveness = "unknown".into();
                    continue;
                };
                node.liveness = seen.liveness.as_str().into();
                node.heartbeat_age_ms = seen.age.as_millis() as u64;
                let queues = seen.report.queues.values();
                node.backlog_messages = queues.clone().map(|q| q.messages).sum();
                node.backlog_bytes = queues.clone().map(|q| q.bytes).sum();
                node.backlogged_producers = queues.clone().map(|q| q.backlogged_producers).sum();
                node.dispatch_rate = queues.map(|q| q.dispatch_rate).sum();
            }
        }
        v1::ClusterStatusResponse {
            node_id: self.shards.node_id(),
            nodes,
            shards,
        }
    }
}

/// Every producer of every shard (of one queue, if given), with its oldest message's age.
fn durable_producers(
    shards: &Shards,
    queue: Option<&str>,
) -> Result<Vec<(ProducerEntry, u64)>, Status> {
    let now_ms = now_unix_ms();
    let mut producers = Vec::new();
    for group in shards.groups() {
        for entry in group.reader.producers() {
            let entry = entry
                .map_err(|e| Status::internal(format!("cannot read shard {}: {e}", group.id)))?;
            if queue.is_some_and(|q| q != entry.queue) {
                continue;
            }
            let oldest_age_ms = if entry.record.messages == 0 {
                0
            } else {
                group
                    .reader
                    .oldest_message(&entry.queue, &entry.producer, entry.record.head)
                    .map_err(|e| Status::internal(format!("cannot read shard {}: {e}", group.id)))?
                    .map(|(_, message)| (now_ms - message.enqueued_at_ms).max(0) as u64)
                    .unwrap_or(0)
            };
            producers.push((entry, oldest_age_ms));
        }
    }
    Ok(producers)
}
