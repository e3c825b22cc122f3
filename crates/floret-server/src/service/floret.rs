//! The `floret.v1.Floret` service: produce, consume and ack, on any node.
//! A thin adapter: a produce goes down the node's [`ProducePipeline`]
//! (checks, routing, admission, raft); a consume merges every node's
//! dispatcher ([`super::fan_in`]); acks go to their shard's leader
//! (`crate::settle::Settler`).
//!
//! A `ProduceMany` runs each of its produces down the same pipeline, all
//! driven by the one task that streams their outcomes back (no task per
//! produce), each outcome sent as soon as it is known.

use std::pin::Pin;
use std::sync::Arc;

use floret_proto::v1::{self, consume_request};
use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

use super::{convert, fan_in, now_unix_ms};
use crate::auth::{Caller, Denied, Role};
use crate::deliver::{SettleCode, SettleKind, SettledBy, StreamKey, StreamOwner};
use crate::delivery_id;
use crate::error::RequestError;
use crate::produce::{ProduceAnswer, ProducePipeline};
use crate::request::{self, InvalidRequest};

/// Most produces in one `ProduceMany`.
pub const MAX_PRODUCES_PER_CALL: usize = 10_000;

/// How long a consume stream may stay open before its subscribe arrives:
/// an open stream holds a task and buffers, so one that never subscribes
/// is closed.
pub const SUBSCRIBE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Longest a token's expiry keeps a consume stream open (about 100 years):
/// a bound that keeps the timer's deadline representable.
const MAX_STREAM_LIFETIME_MS: u64 = 100 * 365 * 86_400 * 1_000;

/// Most outcomes streamed back in one `ProduceManyReply`.
const OUTCOMES_PER_REPLY: usize = 1_024;

/// Serves the data plane of one node.
pub struct FloretService {
    produce: Arc<ProducePipeline>,
    sources: fan_in::Sources,
    /// Turns true when the node begins to stop: consume streams end then.
    stopping: watch::Receiver<bool>,
}

impl FloretService {
    /// A service over the node's produce path and consumer sources.
    pub fn new(
        produce: Arc<ProducePipeline>,
        sources: fan_in::Sources,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        Self {
            produce,
            sources,
            stopping,
        }
    }
}

/// Stream of responses on a consume call.
pub use super::fan_in::ConsumeStream;

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

