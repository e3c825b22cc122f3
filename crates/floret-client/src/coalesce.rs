//! Folds concurrent produce calls bound for one node into `ProduceMany`
//! requests, whatever their producers, so a thousand one-message calls in
//! flight cost the node a few requests, not a thousand.
//!
//! Each node the client talks to has a [`Coalescer`]: a task that takes the
//! calls waiting for it, up to [`ProduceCoalescing::max_produces`] or
//! [`ProduceCoalescing::max_bytes`], and sends them as one request while it
//! takes the next ones. The task lets the callers that are ready run once
//! and takes the calls that arrived meanwhile. To a node with no request of
//! this client in flight they leave at once (a lone call as a plain
//! `Produce`). To a busy node they wait up to [`ProduceCoalescing::linger`]
//! (1 ms) for more: calls that trickle in behind a request in flight then
//! cost the node one request, not one each, and an idle node's lone call
//! waits for nothing.
//! The server streams each produce's outcome back as soon as it is known,
//! so a call never waits for another call's commit, and each caller gets
//! its own answer and retries on its own (with its own idempotency
//! sequence, if it has one).
//!
//! A node that does not know `ProduceMany` (an older version, during a
//! rolling upgrade) answers the first one UNIMPLEMENTED: its calls are sent
//! again one by one, and from then on every call to that node goes alone.
//! Until a node has taken one `ProduceMany`, the calls of each request are
//! kept (cloned) for that case.
//!
//! IMPLEMENTATION CAVEATS
//! - A request that fails in transport fails every call it carried with
//!   that status; as for a plain `Produce`, only calls with an idempotency
//!   sequence retry it safely.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::Transport;
use floret_proto::v1::{self, floret_client::FloretClient, produce_outcome};
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::retry::RETRY_AFTER_MS;

/// How many concurrent produce calls go into one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProduceCoalescing {
    /// Most produce calls in one request.
    pub max_produces: usize,
    /// Bytes (encoded) after which a request is closed; one larger call still goes alone.
    pub max_bytes: usize,
    /// How long a request may wait for more calls while another request
    /// to the same node is still in flight (a node with none in flight
    /// gets its calls at once).
    pub linger: Duration,
}

impl Default for ProduceCoalescing {
    fn default() -> Self {
        Self {
            max_produces: 1_000,
            max_bytes: 4 * 1024 * 1024,
            linger: Duration::from_millis(1),
        }
    }
}

type Answer = Result<v1::ProduceResponse, Status>;

struct Call {
    request: v1::ProduceRequest,
    answer: oneshot::Sender<Answer>,
}

/// Whether a node takes `ProduceMany`: not known yet.
const MANY_UNKNOWN: u8 = 0;
/// It answered one.
const MANY_TAKEN: u8 = 1;
/// It answered UNIMPLEMENTED: every call goes alone.
const MANY_UNIMPLEMENTED: u8 = 2;

/// The node a coalescer sends to, and whether it takes `ProduceMany`.
#[derive(Clone)]
struct Target {
    node: FloretClient<Transport>,
    takes_many: Arc<AtomicU8>,
    /// Requests sent to the node and not yet answered in full.
    requests_in_flight: Arc<AtomicUsize>,
}

/// The produce calls bound for one node, and the task that sends them.
pub(crate) struct Coalescer {
    target: Target,
    limits: ProduceCoalescing,
    /// Started by the first call, inside the caller's runtime.
    calls: OnceLock<mpsc::UnboundedSender<Call>>,
}

impl Coalescer {
    /// Calls to `node`, folded under `limits`.
    pub(crate) fn new(node: FloretClient<Transport>, limits: ProduceCoalescing) -> Self {
        Self {
            target: Target {
                node,
                takes_many: Arc::new(AtomicU8::new(MANY_UNKNOWN)),
                requests_in_flight: Arc::default(),
            },
            limits,
            calls: OnceLock::new(),
        }
    }

    /// Sends `request` with whichever calls are waiting, and waits for its own outcome.
    pub(crate) async fn produce(&self, request: v1::ProduceRequest) -> Answer {
        let calls = self.calls.get_or_init(|| {
            let (calls, waiting) = mpsc::unbounded_channel();
            tokio::spawn(fold_calls(self.target.clone(), self.limits, waiting));
            calls
        });
        let (answer, answered) = oneshot::channel();
        calls
            .send(Call { request, answer })
            .map_err(|_| Status::unavailable("the client's produce task has stopped"))?;
        answered.await.map_err(|_| {
            Status::unavailable("the client's produce task stopped before the answer came")
        })?
    }
}

