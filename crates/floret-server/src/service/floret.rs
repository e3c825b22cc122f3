//! The `floret.v1.Floret` service: produce, consume and ack, on any node.
//!
//! A produce for a shard this node leads is proposed here; any other is
//! forwarded once to the shard's leader (as this node knows it), marked so
//! that the receiver does not forward it again: a node that turns out not
//! to lead the shard answers UNAVAILABLE with a retry hint, and so does this
//! node when the leader cannot be reached. A consume merges every node's
//! dispatcher ([`super::fan_in`]); acks go to their shard's leader
//! ([`Settler`]).
//!
//! A produce is checked on the leader against node backpressure
//! ([`crate::backpressure`]) and the producer's `produce_rate` (token buckets
//! in memory), and at apply against its `max_messages` / `max_bytes`; over
//! any of them it fails RESOURCE_EXHAUSTED with a retry-after hint.
//!
//! IMPLEMENTATION CAVEATS
//! - A forwarded produce costs one more network round trip. Its answer
//!   names the leader (`leader_address`), so a client given that node's
//!   address sends the producer's next produces there directly.

use std::pin::Pin;
use std::sync::Arc;

use floret_cluster::Shards;
use floret_proto::v1::{self, consume_request};
use floret_store::ShardId;
use floret_store::{DelayedEnqueue, Enqueue, Op, OpReply};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::{convert, fan_in, now_unix_ms, status};
use crate::backpressure::Backpressure;
use crate::config::Limits;
use crate::deliver::{ConsumerEvent, ConsumerId, DispatcherHandle, SettleCode, SettleKind};
use crate::policy::{self, RateLimiter};
use crate::proposer::Proposers;
use crate::request;
use crate::settle::Settler;

/// Serves the data plane of one node.
pub struct FloretService {
    shards: Arc<Shards>,
    proposers: Proposers,
    limits: Limits,
    sources: fan_in::Sources,
    rates: RateLimiter,
    backpressure: Backpressure,
    /// This node's address as its peers dial it, named in the answers to
    /// the produces it commits as leader.
    leader_address: String,
}

impl FloretService {
    /// A service over the node's shards, proposers and dispatcher.
    pub fn new(
        shards: Arc<Shards>,
        proposers: Proposers,
        limits: Limits,
        sources: fan_in::Sources,
        backpressure: Backpressure,
    ) -> Self {
        let leader_address = shards
            .peers()
            .address(shards.node_id())
            .unwrap_or_default()
            .to_owned();
        Self {
            leader_address,
            shards,
            proposers,
            limits,
            sources,
            rates: RateLimiter::default(),
            backpressure,
        }
    }
}

/// Wait suggested to a producer refused for being at its limits: about the
/// time consumers take to make room.
const OVER_LIMIT_RETRY_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

/// "max_messages 10, max_bytes 4096" for the limits a policy sets.
fn describe_limits(policy: &floret_store::policy::Policy) -> String {
    let mut limits = Vec::new();
    if let Some(max) = policy.max_messages {
        limits.push(format!("max_messages {max}"));
    }
    if let Some(max) = policy.max_bytes {
        limits.push(format!("max_bytes {max}"));
    }
    limits.join(", ")
}

/// How long a forwarded produce may take (the leader's own commit timeout is shorter).
const FORWARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Metadata key marking a produce one node forwarded to another.
const FORWARDED: &str = "floret-forwarded-by";

impl FloretService {
    /// Sends a produce to `node`, which this node believes leads `shard`.
    async fn forward_produce(
        &self,
        node: u64,
        shard: ShardId,
        request: v1::ProduceRequest,
    ) -> Result<Response<v1::ProduceResponse>, Status> {
        let Some(channel) = self.shards.peers().channel(node) else {
            return Err(status::no_leader(shard, None));
        };
        let mut forwarded = Request::new(request);
        forwarded
            .metadata_mut()
            .insert(FORWARDED, self.shards.node_id().into());
        let mut client = v1::floret_client::FloretClient::new(channel)
            .max_encoding_message_size(self.limits.max_request_bytes);
        match tokio::time::timeout(FORWARD_TIMEOUT, client.produce(forwarded)).await {
            Ok(Ok(response)) => Ok(Response::new(response.into_inner())),
            Ok(Err(remote)) => Err(status::relayed(remote, shard, node)),
            Err(_) => Err(status::leader_unreachable(
                shard,
                node,
                &Status::deadline_exceeded(format!("no answer within {FORWARD_TIMEOUT:?}")),
            )),
        }
    }
}

/// Stream of responses on a consume call.
pub type ConsumeStream = Pin<Box<dyn Stream<Item = Result<v1::ConsumeResponse, Status>> + Send>>;

