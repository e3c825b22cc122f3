//! The produce path, one step per file:
//!
//! 1. `batch.rs`: the request is checked once and becomes a [`ProduceBatch`]
//!    placed on its shard.
//! 2. The [`ShardRouter`](crate::router::ShardRouter) finds the shard's
//!    leader: a batch for a shard led elsewhere is forwarded whole, once
//!    (a forwarded batch is never forwarded again).
//! 3. `admission.rs`: on the leader, node backpressure (read by
//!    `backpressure.rs`), the limits of the producer's tenant over all its
//!    producers (`tenant_limits.rs`) and the producer's `produce_rate`
//!    (`rate.rs`) decide whether it is admitted; the decisions are pure.
//! 4. `proposer.rs`: the shard's proposer folds it with other operations
//!    into one raft entry, composed round robin over the producers with
//!    calls waiting (`lanes.rs`), so a flood of calls delays no one else's
//!    by more than an entry; the produce is answered once that entry is
//!    applied, which is once it is durable on a majority.
//! 5. [`ProducePipeline::answer`] turns what the state machine answered
//!    (sequences, a stale idempotency sequence, the producer's limits) into
//!    the client's answer or a [`RequestError`].
//!
//! IMPLEMENTATION CAVEATS
//! - A forwarded produce costs one more network round trip. Its answer
//!   names the leader (`leader_address`), so a client given that node's
//!   address sends the producer's next produces there directly.
//! - A plain `Produce` call still costs its own gRPC request and task up to
//!   the proposer; the Rust client folds concurrent calls into
//!   `ProduceMany`, other clients do not.
//! - A `ProduceMany` reaching a node that does not lead some of its
//!   produces' shards forwards each of those as its own `Produce`.

pub mod admission;
pub mod backpressure;
pub mod batch;
pub mod lanes;
pub mod proposer;
pub mod rate;
pub mod tenant_limits;

use std::sync::Arc;
use std::time::Instant;

use floret_cluster::Shards;
use floret_store::OpReply;

pub use batch::ProduceBatch;

use crate::config::Limits;
use crate::error::RequestError;
use crate::policy;
use crate::router::{Route, ShardRouter};
use crate::telemetry;
use backpressure::Backpressure;
use rate::RateLimiter;
use tenant_limits::TenantLimits;

/// What a committed produce answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceAnswer {
    /// The sequences the messages got, in order.
    pub sequences: Vec<u64>,
    /// The batch was applied before (same producer sequence): these are the original sequences.
    pub duplicate: bool,
    /// The address of the node that led the shard, to send the producer's next produces to.
    pub leader_address: String,
}

/// The produce path of one node.
pub struct ProducePipeline {
    shards: Arc<Shards>,
    router: ShardRouter,
    limits: Limits,
    rates: RateLimiter,
    backpressure: Backpressure,
    /// This node's address as clients dial it, named in the answers to the
    /// produces it commits as leader.
    leader_address: String,
    /// On a node with token keys (producer ids are `tenant/producer`), the
    /// tenants' limits over all their producers.
    tenants: Option<Arc<TenantLimits>>,
}

impl ProducePipeline {
    /// The produce path over the node's shards, with its limits and
    /// backpressure; `leader_address` is where clients dial this node, and
    /// `tenants` the tenants' limits on a node whose producer ids are
    /// `tenant/producer`.
    pub fn new(
        shards: Arc<Shards>,
        router: ShardRouter,
        limits: Limits,
        backpressure: Backpressure,
        leader_address: String,
        tenants: Option<Arc<TenantLimits>>,
    ) -> Self {
        Self {
            shards,
            router,
            limits,
            rates: RateLimiter::default(),
            backpressure,
            leader_address,
            tenants,
        }
    }

    /// Checks a produce request at `now_ms` and places it on its shard.
    pub fn parse(
        &self,
        request: floret_proto::v1::ProduceRequest,
        now_ms: i64,
    ) -> Result<ProduceBatch, RequestError> {
        let placement = self.shards.placement();
        Ok(ProduceBatch::parse(
            request,
            &self.limits,
            placement,
            now_ms,
        )?)
    }

