//! A consumer's stream served from the whole cluster.
//!
//! Each node's dispatcher delivers only from the shards that node leads. A
//! consumer connected to one node still gets every shard's messages: that
//! node subscribes to its own dispatcher and, with `local_only` set, to
//! every peer's, and merges the deliveries into the consumer's stream.
//!
//! Credits: the consumer's window is split into one share per source (at
//! least one credit each). A delivery uses its source's credit; when the
//! consumer grants credits back, they return to the sources of the oldest
//! deliveries it has not yet returned credit for, so each source keeps its
//! share. Since shares round up, sources may deliver a few more than the
//! consumer's credits: such deliveries wait here until the consumer grants
//! more, so the consumer never gets more than it asked for.
//!
//! Acks and nacks on the stream go through the [`Settler`], which sends each
//! to the leader of its shard (where the lease is). A peer stream that
//! breaks is opened again after a pause; what it held is redelivered by its
//! shard's leader.
//!
//! IMPLEMENTATION CAVEATS
//! - Shares are equal per node, so fairness across nodes is per node, not per
//!   producer: the split by backlogged weight comes with the gossip view.
//! - A delivery waiting here for credit keeps its lease ticking on the node
//!   that made it; a consumer slower than the lease timeout with fewer
//!   credits than nodes can get a copy whose lease lapsed (its ack then
//!   fails and the message comes again: at-least-once still holds).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::Peers;
use floret_proto::v1::{self, consume_request, consume_response};
use floret_store::NodeId;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Status, Streaming};

use super::{convert, status};
use crate::dispatcher::{ConsumerEvent, ConsumerId, DispatcherHandle, SettleKind};
use crate::request;
use crate::settle::Settler;

/// How long opening a consume stream on a peer may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before a broken peer stream is opened again.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);
/// Largest delivery accepted from a peer.
const MAX_DELIVERY_BYTES: usize = 32 * 1024 * 1024;

/// What the consumer's stream receives.
pub type Outbound = mpsc::UnboundedSender<Result<v1::ConsumeResponse, Status>>;

/// Index of a source: 0 is this node's dispatcher, then one per peer.
type SourceIndex = usize;

/// What a peer stream reports to the merge.
enum PeerEvent {
    Delivery(SourceIndex, u64, v1::Delivery),
    Disconnected(SourceIndex),
}

/// What the merge task works on.
struct Merge {
    queue: String,
    dispatcher: DispatcherHandle,
    local_consumer: ConsumerId,
    /// Credit senders of the peer streams, by source index - 1.
    peer_credits: Vec<mpsc::UnboundedSender<u32>>,
    /// Each source's share of the consumer's window.
    shares: Vec<u32>,
    /// Generation of each source's current stream; credits of deliveries
    /// from an older stream are not returned to the new one.
    generations: Vec<u64>,
    /// Credits the consumer granted and no delivery has used.
    consumer_credits: u64,
    /// Most credits a consumer may hold.
    max_credits: u64,
    /// Deliveries that arrived while the consumer had no credit.
    waiting: VecDeque<(SourceIndex, u64, v1::Delivery)>,
    /// Sources (and stream generations) of forwarded deliveries whose
    /// credit has not been returned yet, oldest first.
    to_return: VecDeque<(SourceIndex, u64)>,
    /// Next source to get a credit the consumer added beyond its first window.
    next_extra: SourceIndex,
    outbound: Outbound,
}

/// What a node merges consumers from: its own dispatcher, its settler for
/// their acks, and its peers.
#[derive(Clone)]
pub struct Sources {
    /// This node's dispatcher.
    pub dispatcher: DispatcherHandle,
    /// Routes acks and nacks to their shard's leader.
    pub settler: Settler,
    /// The other nodes.
    pub peers: Arc<Peers>,
    /// Most credits a consumer may hold.
    pub max_credits: u32,
}

/// Serves one consumer of `queue` from every node: subscribes here and at
/// every peer, then merges until the consumer's stream ends.
pub async fn serve(
    sources: Sources,
    queue: String,
    credits: u32,
    inbound: Streaming<v1::ConsumeRequest>,
    outbound: Outbound,
) -> Result<(), Status> {
    let Sources {
        dispatcher,
        settler,
        peers,
        max_credits,
    } = sources;
    let others: Vec<NodeId> = peers.others().collect();
    let source_count = 1 + others.len();
    let shares = split(credits, source_count);
    let (local_events, local_deliveries) = mpsc::unbounded_channel();
    let local_consumer = dispatcher
        .subscribe(queue.clone(), shares[0], local_events)
        .await
        .map_err(status::from_stopped)?;
    let (peer_events, peer_deliveries) = mpsc::unbounded_channel();
    let mut peer_credits = Vec::with_capacity(others.len());
    for (offset, node) in others.into_iter().enumerate() {
        let (credit_sender, credit_receiver) = mpsc::unbounded_channel();
        peer_credits.push(credit_sender);
        tokio::spawn(follow_peer(
            PeerSource {
                index: offset + 1,
                node,
                queue: queue.clone(),
                share: shares[offset + 1],
                peers: peers.clone(),
            },
            credit_receiver,
            peer_events.clone(),
        ));
    }
    let merge = Merge {
        queue,
        dispatcher,
        local_consumer,
        peer_credits,
        generations: vec![0; source_count],
        shares,
        consumer_credits: u64::from(credits.min(max_credits)),
        max_credits: u64::from(max_credits),
        waiting: VecDeque::new(),
        to_return: VecDeque::new(),
        next_extra: 0,
        outbound,
    };
    tokio::spawn(merge.run(inbound, local_deliveries, peer_deliveries, settler));
    Ok(())
}