#[tonic::async_trait]
impl v1::floret_server::Floret for FloretService {
    async fn produce(
        &self,
        request: Request<v1::ProduceRequest>,
    ) -> Result<Response<v1::ProduceResponse>, Status> {
        let forwarded = request.metadata().contains_key(FORWARDED);
        let request = request.into_inner();
        let queue = request::queue_name(&request.queue)?;
        let producer = request::producer_id(&request.producer_id)?;
        request::check_messages(&request.messages, &self.limits)?;
        let deliver_at_ms = request::deliver_at(request.deliver_at_unix_ms, now_unix_ms())?;
        let shard = self.shards.placement().shard_of(&queue, &producer);
        let proposer = match self.proposers.get(shard) {
            Some(proposer) if self.shards.leads(shard) => proposer,
            _ if forwarded => return Err(status::no_leader(shard, self.shards.leader_of(shard))),
            _ => {
                let node = self.shards.route(shard);
                if node == self.shards.node_id() {
                    return Err(status::no_leader(shard, None));
                }
                return self.forward_produce(node, shard, request).await;
            }
        };
        if let Some(group) = self.shards.group(shard) {
            let policy = group.reader.policy(&queue, &producer);
            self.backpressure.admit(
                &group.reader,
                &queue,
                &producer,
                policy.weight.unwrap_or(1),
                &request.messages,
            )?;
            if let Some(rate) = policy.produce_rate
                && let Err(wait) = self.rates.take(
                    &queue,
                    &producer,
                    rate,
                    request.messages.len() as u64,
                    std::time::Instant::now(),
                )
            {
                metrics::counter!("floret_produce_throttled_total").increment(1);
                return Err(policy::exhausted(
                    format!(
                        "producer {producer:?} is over its produce_rate of {rate} messages/s; nothing was stored, retry later"
                    ),
                    wait,
                ));
            }
        }
        let messages = request::new_messages(request.messages);
        let count = messages.len();
        let now_ms = now_unix_ms();
        let enqueue = Enqueue {
            queue,
            producer,
            producer_sequence: request.producer_sequence,
            enqueued_at_ms: now_ms,
            messages,
        };
        let op = if deliver_at_ms > now_ms {
            Op::EnqueueDelayed(DelayedEnqueue {
                enqueue,
                deliver_at_ms,
            })
        } else {
            Op::Enqueue(enqueue)
        };
        let reply = proposer.propose(op).await.map_err(status::from_propose)?;
        metrics::counter!("floret_produced_messages_total").increment(count as u64);
        match reply {
            OpReply::Enqueued {
                first_sequence,
                count,
                duplicate,
            } => Ok(Response::new(v1::ProduceResponse {
                sequences: (first_sequence..first_sequence + count).collect(),
                duplicate,
                leader_address: self.leader_address.clone(),
            })),
            OpReply::StaleProducerSequence { last } => Err(Status::failed_precondition(format!(
                "producer_sequence {} is older than the last one applied for this producer ({last}); its sequences are no longer known",
                request.producer_sequence.unwrap_or_default()
            ))),
            OpReply::OverLimit {
                messages,
                bytes,
                batch_bytes,
                policy: limits,
            } => {
                metrics::counter!("floret_produce_rejected_total").increment(1);
                if limits.exceeded_by(count as u64, batch_bytes) {
                    return Err(Status::invalid_argument(format!(
                        "a produce of {count} messages is larger than producer {:?}'s limit ({}) by itself and can never be stored; send smaller batches",
                        request.producer_id,
                        describe_limits(&limits)
                    )));
                }
                Err(policy::exhausted(
                    format!(
                        "producer {:?} holds {messages} messages ({bytes} bytes) and this produce of {count} would pass its limit ({}); nothing was stored, retry once consumers have drained it",
                        request.producer_id,
                        describe_limits(&limits)
                    ),
                    OVER_LIMIT_RETRY_AFTER,
                ))
            }
            OpReply::Removed { .. } | OpReply::PolicySet { .. } | OpReply::Replayed { .. } => Err(
                Status::internal(format!("a produce was answered with {reply:?}")),
            ),
        }
    }

    type ConsumeStream = ConsumeStream;