async fn fold_calls(
    target: Target,
    limits: ProduceCoalescing,
    mut waiting: mpsc::UnboundedReceiver<Call>,
) {
    while let Some(first) = waiting.recv().await {
        // Callers woken together (by the answers of one raft entry) send
        // their next calls together: let them queue before taking them.
        tokio::task::yield_now().await;
        let mut request = Folding::new(first, limits);
        let alone = target.takes_many.load(Ordering::Relaxed) == MANY_UNIMPLEMENTED;
        while !alone && !request.full() {
            let Ok(next) = waiting.try_recv() else {
                break;
            };
            request.add(next);
        }
        let busy = target.requests_in_flight.load(Ordering::Acquire) > 0;
        if !alone && busy && !request.full() {
            let linger = tokio::time::sleep(limits.linger);
            tokio::pin!(linger);
            while !request.full() {
                tokio::select! {
                    () = &mut linger => break,
                    next = waiting.recv() => match next {
                        Some(next) => request.add(next),
                        None => break,
                    },
                }
            }
        }
        target.requests_in_flight.fetch_add(1, Ordering::AcqRel);
        let target = target.clone();
        tokio::spawn(async move {
            let in_flight = target.requests_in_flight.clone();
            send(target, request.calls).await;
            in_flight.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// The calls gathered for one request, up to the limits.
struct Folding {
    calls: Vec<Call>,
    bytes: usize,
    limits: ProduceCoalescing,
}

impl Folding {
    fn new(first: Call, limits: ProduceCoalescing) -> Self {
        Self {
            bytes: first.request.encoded_len(),
            calls: vec![first],
            limits,
        }
    }

    fn add(&mut self, call: Call) {
        self.bytes += call.request.encoded_len();
        self.calls.push(call);
    }

    fn full(&self) -> bool {
        self.calls.len() >= self.limits.max_produces || self.bytes >= self.limits.max_bytes
    }
}

/// Sends `calls` (alone as a `Produce`, together as a `ProduceMany`) and
/// hands each its outcome.
async fn send(target: Target, mut calls: Vec<Call>) {
    if calls.len() == 1 {
        send_alone(target.node, calls.remove(0)).await;
        return;
    }
    let takes_many = target.takes_many.load(Ordering::Relaxed);
    if takes_many == MANY_UNIMPLEMENTED {
        // Learnt while these calls lingered: each goes alone.
        for call in calls {
            tokio::spawn(send_alone(target.node.clone(), call));
        }
        return;
    }
    let mut node = target.node.clone();
    let (requests, answers): (Vec<_>, Vec<_>) = calls
        .into_iter()
        .map(|call| (call.request, Some(call.answer)))
        .unzip();
    let mut answers = answers;
    let kept = (takes_many == MANY_UNKNOWN).then(|| requests.clone());
    let request = v1::ProduceManyRequest { produces: requests };
    let failure = match node.produce_many(request).await {
        Ok(response) => {
            target.takes_many.store(MANY_TAKEN, Ordering::Relaxed);
            hand_out(response.into_inner(), &mut answers).await
        }
        Err(status) if status.code() == Code::Unimplemented => match kept {
            Some(requests) => {
                tracing::info!(
                    "this node does not take ProduceMany; sending produce calls to it one by one"
                );
                target
                    .takes_many
                    .store(MANY_UNIMPLEMENTED, Ordering::Relaxed);
                for (request, answer) in requests.into_iter().zip(answers.into_iter().flatten()) {
                    let call = Call { request, answer };
                    tokio::spawn(send_alone(target.node.clone(), call));
                }
                return;
            }
            None => status,
        },
        Err(status) => status,
    };
    for answer in answers.into_iter().flatten() {
        let _caller_gone = answer.send(Err(failure.clone()));
    }
}

/// Sends one call as a plain `Produce`.
async fn send_alone(mut node: FloretClient<Transport>, Call { request, answer }: Call) {
    let result = node.produce(request).await.map(tonic::Response::into_inner);
    let _caller_gone = answer.send(result);
}

/// Hands out the outcomes streamed back; the status for the calls left
/// without one when the stream ends.
async fn hand_out(
    mut outcomes: tonic::Streaming<v1::ProduceManyReply>,
    answers: &mut [Option<oneshot::Sender<Answer>>],
) -> Status {
    loop {
        match outcomes.message().await {
            Ok(Some(reply)) => {
                for outcome in reply.outcomes {
                    let answer = answers
                        .get_mut(outcome.index as usize)
                        .and_then(Option::take);
                    if let Some(answer) = answer {
                        let _caller_gone = answer.send(result_of(outcome.result));
                    }
                }
            }
            Ok(None) => {
                return Status::unavailable(
                    "the node ended a ProduceMany answer without this produce's outcome; the outcome is unknown",
                );
            }
            Err(status) => return status,
        }
    }
}

/// A produce's outcome as the `Produce` call's result would have been.
fn result_of(result: Option<produce_outcome::Result>) -> Answer {
    match result {
        Some(produce_outcome::Result::Produced(response)) => Ok(response),
        Some(produce_outcome::Result::Refused(refusal)) => {
            let mut status = Status::new(Code::from_i32(refusal.code), refusal.message);
            if refusal.retry_after_ms > 0 {
                let millis = MetadataValue::from(refusal.retry_after_ms);
                status.metadata_mut().insert(RETRY_AFTER_MS, millis);
            }
            Err(status)
        }
        None => Err(Status::unknown(
            "the node answered a produce without an outcome",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_carries_its_code_and_retry_hint_like_a_produce_call() {
        let refused = produce_outcome::Result::Refused(v1::Refusal {
            code: Code::ResourceExhausted as i32,
            message: "over its rate".into(),
            retry_after_ms: 40,
        });
        let status = result_of(Some(refused)).expect_err("refused");
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), "over its rate");
        let hint = status.metadata().get(RETRY_AFTER_MS).expect("hint");
        assert_eq!(hint.to_str().expect("ascii"), "40");
        assert!(crate::is_throttled(&status));
    }

    #[test]
    fn an_outcome_without_a_result_is_not_taken_for_a_success() {
        assert!(result_of(None).is_err());
    }
}
