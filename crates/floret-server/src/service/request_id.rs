//! A request id for every call on both ports: the call's own
//! `floret-request-id` metadata when it carries a usable one (1 to 64
//! letters, digits, `-`, `_` or `.`), else one made up here. Every log
//! line of the call is in a `call` span carrying it and the gRPC method;
//! the answer carries it back in `floret-request-id` metadata; and a call
//! this node passes on to another (a forwarded produce, a settle sent to
//! the shard's leader) carries it along ([`current`]), so the leader's log
//! lines of a produce carry the id its client was given.
//!
//! IMPLEMENTATION CAVEATS
//! - A consume stream's deliveries are logged under the id of the call
//!   that opened the stream, not one per delivery.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tonic::codegen::http;
use tracing::Instrument;

/// The metadata key of a call's request id, both ways.
pub const REQUEST_ID: &str = "floret-request-id";

/// The longest request id taken from a caller.
const MAX_REQUEST_ID_BYTES: usize = 64;

tokio::task_local! {
    static CURRENT: Arc<str>;
}

/// The request id of the call this task serves, if it serves one.
pub fn current() -> Option<Arc<str>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// Whether `text` may serve as a request id.
fn usable(text: &str) -> bool {
    (1..=MAX_REQUEST_ID_BYTES).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Makes request ids: a random start per process, then one more per call.
#[derive(Clone)]
pub struct RequestIds {
    next: Arc<AtomicU64>,
}

impl Default for RequestIds {
    fn default() -> Self {
        let mut start = [0u8; 8];
        // Without randomness the ids start at 0: still unique within the process.
        let _no_randomness_then_from_zero =
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut start);
        Self {
            next: Arc::new(AtomicU64::new(u64::from_le_bytes(start))),
        }
    }
}

impl RequestIds {
    /// The id of a call whose metadata holds `given`.
    fn for_call(&self, given: Option<&str>) -> Arc<str> {
        match given.filter(|given| usable(given)) {
            Some(given) => Arc::from(given),
            None => Arc::from(format!(
                "{:016x}",
                self.next.fetch_add(1, Ordering::Relaxed)
            )),
        }
    }
}

impl<S> tower_layer::Layer<S> for RequestIds {
    type Service = WithRequestId<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WithRequestId {
            inner,
            ids: self.clone(),
        }
    }
}

/// A service whose every call runs with its request id.
#[derive(Clone)]
pub struct WithRequestId<S> {
    inner: S,
    ids: RequestIds,
}

impl<S, B, ResBody> tower_service::Service<http::Request<B>> for WithRequestId<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let given = request
            .headers()
            .get(REQUEST_ID)
            .and_then(|value| value.to_str().ok());
        let id = self.ids.for_call(given);
        let span = tracing::info_span!("call", method = request.uri().path(), request_id = %id);
        let answering =
            CURRENT.sync_scope(id.clone(), || span.in_scope(|| self.inner.call(request)));
        let header = http::HeaderValue::from_str(&id).ok();
        Box::pin(
            CURRENT
                .scope(id, async move {
                    let mut answer = answering.await?;
                    if let Some(header) = header {
                        answer.headers_mut().insert(REQUEST_ID, header);
                    }
                    Ok(answer)
                })
                .instrument(span),
        )
    }
}

/// `task` with the current call's span and request id, for a task the
/// call spawns (a consume stream's merge, which outlives the call's
/// handler).
pub fn within_call<F>(task: F) -> impl Future<Output = F::Output> + Send + 'static
where
    F: Future + Send + 'static,
{
    let id = current();
    let task = task.in_current_span();
    async move {
        match id {
            Some(id) => CURRENT.scope(id, task).await,
            None => task.await,
        }
    }
}

/// Adds the current call's request id to `metadata` of a call this node
/// makes on its behalf.
pub fn pass_on(metadata: &mut tonic::metadata::MetadataMap) {
    if let Some(id) = current()
        && let Ok(value) = id.parse()
    {
        metadata.insert(REQUEST_ID, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_could_put_anything_in_the_logs_as_a_request_id() {
        let ids = RequestIds::default();
        assert_eq!(&*ids.for_call(Some("checkout-42.a_b")), "checkout-42.a_b");
        for unusable in ["", "line\nbreak", "spaces here", &"x".repeat(65), "ünïcode"] {
            let made_up = ids.for_call(Some(unusable));
            assert_ne!(&*made_up, unusable);
            assert_eq!(made_up.len(), 16);
        }
    }

    #[test]
    fn two_calls_got_the_same_request_id() {
        let ids = RequestIds::default();
        assert_ne!(ids.for_call(None), ids.for_call(None));
    }

    #[tokio::test]
    async fn a_call_passed_on_to_the_leader_lost_its_request_id() {
        let passed_on = CURRENT
            .scope(Arc::from("abc"), async {
                let spawned = tokio::spawn(within_call(async {
                    let mut metadata = tonic::metadata::MetadataMap::new();
                    pass_on(&mut metadata);
                    metadata
                }));
                spawned.await.unwrap()
            })
            .await;
        assert_eq!(passed_on.get(REQUEST_ID).unwrap(), "abc");
        let mut outside_a_call = tonic::metadata::MetadataMap::new();
        pass_on(&mut outside_a_call);
        assert!(outside_a_call.is_empty());
    }
}
