//! One consumer of the workload: reads through one node, records every
//! delivery under the producer name the history uses, acks in small
//! batches, and slows to the capped rate while the faults run.

use std::collections::HashMap;
use std::time::Duration;

use floret_client::{Client, ConsumerEvent};
use tokio::sync::watch;

use super::{ACK_BATCH, ACK_IDLE, CREDITS, QUEUE, RETRY_PAUSE, WorkloadTokens, stopped_within};
use crate::history::{Event, MessageId, Payload, Recorder, decode_payload};

/// A delivered producer id as the history names producers: without the
/// `tenant/` a node with token keys stores a tenant's producers under, if
/// it is the tenant the payload's producer produced as (otherwise whole,
/// for the checker to flag).
fn history_producer_id(
    stored: String,
    payload: &Payload,
    tokens: Option<&WorkloadTokens>,
) -> String {
    let (Some(tokens), Payload::Intact(id)) = (tokens, payload) else {
        return stored;
    };
    let tenant = &tokens.of_producer(id.producer).0;
    match stored
        .strip_prefix(tenant.as_str())
        .and_then(|rest| rest.strip_prefix('/'))
    {
        Some(name) => name.to_owned(),
        None => stored,
    }
}

/// One consumer: reads through one node, records every delivery, acks in
/// batches; reopens its stream when it breaks.
pub(super) async fn consume(
    consumer: u32,
    client: Client,
    tokens: Option<WorkloadTokens>,
    capped_rate: u32,
    recorder: Recorder,
    mut stop: watch::Receiver<bool>,
    capped: watch::Receiver<bool>,
) {
    let mut session = 0;
    while !*stop.borrow() {
        session += 1;
        let Ok(mut stream) = client.consume(QUEUE, CREDITS).await else {
            if stopped_within(&mut stop, RETRY_PAUSE).await {
                return;
            }
            continue;
        };
        let mut unacked: Vec<String> = Vec::new();
        let mut delivered: HashMap<String, MessageId> = HashMap::new();
        loop {
            let event = tokio::select! {
                _ = stop.wait_for(|stop| *stop) => return,
                event = tokio::time::timeout(ACK_IDLE, stream.next()) => event,
            };
            let flush = match event {
                Err(_idle) => !unacked.is_empty(),
                Ok(Ok(Some(ConsumerEvent::Delivery(delivery)))) => {
                    let payload = decode_payload(&delivery.payload);
                    if let Payload::Intact(id) = &payload {
                        delivered.insert(delivery.delivery_id.clone(), *id);
                    }
                    let producer_id =
                        history_producer_id(delivery.producer_id, &payload, tokens.as_ref());
                    recorder.record(Event::Delivered {
                        consumer,
                        session,
                        producer_id,
                        sequence: delivery.sequence,
                        attempt: delivery.attempt,
                        payload,
                    });
                    unacked.push(delivery.delivery_id);
                    if *capped.borrow() && capped_rate > 0 {
                        tokio::time::sleep(Duration::from_secs(1) / capped_rate).await;
                    }
                    unacked.len() >= ACK_BATCH
                }
                Ok(Ok(Some(ConsumerEvent::Settled(outcomes)))) => {
                    for outcome in outcomes {
                        if let Some(id) = delivered.remove(&outcome.delivery_id)
                            && outcome.code == 0
                        {
                            recorder.record(Event::Settled { id });
                        }
                    }
                    false
                }
                Ok(Ok(None) | Err(_)) => break,
            };
            if flush {
                let count = unacked.len() as u32;
                if stream.ack(std::mem::take(&mut unacked)).await.is_err()
                    || stream.credit(count).await.is_err()
                {
                    break;
                }
            }
        }
        if stopped_within(&mut stop, RETRY_PAUSE).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_stored_under_another_tenant_keeps_its_whole_name_for_the_checker() {
        let tokens = WorkloadTokens {
            producing: vec![
                ("tenant0".into(), "t0".into()),
                ("tenant1".into(), "t1".into()),
            ],
            consuming: "sink".into(),
        };
        let of_producer_3 = Payload::Intact(MessageId {
            producer: 3,
            counter: 1,
        });
        assert_eq!(
            history_producer_id("tenant1/chaos-3".into(), &of_producer_3, Some(&tokens)),
            "chaos-3"
        );
        assert_eq!(
            history_producer_id("tenant0/chaos-3".into(), &of_producer_3, Some(&tokens)),
            "tenant0/chaos-3",
            "producer 3 produces as tenant1"
        );
        assert_eq!(
            history_producer_id("chaos-3".into(), &of_producer_3, None),
            "chaos-3"
        );
    }
}
