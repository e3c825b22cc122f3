//! The `floret.v1.Floret` service: produce, consume and ack, on any node.
//! A thin adapter: a produce goes down the node's [`ProducePipeline`]
//! (checks, routing, admission, raft); a consume merges every node's
//! dispatcher ([`super::fan_in`]); acks go to their shard's leader
//! ([`Settler`]).
//!
//! A `ProduceMany` runs each of its produces down the same pipeline, all
//! driven by the one task that streams their outcomes back (no task per
//! produce), each outcome sent as soon as it is known.

use std::pin::Pin;
use std::sync::Arc;

use floret_proto::v1::{self, consume_request};
use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::{convert, fan_in, now_unix_ms};
use crate::deliver::{ConsumerEvent, ConsumerId, DispatcherHandle, SettleCode, SettleKind};
use crate::error::RequestError;
use crate::produce::{ProduceAnswer, ProducePipeline};
use crate::request::{self, InvalidRequest};
use crate::router::FORWARDED_BY;
use crate::settle::Settler;

/// Most produces in one `ProduceMany`.
pub const MAX_PRODUCES_PER_CALL: usize = 10_000;

/// Most outcomes streamed back in one `ProduceManyReply`.
const OUTCOMES_PER_REPLY: usize = 1_024;

/// Serves the data plane of one node.
pub struct FloretService {
    produce: Arc<ProducePipeline>,
    sources: fan_in::Sources,
}

impl FloretService {
    /// A service over the node's produce path and consumer sources.
    pub fn new(produce: ProducePipeline, sources: fan_in::Sources) -> Self {
        Self {
            produce: Arc::new(produce),
            sources,
        }
    }
}

/// Stream of responses on a consume call.
pub type ConsumeStream = Pin<Box<dyn Stream<Item = Result<v1::ConsumeResponse, Status>> + Send>>;

/// Stream of outcomes on a `ProduceMany` call.
pub type ProduceManyStream =
    Pin<Box<dyn Stream<Item = Result<v1::ProduceManyReply, Status>> + Send>>;

/// What a produce of a `ProduceMany` came to.
fn outcome(index: usize, result: Result<ProduceAnswer, RequestError>) -> v1::ProduceOutcome {
    let result = match result {
        Ok(answer) => v1::produce_outcome::Result::Produced(produce_response(answer)),
        Err(error) => v1::produce_outcome::Result::Refused(error.into()),
    };
    v1::ProduceOutcome {
        index: index as u32,
        result: Some(result),
    }
}

fn produce_response(answer: ProduceAnswer) -> v1::ProduceResponse {
    v1::ProduceResponse {
        sequences: answer.sequences,
        duplicate: answer.duplicate,
        leader_address: answer.leader_address,
    }
}

#[tonic::async_trait]
impl v1::floret_server::Floret for FloretService {
    async fn produce(
        &self,
        request: Request<v1::ProduceRequest>,
    ) -> Result<Response<v1::ProduceResponse>, Status> {
        let forwarded = request.metadata().contains_key(FORWARDED_BY);
        let now_ms = now_unix_ms();
        let batch = self.produce.parse(request.into_inner(), now_ms)?;
        let answer = self.produce.produce(batch, forwarded, now_ms).await?;
        Ok(Response::new(produce_response(answer)))
    }

    type ProduceManyStream = ProduceManyStream;

    async fn produce_many(
        &self,
        request: Request<v1::ProduceManyRequest>,
    ) -> Result<Response<Self::ProduceManyStream>, Status> {
        let forwarded = request.metadata().contains_key(FORWARDED_BY);
        let now_ms = now_unix_ms();
        let produces = request.into_inner().produces;
        if produces.is_empty() {
            return Err(
                InvalidRequest::Malformed("a ProduceMany needs at least one produce").into(),
            );
        }
        if produces.len() > MAX_PRODUCES_PER_CALL {
            return Err(InvalidRequest::TooManyProduces {
                count: produces.len(),
                max: MAX_PRODUCES_PER_CALL,
            }
            .into());
        }
        let mut refused = Vec::new();
        let pending = FuturesUnordered::new();
        for (index, produce) in produces.into_iter().enumerate() {
            match self.produce.parse(produce, now_ms) {
                Ok(batch) => {
                    let pipeline = self.produce.clone();
                    pending.push(async move {
                        let result = pipeline.produce(batch, forwarded, now_ms).await;
                        outcome(index, result)
                    });
                }
                Err(error) => refused.push(outcome(index, Err(error))),
            }
        }
        let outcomes = futures::stream::iter(refused)
            .chain(pending)
            .ready_chunks(OUTCOMES_PER_REPLY)
            .map(|outcomes| Ok(v1::ProduceManyReply { outcomes }));
        Ok(Response::new(Box::pin(outcomes)))
    }

    type ConsumeStream = ConsumeStream;

    async fn consume(
        &self,
        request: Request<Streaming<v1::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.ok_or(InvalidRequest::Malformed(
            "the consume stream ended before a subscribe",
        ))?;
        let Some(consume_request::Request::Subscribe(subscribe)) = first.request else {
            return Err(InvalidRequest::Malformed(
                "the first request on a consume stream must be a subscribe",
            )
            .into());
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
            .map_err(Status::from)?;
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
            return Err(InvalidRequest::Malformed("an ack needs at least one delivery_id").into());
        }
        let total = ids.len();
        let outcomes = self
            .sources
            .settler
            .settle(SettleKind::Ack, ids)
            .await
            .map_err(Status::from)?;
        let failed: Vec<_> = outcomes
            .iter()
            .filter(|o| o.code != SettleCode::Ok)
            .collect();
        if let Some(first) = failed.first() {
            return Err(RequestError::NotSettled {
                code: first.code,
                message: format!(
                    "{} of {total} deliveries not acked (the others were); first: {}: {}",
                    failed.len(),
                    first.delivery_id,
                    first.message
                ),
            }
            .into());
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
                .map_err(Status::from),
            Some(consume_request::Request::Credit(credit)) => request::credits(credit.credits)
                .map_err(Status::from)
                .and_then(|credits| dispatcher.credit(consumer, credits).map_err(Status::from)),
            Some(consume_request::Request::Ack(settle)) => request::settle_kind(false, &settle)
                .map_err(Status::from)
                .and_then(|kind| settle_on_stream(&settler, kind, settle, &events)),
            Some(consume_request::Request::Nack(settle)) => request::settle_kind(true, &settle)
                .map_err(Status::from)
                .and_then(|kind| settle_on_stream(&settler, kind, settle, &events)),
            Some(consume_request::Request::Subscribe(_)) => Err(InvalidRequest::Malformed(
                "this stream is already subscribed; open another stream for another queue",
            )
            .into()),
            None => Err(InvalidRequest::Malformed("empty consume request").into()),
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
        return Err(
            InvalidRequest::Malformed("an ack or nack needs at least one delivery_id").into(),
        );
    }
    let (settler, events) = (settler.clone(), events.clone());
    tokio::spawn(async move {
        if let Ok(outcomes) = settler.settle(kind, settle.delivery_ids).await {
            let _consumer_gone = events.send(ConsumerEvent::Settled(outcomes));
        }
    });
    Ok(())
}
