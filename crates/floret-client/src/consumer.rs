//! A consume stream: subscribe once, then receive deliveries and settle
//! results, grant credits, ack and nack, all on one bidirectional stream.

use floret_proto::v1::{self, consume_request, consume_response};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::ClientError;

/// Requests queued towards the server before the client waits.
const OUTBOUND_BUFFER: usize = 1_024;

/// What the server sends on a consume stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ConsumerEvent {
    /// A message (it used one credit).
    Delivery(v1::Delivery),
    /// Outcomes of acks or nacks sent earlier.
    Settled(Vec<v1::SettleOutcome>),
}

/// An open consume stream on one queue.
pub struct Consumer {
    requests: mpsc::Sender<v1::ConsumeRequest>,
    responses: Streaming<v1::ConsumeResponse>,
}

impl Consumer {
    pub(crate) async fn open(
        client: &mut v1::floret_client::FloretClient<tonic::transport::Channel>,
        queue: &str,
        credits: u32,
    ) -> Result<Self, ClientError> {
        let (requests, outbound) = mpsc::channel(OUTBOUND_BUFFER);
        let subscribe = v1::ConsumeRequest {
            request: Some(consume_request::Request::Subscribe(v1::Subscribe {
                queue: queue.to_owned(),
                credits,
            })),
        };
        requests
            .send(subscribe)
            .await
            .map_err(|_| ClientError::StreamClosed)?;
        let responses = client
            .consume(ReceiverStream::new(outbound))
            .await?
            .into_inner();
        Ok(Self {
            requests,
            responses,
        })
    }

    /// The next event; None when the server ended the stream.
    pub async fn next(&mut self) -> Result<Option<ConsumerEvent>, ClientError> {
        loop {
            let Some(response) = self.responses.message().await? else {
                return Ok(None);
            };
            match response.response {
                Some(consume_response::Response::Delivery(delivery)) => {
                    return Ok(Some(ConsumerEvent::Delivery(delivery)));
                }
                Some(consume_response::Response::Settled(result)) => {
                    return Ok(Some(ConsumerEvent::Settled(result.outcomes)));
                }
                None => continue,
            }
        }
    }

    async fn send(&self, request: consume_request::Request) -> Result<(), ClientError> {
        self.requests
            .send(v1::ConsumeRequest {
                request: Some(request),
            })
            .await
            .map_err(|_| ClientError::StreamClosed)
    }

    /// Lets the server send `credits` more deliveries.
    pub async fn credit(&self, credits: u32) -> Result<(), ClientError> {
        self.send(consume_request::Request::Credit(v1::Credit {
            credits,
            set: false,
        }))
        .await
    }

    /// Acks deliveries; their outcomes arrive later as [`ConsumerEvent::Settled`].
    pub async fn ack(&self, delivery_ids: Vec<String>) -> Result<(), ClientError> {
        self.send(consume_request::Request::Ack(v1::Settle {
            delivery_ids,
            dead_letter: false,
        }))
        .await
    }

    /// Hands deliveries back for redelivery.
    pub async fn nack(&self, delivery_ids: Vec<String>) -> Result<(), ClientError> {
        self.send(consume_request::Request::Nack(v1::Settle {
            delivery_ids,
            dead_letter: false,
        }))
        .await
    }

    /// Refuses deliveries for good: they move to the queue's dead letters
    /// instead of being delivered again.
    pub async fn dead_letter(&self, delivery_ids: Vec<String>) -> Result<(), ClientError> {
        self.send(consume_request::Request::Nack(v1::Settle {
            delivery_ids,
            dead_letter: true,
        }))
        .await
    }
}