pub(crate) fn produce_response(answer: ProduceAnswer) -> v1::ProduceResponse {
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
        let now_ms = now_unix_ms();
        let caller = Caller::of(&request);
        let mut produce = request.into_inner();
        admit_caller(&caller, &mut produce)
            .map_err(|refusal| refusal.into_request_error(&caller, true))?;
        let batch = self.produce.parse(produce, now_ms)?;
        let answer = self.produce.produce(batch, false, now_ms).await?;
        Ok(Response::new(produce_response(answer)))
    }

    type ProduceManyStream = ProduceManyStream;

    async fn produce_many(
        &self,
        request: Request<v1::ProduceManyRequest>,
    ) -> Result<Response<Self::ProduceManyStream>, Status> {
        let now_ms = now_unix_ms();
        let caller = Caller::of(&request);
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
        let mut audited = false;
        for (index, mut produce) in produces.into_iter().enumerate() {
            let admitted = admit_caller(&caller, &mut produce)
                .map_err(|refusal| {
                    let denied = matches!(refusal, AdmitError::Denied(_));
                    let error = refusal.into_request_error(&caller, denied && !audited);
                    audited |= denied;
                    error
                })
                .and_then(|()| self.produce.parse(produce, now_ms));
            match admitted {
                Ok(batch) => {
                    let pipeline = self.produce.clone();
                    pending.push(async move {
                        let result = pipeline.produce(batch, false, now_ms).await;
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
        let caller = Caller::of(&request);
        let mut inbound = request.into_inner();
        let (queue, credits) = read_subscribe(&mut inbound).await?;
        caller.require(Role::Consume, &queue).map_err(|denied| {
            denied.audit(&caller, "Consume");
            Status::from(denied)
        })?;
        let (outbound, responses) = fan_in::channel();
        let owner = StreamOwner {
            tenant: caller.tenant().into(),
            stream: StreamKey::random(),
        };
        fan_in::serve(
            self.sources.clone(),
            queue,
            credits,
            owner,
            inbound,
            outbound,
        )
        .await?;
        let responses = ending_when_stopping(responses, self.stopping.clone());
        match caller.expires_unix_s() {
            Some(expires_unix_s) => Ok(Response::new(ending_at_expiry(responses, expires_unix_s))),
            None => Ok(Response::new(responses)),
        }
    }

    async fn ack(
        &self,
        request: Request<v1::AckRequest>,
    ) -> Result<Response<v1::AckResponse>, Status> {
        let caller = Caller::of(&request);
        let ids = request.into_inner().delivery_ids;
        for id in &ids {
            if let Some(queue) = delivery_id::queue_of(id) {
                caller.require(Role::Consume, queue).map_err(|denied| {
                    denied.audit(&caller, "Ack");
                    Status::from(denied)
                })?;
            }
        }
        if ids.is_empty() {
            return Err(InvalidRequest::Malformed("an ack needs at least one delivery_id").into());
        }
        let total = ids.len();
        let outcomes = self
            .sources
            .settler
            .settle(
                SettleKind::Ack,
                ids,
                &SettledBy::Tenant(caller.tenant().into()),
            )
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

/// Checks that `caller` may produce into the produce's queue, and names
/// its producer in the caller's namespace (`tenant/producer`). A refusal is
/// not audited here: the call audits its first one.
fn admit_caller(caller: &Caller, produce: &mut v1::ProduceRequest) -> Result<(), AdmitError> {
    let queue = request::queue_name(&produce.queue)?;
    caller.require(Role::Produce, &queue)?;
    request::client_producer_id(&produce.producer_id)?;
    produce.producer_id = caller.producer_id(&produce.producer_id);
    Ok(())
}

/// Why a produce was not admitted for its caller.
enum AdmitError {
    /// The request is malformed.
    Invalid(InvalidRequest),
    /// The caller may not make it.
    Denied(Denied),
}

impl From<InvalidRequest> for AdmitError {
    fn from(invalid: InvalidRequest) -> Self {
        Self::Invalid(invalid)
    }
}

impl From<Denied> for AdmitError {
    fn from(denied: Denied) -> Self {
        Self::Denied(denied)
    }
}

impl AdmitError {
    /// The refusal to answer with, audited if `audit` (the call's first denial).
    fn into_request_error(self, caller: &Caller, audit: bool) -> RequestError {
        match self {
            Self::Invalid(invalid) => invalid.into(),
            Self::Denied(denied) => {
                if audit {
                    denied.audit(caller, "Produce");
                }
                RequestError::Denied(denied.message)
            }
        }
    }
}

/// `responses`, ended with UNAUTHENTICATED once the token that opened the
/// stream expires (`expires_unix_s`): a stream does not outlive its token.
/// `responses` until the node begins to stop, then UNAVAILABLE: the
/// client subscribes through another node (its unsettled deliveries come
/// back when their leases lapse).
fn ending_when_stopping(
    responses: ConsumeStream,
    mut stopping: watch::Receiver<bool>,
) -> ConsumeStream {
    let stopped_flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = {
        let stopped_flag = stopped_flag.clone();
        async move {
            let _node_gone = stopping.wait_for(|stopping| *stopping).await;
            stopped_flag.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let refusal = futures::stream::once(async move {
        stopped_flag
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| {
                Err(Status::unavailable(
                    "this node is stopping: subscribe through another node",
                ))
            })
    })
    .filter_map(std::future::ready);
    Box::pin(responses.take_until(stopped).chain(refusal))
}

fn ending_at_expiry(responses: ConsumeStream, expires_unix_s: u64) -> ConsumeStream {
    let now_ms = u64::try_from(now_unix_ms()).unwrap_or(0);
    let left_ms = expires_unix_s
        .saturating_mul(1_000)
        .saturating_sub(now_ms)
        .min(MAX_STREAM_LIFETIME_MS);
    let expired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let deadline = {
        let expired = expired.clone();
        async move {
            tokio::time::sleep(std::time::Duration::from_millis(left_ms)).await;
            expired.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let refusal = futures::stream::once(async move {
        expired.load(std::sync::atomic::Ordering::Relaxed).then(|| {
            Err(Status::unauthenticated(
                "the token this stream was opened with expired: open it again with a new token",
            ))
        })
    })
    .filter_map(std::future::ready);
    Box::pin(responses.take_until(deadline).chain(refusal))
}

/// Reads the subscribe that must open a consume stream, within
/// [`SUBSCRIBE_DEADLINE`]: its queue and credits.
pub(crate) async fn read_subscribe(
    inbound: &mut Streaming<v1::ConsumeRequest>,
) -> Result<(String, u32), Status> {
    let first = tokio::time::timeout(SUBSCRIBE_DEADLINE, inbound.message())
        .await
        .map_err(|_| {
            InvalidRequest::Malformed("no subscribe within 10 s of opening the consume stream")
        })??
        .ok_or(InvalidRequest::Malformed(
            "the consume stream ended before a subscribe",
        ))?;
    let Some(consume_request::Request::Subscribe(subscribe)) = first.request else {
        return Err(InvalidRequest::Malformed(
            "the first request on a consume stream must be a subscribe",
        )
        .into());
    };
    Ok((request::queue_name(&subscribe.queue)?, subscribe.credits))
}
