//! The services a pump pushes batches to: a `floret.sink.v1.Sink` gRPC
//! service, an HTTP webhook (`webhook.rs`) or an AMQP broker (`amqp.rs`).
//!
//! IMPLEMENTATION CAVEATS
//! - Plain `http://` only: no TLS to the sink yet.
//! - A gRPC batch is copied for each call, so that a failed call can be
//!   sent again.

use std::time::Duration;

use floret_proto::sink::v1::{self as wire, sink_client::SinkClient};
use floret_store::SinkTarget;
use tonic::transport::{Channel, Endpoint};

use super::amqp::AmqpTarget;
use super::webhook::WebhookTarget;

/// What the sink said about one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageOutcome {
    /// Taken: remove it.
    Ok,
    /// Not taken this time: deliver it again after a back-off.
    Retry(String),
    /// Never to be taken: dead-letter it.
    Reject(String),
}

/// A batch the sink did not answer message by message.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DeliverError {
    /// The call failed or timed out.
    #[error("the sink failed the call: {0}")]
    Call(String),
    /// It answered another number of results than messages.
    #[error("the sink answered {results} results for {messages} messages")]
    Results {
        /// Results answered.
        results: usize,
        /// Messages sent.
        messages: usize,
    },
    /// A webhook answered 429 or 5xx.
    #[error("the webhook answered HTTP {status}")]
    Refused {
        /// The status.
        status: u16,
        /// How long it asked to wait (`Retry-After`, in seconds).
        retry_after: Option<Duration>,
    },
}

impl DeliverError {
    /// How long the sink asked to wait before the batch is sent again.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Refused { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// Where a pump's batches go.
#[derive(Clone)]
pub enum Target {
    /// A gRPC `Sink` service.
    Grpc(GrpcTarget),
    /// An HTTP webhook.
    Webhook(Box<WebhookTarget>),
    /// An AMQP 0.9.1 broker.
    Amqp(AmqpTarget),
}

impl Target {
    /// The target `sink` names, each call bounded by `timeout`.
    pub fn new(sink: &SinkTarget, timeout: Duration) -> Result<Self, String> {
        match sink {
            SinkTarget::Grpc { address } => GrpcTarget::new(address, timeout).map(Self::Grpc),
            SinkTarget::Webhook { url } => {
                WebhookTarget::new(url, timeout).map(|webhook| Self::Webhook(Box::new(webhook)))
            }
            SinkTarget::Amqp {
                uri,
                exchange,
                routing_key,
            } => Ok(Self::Amqp(AmqpTarget::new(
                uri,
                exchange,
                routing_key,
                timeout,
            ))),
        }
    }

    /// Sends `messages` as one batch; one outcome per message, in order.
    pub async fn deliver(
        &self,
        messages: &[wire::SinkMessage],
    ) -> Result<Vec<MessageOutcome>, DeliverError> {
        match self {
            Self::Grpc(grpc) => grpc.deliver(messages.to_vec()).await,
            Self::Webhook(webhook) => webhook.deliver(messages).await,
            Self::Amqp(amqp) => amqp.deliver(messages).await,
        }
    }
}

/// A gRPC sink, dialled lazily (and again after a failure) by tonic.
#[derive(Clone)]
pub struct GrpcTarget {
    client: SinkClient<Channel>,
    timeout: Duration,
}

impl GrpcTarget {
    /// A sink at `address` (checked by `spec.rs`), each call bounded by `timeout`.
    pub fn new(address: &str, timeout: Duration) -> Result<Self, String> {
        let endpoint = Endpoint::from_shared(address.to_owned())
            .map_err(|e| format!("sink address {address:?}: {e}"))?
            .connect_timeout(timeout)
            .timeout(timeout);
        let client = SinkClient::new(endpoint.connect_lazy())
            .max_encoding_message_size(usize::MAX)
            .max_decoding_message_size(64 << 20);
        Ok(Self { client, timeout })
    }

    /// Sends `messages` as one batch; one outcome per message, in order.
    pub async fn deliver(
        &self,
        messages: Vec<wire::SinkMessage>,
    ) -> Result<Vec<MessageOutcome>, DeliverError> {
        let sent = messages.len();
        let mut client = self.client.clone();
        let call = client.deliver(wire::DeliverRequest { messages });
        let answer = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(answer)) => answer.into_inner(),
            Ok(Err(status)) => {
                return Err(DeliverError::Call(format!(
                    "{:?}: {}",
                    status.code(),
                    status.message()
                )));
            }
            Err(_) => {
                return Err(DeliverError::Call(format!(
                    "no answer within {:?}",
                    self.timeout
                )));
            }
        };
        if answer.results.len() != sent {
            return Err(DeliverError::Results {
                results: answer.results.len(),
                messages: sent,
            });
        }
        Ok(answer
            .results
            .into_iter()
            .map(|result| match wire::Outcome::try_from(result.outcome) {
                Ok(wire::Outcome::Ok) => MessageOutcome::Ok,
                Ok(wire::Outcome::Reject) => MessageOutcome::Reject(result.reason),
                Ok(wire::Outcome::Retry | wire::Outcome::Unspecified) | Err(_) => {
                    MessageOutcome::Retry(result.reason)
                }
            })
            .collect())
    }
}
