//! A consume stream of this node's own dispatcher (the shards it leads),
//! served on the peer port to a node that merges every node's dispatcher
//! for one of its consumers (`fan_in/peer_source.rs` is the other end).
//! Credits, acks and nacks arrive on the stream; `Credit.set` lets the
//! merging node move the consumer's credits to where the backlog is, and
//! `TenantShares` tells this node each tenant's share of its weight here.
//! Going out: deliveries, settle outcomes, and this node's backlogged
//! weight for the queue when it changes and again every
//! [`BACKLOG_HEARTBEAT`], so the merging node knows the stream is alive
//! without the gossip view.
//!
//! Acks and nacks on the stream settle in tasks of their own, within the
//! per-stream bound on ids being settled that client streams have
//! (`fan_in/inbound.rs`): while it is full nothing more is read. Merging
//! nodes settle through `Peer.Settle` instead, so only a peer that chose
//! to settle here reaches that bound.
//!
//! IMPLEMENTATION CAVEATS
//! - The deliveries waiting to be sent are not bounded by the stream's
//!   credits yet.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use floret_proto::peer::v1::PeerConsumeResponse;
use floret_proto::v1::{self, consume_request};
use futures::{Stream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Status, Streaming};

use super::floret::read_subscribe;
use super::{convert, fan_in};
use crate::deliver::{
    BacklogReport, ConsumerEvent, ConsumerId, DispatcherHandle, SettleKind, SettledBy,
};
use crate::request::{self, InvalidRequest};
use crate::settle::Settler;

/// How often the backlog is reported when it does not change.
pub const BACKLOG_HEARTBEAT: Duration = Duration::from_secs(1);

/// What a peer's consume stream of this node's dispatcher sends.
pub type PeerConsumeStream =
    Pin<Box<dyn Stream<Item = Result<PeerConsumeResponse, Status>> + Send>>;

/// Serves a consume stream of this node's own dispatcher from `sources`;
/// its first request must be a subscribe.
pub(crate) async fn serve(
    sources: &fan_in::Sources,
    request: tonic::Request<Streaming<v1::ConsumeRequest>>,
) -> Result<PeerConsumeStream, Status> {
    let owner = convert::stream_owner_from_metadata(request.metadata())?;
    let mut inbound = request.into_inner();
    let (queue, credits) = read_subscribe(&mut inbound).await?;
    let (admitted, requests) = mpsc::unbounded_channel();
    tokio::spawn(fan_in::read_requests(inbound, admitted));
    let (events, deliveries) = mpsc::unbounded_channel();
    let (failures, failed) = mpsc::unbounded_channel::<Status>();
    let (finished, stopped) = oneshot::channel::<()>();
    let consumer = sources
        .dispatcher
        .subscribe(queue, credits, events.clone(), true, owner.clone())
        .await
        .map_err(Status::from)?;
    let (dispatcher, settler) = (sources.dispatcher.clone(), sources.settler.clone());
    tokio::spawn(async move {
        let on_stream = StreamSettler {
            settler,
            by: SettledBy::Stream(owner),
        };
        read_consumer_requests(requests, consumer, dispatcher, on_stream, events, failures).await;
        let _stream_gone = finished.send(());
    });
    let last_report = Arc::new(Mutex::new(BacklogReport::default()));
    let reported = last_report.clone();
    let events = UnboundedReceiverStream::new(deliveries).map(move |event| {
        if let ConsumerEvent::Backlog(report) = &event {
            *reported.lock().expect("the report lock is never poisoned") = report.clone();
        }
        Ok(convert::peer_consume_response(event))
    });
    let heartbeats = futures::stream::unfold((), |()| async {
        tokio::time::sleep(BACKLOG_HEARTBEAT).await;
        Some(((), ()))
    })
    .map(move |()| {
        let report = last_report
            .lock()
            .expect("the report lock is never poisoned")
            .clone();
        Ok(convert::peer_consume_response(ConsumerEvent::Backlog(
            report,
        )))
    })
    .take_until(stopped);
    let failed = UnboundedReceiverStream::new(failed).map(Err);
    Ok(Box::pin(futures::stream::select(
        futures::stream::select(events, failed),
        heartbeats,
    )))
}

/// Serves credits, acks and nacks from a consumer, as `fan_in::read_requests`
/// admits them, until its stream ends or misbehaves; then the dispatcher
/// takes back what the consumer held.
async fn read_consumer_requests(
    mut requests: mpsc::UnboundedReceiver<Result<fan_in::Admitted, ()>>,
    consumer: ConsumerId,
    dispatcher: DispatcherHandle,
    settler: StreamSettler,
    events: mpsc::UnboundedSender<ConsumerEvent>,
    failures: mpsc::UnboundedSender<Status>,
) {
    while let Some(Ok((request, settling))) = requests.recv().await {
        let result = match request.request {
            Some(consume_request::Request::Credit(credit)) if credit.set => dispatcher
                .set_credits(consumer, credit.credits)
                .map_err(Status::from),
            Some(consume_request::Request::Credit(credit)) => request::credits(credit.credits)
                .map_err(Status::from)
                .and_then(|credits| dispatcher.credit(consumer, credits).map_err(Status::from)),
            Some(consume_request::Request::TenantShares(shares)) => dispatcher
                .tenant_shares(consumer, convert::tenant_shares_from_wire(shares))
                .map_err(Status::from),
            Some(consume_request::Request::Ack(settle)) => request::settle_kind(false, &settle)
                .map_err(Status::from)
                .and_then(|kind| settle_on_stream(&settler, kind, settle, settling, &events)),
            Some(consume_request::Request::Nack(settle)) => request::settle_kind(true, &settle)
                .map_err(Status::from)
                .and_then(|kind| settle_on_stream(&settler, kind, settle, settling, &events)),
            Some(consume_request::Request::Subscribe(_)) => Err(InvalidRequest::Malformed(
                "this stream is already subscribed; open another stream for another queue",
            )
            .into()),
            None => Err(InvalidRequest::Malformed("empty consume request").into()),
        };
        if let Err(status) = result {
            let _consumer_gone = failures.send(status);
            break;
        }
    }
    dispatcher.consumer_gone(consumer);
}

/// Settles what arrives on one stream, as that stream's consumer.
struct StreamSettler {
    settler: Settler,
    by: SettledBy,
}

/// Settles in its own task, so a consumer's next requests are read while
/// its acks commit, holding `settling` (its place in the stream's bound)
/// until answered; the outcomes come back on the stream.
fn settle_on_stream(
    settler: &StreamSettler,
    kind: SettleKind,
    settle: v1::Settle,
    settling: Option<OwnedSemaphorePermit>,
    events: &mpsc::UnboundedSender<ConsumerEvent>,
) -> Result<(), Status> {
    if settle.delivery_ids.is_empty() {
        return Err(
            InvalidRequest::Malformed("an ack or nack needs at least one delivery_id").into(),
        );
    }
    let (by, events) = (settler.by.clone(), events.clone());
    let settler = settler.settler.clone();
    tokio::spawn(async move {
        if let Ok(outcomes) = settler
            .settle_holding(kind, settle.delivery_ids, &by, settling)
            .await
        {
            let _consumer_gone = events.send(ConsumerEvent::Settled(outcomes));
        }
    });
    Ok(())
}