    /// Stores `batch` through its shard's leader; `forwarded` when another
    /// node sent it here as that leader. `now_ms` stamps the messages.
    pub async fn produce(
        &self,
        batch: ProduceBatch,
        forwarded: bool,
        now_ms: i64,
    ) -> Result<ProduceAnswer, RequestError> {
        let shard = batch.shard;
        let proposer = match self.router.route(shard) {
            Ok(Route::Here(proposer)) => proposer,
            _ if forwarded => {
                return Err(RequestError::NoLeader {
                    shard,
                    leader: self.shards.leader_of(shard),
                });
            }
            Ok(Route::Leader(node)) => {
                let max_request_bytes = self.limits.max_request_bytes;
                return self
                    .router
                    .forward_produce(shard, node, batch.into_wire(), max_request_bytes)
                    .await;
            }
            Err(error) => return Err(error),
        };
        self.admit(&batch)?;
        let admitted = Instant::now();
        let count = batch.messages.len();
        let queue = batch.queue.clone();
        let producer = batch.producer.clone();
        let producer_sequence = batch.producer_sequence;
        let reply = proposer.propose(batch.into_op(now_ms)).await?;
        metrics::histogram!("floret_produce_seconds").record(admitted.elapsed().as_secs_f64());
        if matches!(reply, OpReply::OverLimit { .. }) {
            telemetry::count_for_queue("floret_produce_rejected_total", &queue, 1);
        }
        let answer = self.answer(reply, &producer, producer_sequence, count)?;
        if !answer.duplicate {
            telemetry::count_for_queue("floret_produced_messages_total", &queue, count as u64);
        }
        Ok(answer)
    }

    /// Node backpressure, the tenant's limits and the producer's rate, on
    /// the shard's leader.
    fn admit(&self, batch: &ProduceBatch) -> Result<(), RequestError> {
        let Some(group) = self.shards.group(batch.shard) else {
            return Ok(());
        };
        let (queue, producer) = (&batch.queue, &batch.producer);
        let policy = group.reader.policy(queue, producer);
        let weight = policy.weight.unwrap_or(1);
        let tenant = floret_store::producer_group(producer);
        self.backpressure.admit(
            &group.reader,
            queue,
            (producer, weight),
            self.tenants.is_some().then_some(tenant),
            &batch.messages,
        )?;
        if let Some(tenant_limits) = &self.tenants {
            let limits = group
                .reader
                .stored_policy(queue, Some(&policy::tenant_policy_key(tenant)));
            if limits.max_messages.is_some()
                || limits.max_bytes.is_some()
                || limits.produce_rate.is_some()
            {
                let incoming = (
                    batch.messages.len() as u64,
                    batch
                        .messages
                        .iter()
                        .map(admission::stored_size_estimate)
                        .sum(),
                );
                tenant_limits.admit(queue, tenant, &limits, incoming, Instant::now())?;
            }
        }
        if let Some(rate) = policy.produce_rate {
            let messages = batch.messages.len() as u64;
            let taken = self
                .rates
                .take(queue, producer, rate, messages, Instant::now());
            if let Err(wait) = taken {
                telemetry::count_for_queue("floret_produce_throttled_total", queue, 1);
                return Err(admission::over_rate(producer, rate, wait));
            }
        }
        Ok(())
    }

    /// What the state machine answered a produce of `count` messages.
    fn answer(
        &self,
        reply: OpReply,
        producer: &str,
        producer_sequence: Option<u64>,
        count: usize,
    ) -> Result<ProduceAnswer, RequestError> {
        match reply {
            OpReply::Enqueued {
                first_sequence,
                count,
                duplicate,
            } => Ok(ProduceAnswer {
                sequences: (first_sequence..first_sequence + count).collect(),
                duplicate,
                leader_address: self.leader_address.clone(),
            }),
            OpReply::StaleProducerSequence { last } => Err(RequestError::Stale(format!(
                "producer_sequence {} is older than the last one applied for this producer ({last}); its sequences are no longer known",
                producer_sequence.unwrap_or_default()
            ))),
            OpReply::OverLimit {
                messages,
                bytes,
                batch_bytes,
                policy,
            } => {
                let held = (messages, bytes);
                Err(admission::over_limit(
                    producer,
                    count,
                    batch_bytes,
                    held,
                    &policy,
                ))
            }
            OpReply::Removed { .. }
            | OpReply::PolicySet { .. }
            | OpReply::Replayed { .. }
            | OpReply::SinkSet { .. } => Err(RequestError::Internal(format!(
                "a produce was answered with {reply:?}"
            ))),
        }
    }
}
