//! An AMQP 0.9.1 sink (RabbitMQ): each message is published persistent,
//! with publisher confirms, and taken once the broker acknowledges it.
//!
//! One connection and channel per pump, opened when the first batch goes
//! and again after any failure; the pump's batches at the sink at once
//! share it. A batch's messages are all published, then their confirms
//! awaited: a nack, or a message returned as unroutable
//! (they are published mandatory, so a missing queue loses nothing), is
//! sent again after a back-off.
//!
//! IMPLEMENTATION CAVEATS
//! - `amqp://` only: no TLS to the broker yet.
//! - A connection that fails mid-batch fails the whole batch, and the
//!   other batches on it: the messages the broker had already confirmed are
//!   published again (duplicates).

use std::sync::Arc;
use std::time::Duration;

use floret_proto::sink::v1::SinkMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::target::{DeliverError, MessageOutcome};

/// AMQP's persistent delivery mode.
const PERSISTENT: u8 = 2;

/// A broker, an exchange and a routing key template.
#[derive(Clone)]
pub struct AmqpTarget {
    uri: String,
    exchange: String,
    routing_key: String,
    timeout: Duration,
    /// The open connection and its confirming channel, if any.
    open: Arc<Mutex<Option<(Connection, Channel)>>>,
}

impl AmqpTarget {
    /// Publishes through `exchange` with `routing_key` at the broker at
    /// `uri` (all checked by `spec.rs`), each batch bounded by `timeout`.
    pub fn new(uri: &str, exchange: &str, routing_key: &str, timeout: Duration) -> Self {
        Self {
            uri: uri.to_owned(),
            exchange: exchange.to_owned(),
            routing_key: routing_key.to_owned(),
            timeout,
            open: Arc::default(),
        }
    }

    /// Publishes `messages`; one outcome per message, in order. Batches of
    /// one pump published at once share its channel; only opening it is
    /// done one at a time.
    pub async fn deliver(
        &self,
        messages: &[SinkMessage],
    ) -> Result<Vec<MessageOutcome>, DeliverError> {
        let opened = tokio::time::timeout(self.timeout, self.channel()).await;
        let channel = match opened {
            Ok(Ok(channel)) => channel,
            Ok(Err(error)) => return Err(error),
            Err(_) => {
                return Err(DeliverError::Call(format!(
                    "no connection within {:?}",
                    self.timeout
                )));
            }
        };
        let published = tokio::time::timeout(self.timeout, publish(&channel, self, messages)).await;
        let failure = match published {
            Ok(Ok(outcomes)) => return Ok(outcomes),
            Ok(Err(error)) => error,
            Err(_) => DeliverError::Call(format!("no confirms within {:?}", self.timeout)),
        };
        let mut open = self.open.lock().await;
        let failed_one_is_open = open
            .as_ref()
            .is_some_and(|(_, open_channel)| open_channel.id() == channel.id());
        if failed_one_is_open && let Some((connection, _)) = open.take() {
            let _closing = connection
                .close(0, "floret sink: batch failed".into())
                .await;
        }
        Err(failure)
    }

    /// The open confirming channel, opened first if there is none usable.
    async fn channel(&self) -> Result<Channel, DeliverError> {
        let failed =
            |what: &str, error: lapin::Error| DeliverError::Call(format!("{what}: {error}"));
        let mut open = self.open.lock().await;
        let usable = open.as_ref().is_some_and(|(connection, channel)| {
            connection.status().connected() && channel.status().connected()
        });
        if !usable {
            let connection = Connection::connect(&self.uri, ConnectionProperties::default())
                .await
                .map_err(|e| failed("cannot connect to the broker", e))?;
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| failed("cannot open a channel", e))?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| failed("cannot enable publisher confirms", e))?;
            *open = Some((connection, channel));
        }
        Ok(open.as_ref().expect("opened above").1.clone())
    }
}

/// Publishes `messages` on `channel` through `target`'s exchange, then
/// awaits their confirms.
async fn publish(
    channel: &Channel,
    target: &AmqpTarget,
    messages: &[SinkMessage],
) -> Result<Vec<MessageOutcome>, DeliverError> {
    let failed = |what: &str, error: lapin::Error| DeliverError::Call(format!("{what}: {error}"));
    let mut confirms = Vec::with_capacity(messages.len());
    for message in messages {
        let confirm = channel
            .basic_publish(
                target.exchange.as_str().into(),
                routing_key(&target.routing_key, message).as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &message.payload,
                properties(message),
            )
            .await
            .map_err(|e| failed("publish failed", e))?;
        confirms.push(confirm);
    }
    let mut outcomes = Vec::with_capacity(confirms.len());
    for confirm in confirms {
        let confirmation = confirm.await.map_err(|e| failed("confirm failed", e))?;
        outcomes.push(match confirmation {
            Confirmation::Ack(None) | Confirmation::NotRequested => MessageOutcome::Ok,
            Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_)) => MessageOutcome::Retry(
                "returned by the broker: no queue is bound to its routing key".into(),
            ),
            Confirmation::Nack(None) => MessageOutcome::Retry("nacked by the broker".into()),
        });
    }
    Ok(outcomes)
}

/// `template` with `{producer}`, `{tenant}` and `{queue}` replaced.
fn routing_key(template: &str, message: &SinkMessage) -> String {
    if !template.contains('{') {
        return template.to_owned();
    }
    let tenant = message
        .producer_id
        .split_once('/')
        .map_or("", |(tenant, _)| tenant);
    template
        .replace("{producer}", &message.producer_id)
        .replace("{tenant}", tenant)
        .replace("{queue}", &message.queue)
}

/// A message's AMQP properties: persistent, its headers and floret's.
fn properties(message: &SinkMessage) -> BasicProperties {
    let mut headers = FieldTable::default();
    let mut put = |name: &str, value: String| {
        headers.insert(
            ShortString::from(name),
            AMQPValue::LongString(LongString::from(value)),
        );
    };
    for (name, value) in &message.headers {
        put(name, value.clone());
    }
    put("x-floret-queue", message.queue.clone());
    put("x-floret-producer", message.producer_id.clone());
    put("x-floret-sequence", message.sequence.to_string());
    put("x-floret-attempt", message.attempt.to_string());
    BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_headers(headers)
        .with_message_id(ShortString::from(format!(
            "{}/{}",
            message.producer_id, message.sequence
        )))
        .with_timestamp((message.enqueued_at_unix_ms / 1000).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_key_names_the_producer_tenant_and_queue() {
        let message = SinkMessage {
            queue: "orders".into(),
            producer_id: "acme/web-1".into(),
            ..Default::default()
        };
        assert_eq!(routing_key("shared", &message), "shared");
        assert_eq!(
            routing_key("{queue}.{tenant}.{producer}", &message),
            "orders.acme.acme/web-1"
        );
    }
}
