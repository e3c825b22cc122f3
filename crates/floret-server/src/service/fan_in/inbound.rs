//! A consumer's requests, read off its stream in order for the task that
//! serves them (the merge of a client's consume stream, or a peer's stream
//! of this node's own dispatcher, `service/own_dispatcher.rs`), with a
//! bound on what the consumer has being settled. Each ack or nack
//! takes one permit per delivery id (of [`SETTLING_PER_STREAM`]) before it
//! is passed on, and its settle holds them until the ids are answered, the
//! ids of each leader until that leader answers (`Settler::settle_holding`),
//! so acks waiting on an unreachable node hold only their own places. While the
//! bound is reached nothing more is read from the stream, the consumer's
//! credits included, so a consumer that acks faster than its acks'
//! removals commit gets no more deliveries until they catch up.
//!
//! Without the bound, a drain of 10,000,000 messages with an 8 MiB cache
//! stalled for good: removals queued on the busiest node past their commit
//! timeout, their leases lapsed, and every lapse came back as another
//! delivery, ack and removal for the same node (BENCHMARKS, "A drain that
//! stalled: acks bounded per stream").
//!
//! IMPLEMENTATION CAVEATS
//! - The bound is per stream: a consumer with several streams gets it on
//!   each.

use std::sync::Arc;

use floret_proto::v1::{self, consume_request};
use futures::{Stream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::Status;

/// Delivery ids one consumer stream may have being settled at once. 4,096
/// drained 1,000,000 messages 1.06x faster than 1,024 (which binds once a
/// removal takes 70-80 ms) and 10,000,000 at 33,658 msg/s against 28,074,
/// both without a lease expiry (BENCHMARKS, "A drain that stalled").
pub(in crate::service) const SETTLING_PER_STREAM: u32 = 4096;

/// A consumer's request as the merge gets it: an ack or nack with the
/// permits its settle holds until answered, anything else with none.
pub(in crate::service) type Admitted = (v1::ConsumeRequest, Option<OwnedSemaphorePermit>);

/// Reads the consumer's requests into `requests`, the next one only while
/// the stream's bound has room, and each ack or nack once it has room for
/// its ids; `Err(())` when the stream failed. Stops, dropping the stream,
/// as soon as nobody takes the requests any more (the task serving them
/// ended on a bad request or a failure), not at the consumer's next message.
pub(in crate::service) async fn read_requests<S>(
    inbound: S,
    requests: mpsc::UnboundedSender<Result<Admitted, ()>>,
) where
    S: Stream<Item = Result<v1::ConsumeRequest, Status>> + Unpin,
{
    tokio::select! {
        () = requests.closed() => {}
        () = admit_requests(inbound, &requests) => {}
    }
}

async fn admit_requests<S>(mut inbound: S, requests: &mpsc::UnboundedSender<Result<Admitted, ()>>)
where
    S: Stream<Item = Result<v1::ConsumeRequest, Status>> + Unpin,
{
    let settling = Arc::new(Semaphore::new(SETTLING_PER_STREAM as usize));
    loop {
        match settling.acquire().await {
            Ok(room) => drop(room),
            Err(_closed) => return,
        }
        let Some(next) = inbound.next().await else {
            return;
        };
        let request = match next {
            Ok(request) => request,
            Err(status) => {
                tracing::debug!(%status, "consume stream failed");
                let _merge_gone = requests.send(Err(()));
                return;
            }
        };
        let permits = match &request.request {
            Some(
                consume_request::Request::Ack(settle) | consume_request::Request::Nack(settle),
            ) => {
                let ids = u32::try_from(settle.delivery_ids.len())
                    .unwrap_or(u32::MAX)
                    .clamp(1, SETTLING_PER_STREAM);
                match settling.clone().acquire_many_owned(ids).await {
                    Ok(permits) => Some(permits),
                    Err(_closed) => return,
                }
            }
            _ => None,
        };
        if requests.send(Ok((request, permits))).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ack(ids: u32) -> v1::ConsumeRequest {
        v1::ConsumeRequest {
            request: Some(consume_request::Request::Ack(v1::Settle {
                delivery_ids: (0..ids).map(|id| format!("delivery-{id}")).collect(),
                dead_letter: false,
            })),
        }
    }

    fn credit(credits: u32) -> v1::ConsumeRequest {
        v1::ConsumeRequest {
            request: Some(consume_request::Request::Credit(v1::Credit {
                credits,
                set: false,
            })),
        }
    }

    #[tokio::test]
    async fn consumer_acking_faster_than_removals_commit_kept_getting_its_credits_read() {
        let inbound = futures::stream::iter([Ok(ack(SETTLING_PER_STREAM)), Ok(credit(5))]);
        let (sender, mut requests) = mpsc::unbounded_channel();
        tokio::spawn(read_requests(inbound, sender));
        let (first, settling) = requests.recv().await.unwrap().unwrap();
        assert_eq!(first, ack(SETTLING_PER_STREAM));
        assert!(
            tokio::time::timeout(Duration::from_millis(200), requests.recv())
                .await
                .is_err(),
            "the credit behind a full bound of settles was read"
        );
        drop(settling);
        let (next, permits) = requests.recv().await.unwrap().unwrap();
        assert_eq!(next, credit(5));
        assert!(permits.is_none());
    }

    #[tokio::test]
    async fn stream_whose_server_gave_up_stayed_open_until_the_consumer_sent_again() {
        let (sender, requests) = mpsc::unbounded_channel();
        let reading = tokio::spawn(read_requests(futures::stream::pending(), sender));
        drop(requests);
        tokio::time::timeout(Duration::from_secs(5), reading)
            .await
            .expect("the reader kept waiting on a stream nobody serves")
            .unwrap();
    }

    #[tokio::test]
    async fn ack_of_more_ids_than_the_bound_waited_for_good() {
        let inbound = futures::stream::iter([Ok(ack(SETTLING_PER_STREAM * 3)), Ok(ack(2))]);
        let (sender, mut requests) = mpsc::unbounded_channel();
        tokio::spawn(read_requests(inbound, sender));
        let (first, settling) = requests.recv().await.unwrap().unwrap();
        assert_eq!(first, ack(SETTLING_PER_STREAM * 3));
        drop(settling);
        let (second, settling) = requests.recv().await.unwrap().unwrap();
        assert_eq!(second, ack(2));
        assert_eq!(settling.map(|permits| permits.num_permits()), Some(2));
    }
}