/// `credits` split into `sources` shares of at least one each.
fn split(credits: u32, sources: usize) -> Vec<u32> {
    let sources_u32 = sources as u32;
    (0..sources_u32)
        .map(|index| (credits / sources_u32 + u32::from(index < credits % sources_u32)).max(1))
        .collect()
}

impl Merge {
    async fn run(
        mut self,
        inbound: Streaming<v1::ConsumeRequest>,
        mut local: mpsc::UnboundedReceiver<ConsumerEvent>,
        mut peers: mpsc::UnboundedReceiver<PeerEvent>,
        settler: Settler,
    ) {
        let (requests_sender, mut requests) = mpsc::unbounded_channel();
        tokio::spawn(read_requests(inbound, requests_sender));
        loop {
            tokio::select! {
                request = requests.recv() => match request {
                    Some(Ok(request)) => {
                        if let Err(status) = self.on_request(request, &settler) {
                            let _consumer_gone = self.outbound.send(Err(status));
                            break;
                        }
                    }
                    Some(Err(())) | None => break,
                },
                Some(event) = local.recv() => match event {
                    ConsumerEvent::Delivery(delivered) => {
                        self.on_delivery(0, 0, convert::delivery(*delivered));
                    }
                    ConsumerEvent::Settled(outcomes) => {
                        self.send(consume_response::Response::Settled(v1::SettleResult {
                            outcomes: outcomes.into_iter().map(convert::settle_outcome).collect(),
                        }));
                    }
                },
                Some(event) = peers.recv() => match event {
                    PeerEvent::Delivery(source, generation, delivery) => {
                        self.on_delivery(source, generation, delivery);
                    }
                    PeerEvent::Disconnected(source) => {
                        self.generations[source] += 1;
                        self.waiting.retain(|(index, _, _)| *index != source);
                    }
                },
            }
            if self.outbound.is_closed() {
                break;
            }
        }
        self.dispatcher.consumer_gone(self.local_consumer);
    }

    fn send(&self, response: consume_response::Response) {
        let _consumer_gone = self.outbound.send(Ok(v1::ConsumeResponse {
            response: Some(response),
        }));
    }

    fn on_delivery(&mut self, source: SourceIndex, generation: u64, delivery: v1::Delivery) {
        if self.consumer_credits == 0 {
            self.waiting.push_back((source, generation, delivery));
            return;
        }
        self.forward(source, generation, delivery);
    }

    fn forward(&mut self, source: SourceIndex, generation: u64, delivery: v1::Delivery) {
        self.consumer_credits -= 1;
        self.to_return.push_back((source, generation));
        self.send(consume_response::Response::Delivery(delivery));
    }

    fn on_request(&mut self, request: v1::ConsumeRequest, settler: &Settler) -> Result<(), Status> {
        match request.request {
            Some(consume_request::Request::Credit(credit)) => {
                let credits = request::credits(credit.credits)?;
                self.on_credit(credits)
            }
            Some(consume_request::Request::Ack(settle)) => {
                self.settle(SettleKind::Ack, settle, settler)
            }
            Some(consume_request::Request::Nack(settle)) => {
                self.settle(SettleKind::Nack, settle, settler)
            }
            Some(consume_request::Request::Subscribe(_)) => Err(Status::invalid_argument(
                "this stream is already subscribed; open another stream for another queue",
            )),
            None => Err(Status::invalid_argument("empty consume request")),
        }
    }

    fn on_credit(&mut self, credits: u32) -> Result<(), Status> {
        let room = self.max_credits.saturating_sub(self.consumer_credits);
        let credits = u32::try_from(u64::from(credits).min(room)).unwrap_or(u32::MAX);
        self.consumer_credits += u64::from(credits);
        let sources = self.shares.len();
        let mut returned = vec![0u32; sources];
        let mut extra = credits;
        while extra > 0 {
            let Some((source, generation)) = self.to_return.pop_front() else {
                break;
            };
            extra -= 1;
            if generation == self.generations[source] {
                returned[source] += 1;
            }
        }
        for offset in 0..sources {
            let source = (self.next_extra + offset) % sources;
            returned[source] +=
                extra / sources as u32 + u32::from((offset as u32) < extra % sources as u32);
        }
        self.next_extra = (self.next_extra + extra as usize) % sources;
        for (source, credits) in returned.into_iter().enumerate() {
            if credits == 0 {
                continue;
            }
            if source == 0 {
                self.dispatcher
                    .credit(self.local_consumer, credits)
                    .map_err(status::from_stopped)?;
            } else {
                let _peer_stream_gone = self.peer_credits[source - 1].send(credits);
            }
        }
        while self.consumer_credits > 0 {
            let Some((source, generation, delivery)) = self.waiting.pop_front() else {
                break;
            };
            self.forward(source, generation, delivery);
        }
        Ok(())
    }

