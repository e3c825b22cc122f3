//! A consumer's stream as the merge fills it, and what the client has not
//! taken from it yet.
//!
//! gRPC stops taking responses from the stream when the client stops
//! reading (HTTP/2 flow control), so everything sent after that waits in
//! memory. Credits alone do not bound it: a consumer may hold 100,000
//! credits of messages up to 1 MiB each. The stream therefore counts the
//! bytes of deliveries sent and not yet taken, and the merge treats a
//! consumer whose unread deliveries fill [`UNREAD_BYTES`] as one without
//! credit ([`credit_room`]): its other credits wait, and the sources are
//! promised nothing more for it, until the client reads again.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use floret_proto::v1::{self, consume_response};
use futures::{Stream, StreamExt};
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Status;

/// Bytes of unread deliveries a consumer's stream may hold.
pub const UNREAD_BYTES: u64 = 16 * 1024 * 1024;

/// The merge's end of a consumer's stream.
#[derive(Clone)]
pub struct Outbound {
    /// Each response with its bytes counted as unread (0 but for deliveries).
    responses: mpsc::UnboundedSender<(u64, Result<v1::ConsumeResponse, Status>)>,
    unread: Arc<Unread>,
}

/// Deliveries sent and not yet taken by the client's stream.
#[derive(Default)]
struct Unread {
    bytes: AtomicU64,
    /// Set while the merge holds deliveries back for room: the next
    /// delivery the client takes wakes it (and only then, so a consumer
    /// that keeps up costs no wake-ups).
    merge_waits: AtomicBool,
    taken: Notify,
}

/// The stream gRPC sends to the client.
pub type ConsumeStream = Pin<Box<dyn Stream<Item = Result<v1::ConsumeResponse, Status>> + Send>>;

/// A consumer's stream: the merge's end and gRPC's end.
pub fn channel() -> (Outbound, ConsumeStream) {
    let (responses, receiver) = mpsc::unbounded_channel();
    let unread = Arc::new(Unread::default());
    let taking = unread.clone();
    let stream = UnboundedReceiverStream::new(receiver).map(move |(bytes, response)| {
        if bytes > 0 {
            taking.bytes.fetch_sub(bytes, Ordering::SeqCst);
            if taking.merge_waits.load(Ordering::SeqCst)
                && taking.merge_waits.swap(false, Ordering::SeqCst)
            {
                taking.taken.notify_one();
            }
        }
        response
    });
    (Outbound { responses, unread }, Box::pin(stream))
}

impl Outbound {
    /// Sends `response` (not a delivery: it counts nothing as unread); Err
    /// once the client's stream is gone.
    pub fn send(&self, response: Result<v1::ConsumeResponse, Status>) -> Result<(), ()> {
        self.responses.send((0, response)).map_err(|_| ())
    }

    /// Sends `delivery`, whose encoded size is `bytes`, counting it unread
    /// until gRPC takes it.
    pub fn send_delivery(&self, delivery: v1::Delivery, bytes: u64) -> Result<(), ()> {
        self.unread.bytes.fetch_add(bytes, Ordering::Relaxed);
        let response = v1::ConsumeResponse {
            response: Some(consume_response::Response::Delivery(delivery)),
        };
        self.responses.send((bytes, Ok(response))).map_err(|_| ())
    }

    /// Whether the client's stream is gone.
    pub fn is_closed(&self) -> bool {
        self.responses.is_closed()
    }

    /// Bytes of deliveries the client has not taken yet.
    pub fn unread_bytes(&self) -> u64 {
        self.unread.bytes.load(Ordering::SeqCst)
    }

    /// Asks to be woken ([`Self::taken`]) when the client next takes a delivery.
    pub fn wait_for_room(&self) {
        self.unread.merge_waits.store(true, Ordering::SeqCst);
    }

    /// Resolves once the client took a delivery after [`Self::wait_for_room`].
    pub async fn taken(&self) {
        self.unread.taken.notified().await;
    }
}

/// How many of a consumer's `credits` may be used now, when its stream
/// holds `unread` bytes and deliveries average `average_bytes`: all of
/// them while they fit in [`UNREAD_BYTES`] at that size, fewer as the
/// stream fills, none once it is full; always one while nothing is unread,
/// so deliveries larger than the bound still go out, one at a time.
pub fn credit_room(credits: u64, unread: u64, average_bytes: u64) -> u64 {
    let room = UNREAD_BYTES.saturating_sub(unread) / average_bytes.max(1);
    let room = if unread == 0 { room.max(1) } else { room };
    credits.min(room)
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn consumer_that_stops_reading_holds_at_most_the_unread_bound() {
        assert_eq!(credit_room(100_000, 0, 1024), 16_384);
        assert_eq!(credit_room(100, 0, 1024), 100);
        assert_eq!(credit_room(100_000, UNREAD_BYTES - 4096, 1024), 4);
        assert_eq!(credit_room(100_000, UNREAD_BYTES, 1024), 0);
        assert_eq!(credit_room(100_000, UNREAD_BYTES + 1, 1024), 0);
        assert_eq!(credit_room(5, 0, 0), 5, "no delivery measured yet");
        assert_eq!(
            credit_room(5, 0, 2 * UNREAD_BYTES),
            1,
            "deliveries larger than the bound stalled the consumer for good"
        );
    }

    #[tokio::test]
    async fn unread_bytes_fall_as_the_client_takes_deliveries() {
        let (outbound, mut stream) = channel();
        let delivery = v1::Delivery {
            payload: vec![0; 1000],
            ..v1::Delivery::default()
        };
        let size = delivery.encoded_len() as u64;
        outbound.send_delivery(delivery.clone(), size).unwrap();
        outbound.send_delivery(delivery, size).unwrap();
        outbound.send(Ok(v1::ConsumeResponse::default())).unwrap();
        assert_eq!(outbound.unread_bytes(), 2 * size);
        let _first = stream.next().await;
        assert_eq!(outbound.unread_bytes(), size);
        let _second = stream.next().await;
        let _other = stream.next().await;
        assert_eq!(outbound.unread_bytes(), 0);
    }
}