    async fn consume(
        &self,
        request: Request<Streaming<v1::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.ok_or_else(|| {
            Status::invalid_argument("the consume stream ended before a subscribe")
        })?;
        let Some(consume_request::Request::Subscribe(subscribe)) = first.request else {
            return Err(Status::invalid_argument(
                "the first request on a consume stream must be a subscribe",
            ));
        };
        let queue = request::queue_name(&subscribe.queue)?;
        let credits = request::credits(subscribe.credits)?;
        if !subscribe.local_only {
            let (outbound, responses) = mpsc::unbounded_channel();
            fan_in::serve(self.sources.clone(), queue, credits, inbound, outbound).await?;
            return Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
                responses,
            ))));
        }
        let (events, deliveries) = mpsc::unbounded_channel();
        let (failures, failed) = mpsc::unbounded_channel::<Status>();
        let consumer = self
            .sources
            .dispatcher
            .subscribe(queue, credits, events.clone(), true)
            .await
            .map_err(status::from_stopped)?;
        tokio::spawn(read_consumer_requests(
            inbound,
            consumer,
            self.sources.dispatcher.clone(),
            self.sources.settler.clone(),
            events,
            failures,
        ));
        let deliveries = UnboundedReceiverStream::new(deliveries)
            .map(|event| Ok(convert::consume_response(event)));
        let failed = UnboundedReceiverStream::new(failed).map(Err);
        Ok(Response::new(Box::pin(futures::stream::select(
            deliveries, failed,
        ))))
    }

    async fn ack(
        &self,
        request: Request<v1::AckRequest>,
    ) -> Result<Response<v1::AckResponse>, Status> {
        let ids = request.into_inner().delivery_ids;
        if ids.is_empty() {
            return Err(Status::invalid_argument(
                "an ack needs at least one delivery_id",
            ));
        }
        let total = ids.len();
        let outcomes = self
            .sources
            .settler
            .settle(SettleKind::Ack, ids)
            .await
            .map_err(status::from_stopped)?;
        let failed: Vec<_> = outcomes
            .iter()
            .filter(|o| o.code != SettleCode::Ok)
            .collect();
        if let Some(first) = failed.first() {
            return Err(Status::new(
                convert::settle_code(first.code),
                format!(
                    "{} of {total} deliveries not acked (the others were); first: {}: {}",
                    failed.len(),
                    first.delivery_id,
                    first.message
                ),
            ));
        }
        Ok(Response::new(v1::AckResponse {
            outcomes: outcomes.into_iter().map(convert::settle_outcome).collect(),
        }))
    }
}

/// Reads credits, acks and nacks from a consumer until its stream ends or
/// misbehaves; then the dispatcher takes back what the consumer held.
async fn read_consumer_requests(
    mut inbound: Streaming<v1::ConsumeRequest>,
    consumer: ConsumerId,
    dispatcher: DispatcherHandle,
    settler: Settler,
    events: mpsc::UnboundedSender<ConsumerEvent>,
    failures: mpsc::UnboundedSender<Status>,
) {
    loop {
        let request = match inbound.message().await {
            Ok(Some(request)) => request,
            Ok(None) => break,
            Err(status) => {
                tracing::debug!(consumer, %status, "consume stream failed");
                break;
            }
        };
        let result = match request.request {
            Some(consume_request::Request::Credit(credit)) if credit.set => dispatcher
                .set_credits(consumer, credit.credits)
                .map_err(status::from_stopped),
            Some(consume_request::Request::Credit(credit)) => request::credits(credit.credits)
                .and_then(|credits| {
                    dispatcher
                        .credit(consumer, credits)
                        .map_err(status::from_stopped)
                }),
            Some(consume_request::Request::Ack(settle)) => request::settle_kind(false, &settle)
                .and_then(|kind| settle_on_stream(&settler, kind, settle, &events)),
            Some(consume_request::Request::Nack(settle)) => request::settle_kind(true, &settle)
                .and_then(|kind| settle_on_stream(&settler, kind, settle, &events)),
            Some(consume_request::Request::Subscribe(_)) => Err(Status::invalid_argument(
                "this stream is already subscribed; open another stream for another queue",
            )),
            None => Err(Status::invalid_argument("empty consume request")),
        };
        if let Err(status) = result {
            let _consumer_gone = failures.send(status);
            break;
        }
    }
    dispatcher.consumer_gone(consumer);
}

/// Settles in its own task, so a consumer's next requests are read while
/// its acks commit; the outcomes come back on the stream.
fn settle_on_stream(
    settler: &Settler,
    kind: SettleKind,
    settle: v1::Settle,
    events: &mpsc::UnboundedSender<ConsumerEvent>,
) -> Result<(), Status> {
    if settle.delivery_ids.is_empty() {
        return Err(Status::invalid_argument(
            "an ack or nack needs at least one delivery_id",
        ));
    }
    let (settler, events) = (settler.clone(), events.clone());
    tokio::spawn(async move {
        if let Ok(outcomes) = settler.settle(kind, settle.delivery_ids).await {
            let _consumer_gone = events.send(ConsumerEvent::Settled(outcomes));
        }
    });
    Ok(())
}