    fn settle(
        &self,
        kind: SettleKind,
        settle: v1::Settle,
        settler: &Settler,
    ) -> Result<(), Status> {
        if settle.delivery_ids.is_empty() {
            return Err(Status::invalid_argument(
                "an ack or nack needs at least one delivery_id",
            ));
        }
        let (settler, outbound) = (settler.clone(), self.outbound.clone());
        tokio::spawn(async move {
            if let Ok(outcomes) = settler.settle(kind, settle.delivery_ids).await {
                let _consumer_gone = outbound.send(Ok(v1::ConsumeResponse {
                    response: Some(consume_response::Response::Settled(v1::SettleResult {
                        outcomes: outcomes.into_iter().map(convert::settle_outcome).collect(),
                    })),
                }));
            }
        });
        tracing::trace!(queue = self.queue, "settle sent");
        Ok(())
    }
}

/// Reads the consumer's requests; `Err(())` when its stream failed.
async fn read_requests(
    mut inbound: Streaming<v1::ConsumeRequest>,
    requests: mpsc::UnboundedSender<Result<v1::ConsumeRequest, ()>>,
) {
    loop {
        match inbound.message().await {
            Ok(Some(request)) => {
                if requests.send(Ok(request)).is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Err(status) => {
                tracing::debug!(%status, "consume stream failed");
                let _merge_gone = requests.send(Err(()));
                return;
            }
        }
    }
}

/// One peer's dispatcher as a source of the merge.
struct PeerSource {
    index: SourceIndex,
    node: NodeId,
    queue: String,
    share: u32,
    peers: Arc<Peers>,
}

/// Keeps a `local_only` consume stream open to one peer while the merge
/// lives, passing its deliveries in and the merge's credits out.
async fn follow_peer(
    source: PeerSource,
    mut credits: mpsc::UnboundedReceiver<u32>,
    events: mpsc::UnboundedSender<PeerEvent>,
) {
    let Some(channel) = source.peers.channel(source.node) else {
        return;
    };
    let mut generation = 0;
    loop {
        while credits.try_recv().is_ok() {}
        let (requests, outgoing) = mpsc::unbounded_channel();
        let subscribe = v1::ConsumeRequest {
            request: Some(consume_request::Request::Subscribe(v1::Subscribe {
                queue: source.queue.clone(),
                credits: source.share,
                local_only: true,
            })),
        };
        let _ = requests.send(subscribe);
        let mut client = v1::floret_client::FloretClient::new(channel.clone())
            .max_decoding_message_size(MAX_DELIVERY_BYTES);
        let opened = tokio::time::timeout(
            OPEN_TIMEOUT,
            client.consume(UnboundedReceiverStream::new(outgoing)),
        )
        .await
        .unwrap_or_else(|_| Err(Status::deadline_exceeded("no answer")));
        match opened {
            Ok(response) => {
                let mut deliveries = response.into_inner();
                loop {
                    tokio::select! {
                        granted = credits.recv() => match granted {
                            Some(granted) => {
                                let credit = v1::ConsumeRequest {
                                    request: Some(consume_request::Request::Credit(v1::Credit { credits: granted })),
                                };
                                let _ = requests.send(credit);
                            }
                            None => return,
                        },
                        message = deliveries.message() => match message {
                            Ok(Some(v1::ConsumeResponse { response: Some(consume_response::Response::Delivery(delivery)) })) => {
                                if events.send(PeerEvent::Delivery(source.index, generation, delivery)).is_err() {
                                    return;
                                }
                            }
                            Ok(Some(_)) => {}
                            Ok(None) => break,
                            Err(status) => {
                                tracing::debug!(node = source.node, %status, "peer consume stream broke");
                                break;
                            }
                        },
                    }
                }
            }
            Err(status) => {
                tracing::debug!(node = source.node, %status, "cannot open a consume stream on a peer");
            }
        }
        if events.send(PeerEvent::Disconnected(source.index)).is_err() {
            return;
        }
        generation += 1;
        tokio::select! {
            () = tokio::time::sleep(RECONNECT_PAUSE) => {}
            () = events.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn credits_split_evenly_with_at_least_one_per_source() {
        assert_eq!(split(10, 3), [4, 3, 3]);
        assert_eq!(split(1, 3), [1, 1, 1]);
        assert_eq!(split(7, 1), [7]);
    }
}
