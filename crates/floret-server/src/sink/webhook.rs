//! An HTTP webhook sink: each batch is POSTed as JSON, and the answer's
//! status (and, on 2xx, optionally its body) says what became of each
//! message. The JSON shapes are documented on `WebhookSink` in
//! `proto/floret/v1/floret.proto`.
//!
//! IMPLEMENTATION CAVEATS
//! - Plain `http://` only, HTTP/1.1; answers over 16 MiB are failures.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use floret_proto::sink::v1::SinkMessage;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::target::{DeliverError, MessageOutcome};

/// Largest answer body read.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// A webhook at one URL.
#[derive(Clone)]
pub struct WebhookTarget {
    client: Client<HttpConnector, Full<Bytes>>,
    url: hyper::Uri,
    timeout: Duration,
}

impl WebhookTarget {
    /// POSTs to `url` (checked by `spec.rs`), each call bounded by `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, String> {
        let url = url
            .parse()
            .map_err(|e| format!("webhook url {url:?}: {e}"))?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            client,
            url,
            timeout,
        })
    }

    /// POSTs `messages` as one batch; one outcome per message, in order.
    pub async fn deliver(
        &self,
        messages: &[SinkMessage],
    ) -> Result<Vec<MessageOutcome>, DeliverError> {
        let body = batch_json(messages).to_string();
        let request = hyper::Request::post(self.url.clone())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| DeliverError::Call(format!("cannot build the request: {e}")))?;
        let call = async {
            let answer = self
                .client
                .request(request)
                .await
                .map_err(|e| DeliverError::Call(format!("POST failed: {e}")))?;
            let status = answer.status();
            let retry_after = answer
                .headers()
                .get(hyper::header::RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| DeliverError::Call(format!("reading the answer failed: {e}")))?
                .to_bytes();
            Ok::<_, DeliverError>((status, retry_after, body))
        };
        let (status, retry_after, body) = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| DeliverError::Call(format!("no answer within {:?}", self.timeout)))??;
        outcomes(status.as_u16(), retry_after, &body, messages.len())
    }
}

/// The JSON a batch is POSTed as.
fn batch_json(messages: &[SinkMessage]) -> serde_json::Value {
    let base64 = base64::engine::general_purpose::STANDARD;
    let messages: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| {
            serde_json::json!({
                "queue": m.queue,
                "producer_id": m.producer_id,
                "sequence": m.sequence,
                "payload": base64.encode(&m.payload),
                "headers": m.headers,
                "attempt": m.attempt,
                "enqueued_at_unix_ms": m.enqueued_at_unix_ms,
            })
        })
        .collect();
    serde_json::json!({ "messages": messages })
}

/// What an answer of `status` (with `retry_after` and `body`) means for a
/// batch of `count` messages.
fn outcomes(
    status: u16,
    retry_after: Option<Duration>,
    body: &[u8],
    count: usize,
) -> Result<Vec<MessageOutcome>, DeliverError> {
    match status {
        200..=299 => per_message(body, count),
        429 | 500..=599 => Err(DeliverError::Refused {
            status,
            retry_after,
        }),
        _ => Ok(vec![
            MessageOutcome::Reject(format!("HTTP {status}"));
            count
        ]),
    }
}

/// A 2xx body: every message taken, unless it lists one result per message.
fn per_message(body: &[u8], count: usize) -> Result<Vec<MessageOutcome>, DeliverError> {
    let Ok(answer) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Ok(vec![MessageOutcome::Ok; count]);
    };
    let Some(results) = answer.get("results").and_then(|r| r.as_array()) else {
        return Ok(vec![MessageOutcome::Ok; count]);
    };
    if results.len() != count {
        return Err(DeliverError::Results {
            results: results.len(),
            messages: count,
        });
    }
    Ok(results
        .iter()
        .map(|result| {
            let reason = result
                .get("reason")
                .and_then(|r| r.as_str())
                .unwrap_or_default()
                .to_owned();
            match result.get("outcome").and_then(|o| o.as_str()) {
                Some("ok") => MessageOutcome::Ok,
                Some("reject") => MessageOutcome::Reject(reason),
                _ => MessageOutcome::Retry(reason),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_outcomes() {
        assert_eq!(
            outcomes(204, None, b"", 2).unwrap(),
            vec![MessageOutcome::Ok; 2]
        );
        let listed = br#"{"results":[{"outcome":"ok"},{"outcome":"reject","reason":"bad"},{"outcome":"retry"}]}"#;
        assert_eq!(
            outcomes(200, None, listed, 3).unwrap(),
            vec![
                MessageOutcome::Ok,
                MessageOutcome::Reject("bad".into()),
                MessageOutcome::Retry(String::new())
            ]
        );
        assert!(matches!(
            outcomes(200, None, listed, 2),
            Err(DeliverError::Results {
                results: 3,
                messages: 2
            })
        ));
        assert_eq!(
            outcomes(400, None, b"", 1).unwrap(),
            vec![MessageOutcome::Reject("HTTP 400".into())]
        );
    }

    #[test]
    fn too_many_requests_and_server_errors_are_sent_again_after_retry_after() {
        let wait = Some(Duration::from_secs(2));
        assert!(matches!(
            outcomes(429, wait, b"", 1),
            Err(DeliverError::Refused { status: 429, retry_after }) if retry_after == wait
        ));
        assert!(matches!(
            outcomes(503, None, b"", 1),
            Err(DeliverError::Refused {
                status: 503,
                retry_after: None
            })
        ));
    }
}
