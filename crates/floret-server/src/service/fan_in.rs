//! A consumer's stream served from the whole cluster.
//!
//! Each node's dispatcher delivers only from the shards that node leads. A
//! consumer connected to one node still gets every shard's messages: that
//! node subscribes to its own dispatcher and, with `local_only` set, to
//! every peer's, and merges the deliveries into the consumer's stream.
//!
//! Credits: the consumer's credits not yet promised to a node are split
//! between the nodes by the backlogged weight each reports in the gossip
//! view ([`CreditSplit`]), so each node delivers in proportion to its
//! backlogged weight and every backlogged producer in the cluster gets
//! about `weight / total weight` of the consumer, wherever it is placed.
//! A live node with nothing backlogged keeps exactly one credit, so a
//! message arriving there goes out at once; the rest of what it held is
//! taken back (`Credit{set}`) and given to the backlogged nodes. Nodes the
//! view declares dead get none. With the cross-node split off every
//! backlogged node weighs the same (fair between nodes, not between
//! producers); a one-node cluster has no view and one source. Deliveries beyond the
//! consumer's credits (the one-per-node minimum can exceed them) wait here,
//! so the consumer never gets more than it granted.
//!
//! Acks and nacks on the stream go through the [`Settler`], which sends each
//! to the leader of its shard (where the lease is). A peer stream that
//! breaks is opened again after a pause; what it held is redelivered by its
//! shard's leader.
//!
//! IMPLEMENTATION CAVEATS
//! - A delivery waiting here for credit keeps its lease ticking on the node
//!   that made it; a consumer slower than the lease timeout with fewer
//!   credits than nodes can get a copy whose lease lapsed (its ack then
//!   fails and the message comes again: at-least-once still holds).
//! - Weights are as fresh as the view (a gossip interval or two).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::{Liveness, Peers, View};
use floret_proto::v1::{self, consume_request, consume_response};
use floret_store::NodeId;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Status, Streaming};

use super::credit_split::CreditSplit;
use super::{convert, status};
use crate::deliver::{ConsumerEvent, ConsumerId, DispatcherHandle, SettleKind};
use crate::request;
use crate::settle::Settler;

/// How long opening a consume stream on a peer may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the split is checked against the view without other events.
const REBALANCE_INTERVAL: Duration = Duration::from_millis(100);
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
    Connected(SourceIndex),
    Delivery(SourceIndex, u64, v1::Delivery),
    Disconnected(SourceIndex),
}

/// A change of a peer stream's credits.
#[derive(Debug, Clone, Copy)]
enum CreditChange {
    Add(u32),
    Set(u32),
}

/// What the merge task works on.
struct Merge {
    queue: String,
    dispatcher: DispatcherHandle,
    local_consumer: ConsumerId,
    /// Node of each source (this node first).
    nodes: Vec<NodeId>,
    /// Credit senders of the peer streams, by source index - 1; each change
    /// names the stream generation it is meant for.
    peer_credits: Vec<mpsc::UnboundedSender<(u64, CreditChange)>>,
    /// Whether each source's stream is open (the local one always is).
    connected: Vec<bool>,
    /// Credits each source was given and has not used for a delivery yet.
    outstanding: Vec<u64>,
    /// Generation of each source's current stream; deliveries of an older
    /// stream no longer count against its credits.
    generations: Vec<u64>,
    split: CreditSplit,
    /// The gossip view, when there is one, and whether to weigh by it.
    view: Option<watch::Receiver<Arc<View>>>,
    cross_node_split: bool,
    /// Credits the consumer granted and no delivery has used.
    consumer_credits: u64,
    /// Most credits a consumer may hold.
    max_credits: u64,
    /// The consumer's first credits: its window, as far as this node knows.
    initial_credits: u64,
    /// Deliveries that arrived while the consumer had no credit.
    waiting: VecDeque<(SourceIndex, v1::Delivery)>,
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
    /// The gossip view (none on a one-node cluster).
    pub view: Option<watch::Receiver<Arc<View>>>,
    /// Split credits by backlogged weight (else equally between nodes).
    pub cross_node_split: bool,
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
        view,
        cross_node_split,
    } = sources;
    let others: Vec<NodeId> = peers.others().collect();
    let source_count = 1 + others.len();
    let (local_events, local_deliveries) = mpsc::unbounded_channel();
    let local_consumer = dispatcher
        .subscribe(queue.clone(), 1, local_events, false)
        .await
        .map_err(status::from_stopped)?;
    let (peer_events, peer_deliveries) = mpsc::unbounded_channel();
    let mut peer_credits = Vec::with_capacity(others.len());
    for (offset, &node) in others.iter().enumerate() {
        let (credit_sender, credit_receiver) = mpsc::unbounded_channel();
        peer_credits.push(credit_sender);
        tokio::spawn(follow_peer(
            PeerSource {
                index: offset + 1,
                node,
                queue: queue.clone(),
                peers: peers.clone(),
            },
            credit_receiver,
            peer_events.clone(),
        ));
    }
    let mut connected = vec![false; source_count];
    connected[0] = true;
    let mut outstanding = vec![0; source_count];
    outstanding[0] = 1;
    let merge = Merge {
        queue,
        dispatcher,
        local_consumer,
        nodes: std::iter::once(peers.node_id()).chain(others).collect(),
        peer_credits,
        connected,
        outstanding,
        generations: vec![0; source_count],
        split: CreditSplit::new(source_count),
        view,
        cross_node_split,
        consumer_credits: u64::from(credits.min(max_credits)),
        max_credits: u64::from(max_credits),
        initial_credits: u64::from(credits.min(max_credits)),
        waiting: VecDeque::new(),
        outbound,
    };
    tokio::spawn(merge.run(inbound, local_deliveries, peer_deliveries, settler));
    Ok(())
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
        let mut tick = tokio::time::interval(REBALANCE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
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
                    PeerEvent::Connected(source) => {
                        self.connected[source] = true;
                        self.outstanding[source] = 1;
                    }
                    PeerEvent::Delivery(source, generation, delivery) => {
                        self.on_delivery(source, generation, delivery);
                    }
                    PeerEvent::Disconnected(source) => {
                        self.connected[source] = false;
                        self.outstanding[source] = 0;
                        self.generations[source] += 1;
                        self.waiting.retain(|(index, _)| *index != source);
                    }
                },
            }
            if self.outbound.is_closed() {
                break;
            }
            if let Err(status) = self.rebalance() {
                let _consumer_gone = self.outbound.send(Err(status));
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
        if generation == self.generations[source] {
            self.outstanding[source] = self.outstanding[source].saturating_sub(1);
        }
        if self.consumer_credits == 0 {
            self.waiting.push_back((source, delivery));
            return;
        }
        self.forward(delivery);
    }

    fn forward(&mut self, delivery: v1::Delivery) {
        self.consumer_credits -= 1;
        self.send(consume_response::Response::Delivery(delivery));
    }

    fn on_request(&mut self, request: v1::ConsumeRequest, settler: &Settler) -> Result<(), Status> {
        match request.request {
            Some(consume_request::Request::Credit(credit)) if credit.set => {
                Err(Status::invalid_argument(
                    "credit.set is for streams between nodes (local_only); consumers add credits",
                ))
            }
            Some(consume_request::Request::Credit(credit)) => {
                let credits = request::credits(credit.credits)?;
                self.on_credit(credits)
            }
            Some(consume_request::Request::Ack(settle)) => {
                self.settle(request::settle_kind(false, &settle)?, settle, settler)
            }
            Some(consume_request::Request::Nack(settle)) => {
                self.settle(request::settle_kind(true, &settle)?, settle, settler)
            }
            Some(consume_request::Request::Subscribe(_)) => Err(Status::invalid_argument(
                "this stream is already subscribed; open another stream for another queue",
            )),
            None => Err(Status::invalid_argument("empty consume request")),
        }
    }

    fn on_credit(&mut self, credits: u32) -> Result<(), Status> {
        self.consumer_credits = (self.consumer_credits + u64::from(credits)).min(self.max_credits);
        while self.consumer_credits > 0 {
            let Some((_, delivery)) = self.waiting.pop_front() else {
                break;
            };
            self.forward(delivery);
        }
        Ok(())
    }

    /// Whether each source is connected and not declared dead by the view,
    /// and its weight for this queue: its backlogged weight in the view
    /// (with the cross-node split off: 1 if it has any backlog, so
    /// backlogged nodes share equally), or 1 without a view; 0 when not
    /// live. When no live source has any, every live one weighs 1.
    fn weights(&self) -> (Vec<bool>, Vec<u64>) {
        let view = self.view.as_ref().map(|view| view.borrow().clone());
        let live: Vec<bool> = (0..self.nodes.len())
            .map(|source| {
                self.connected[source]
                    && view.as_ref().is_none_or(|view| {
                        view.get(&self.nodes[source])
                            .is_none_or(|node| node.liveness != Liveness::Dead)
                    })
            })
            .collect();
        let backlogged = |source: usize| {
            let Some(view) = &view else {
                return 1;
            };
            let weight = view
                .get(&self.nodes[source])
                .and_then(|node| node.report.queues.get(&self.queue))
                .map_or(0, |load| load.backlogged_weight);
            if self.cross_node_split {
                weight
            } else {
                weight.min(1)
            }
        };
        let mut weights: Vec<u64> = (0..self.nodes.len())
            .map(|source| if live[source] { backlogged(source) } else { 0 })
            .collect();
        if weights.iter().all(|&w| w == 0) {
            for (source, weight) in weights.iter_mut().enumerate() {
                *weight = u64::from(live[source]);
            }
        }
        (live, weights)
    }

    /// Keeps one credit at every live source with nothing backlogged (taking
    /// back the rest) so a message arriving there goes out at once, refilled
    /// only while the consumer has credit to spare (a source the view still
    /// calls idle while it delivers would otherwise be refilled without
    /// end), and none at dead ones; trims a backlogged source holding more
    /// than twice its weighted share of the consumer's window (its report may
    /// be stale); and splits the
    /// consumer's credits not promised to backlogged sources between them by
    /// weight. The idle sources' single credits are an accepted overcommit:
    /// they are not counted as promised, so a consumer with fewer credits
    /// than nodes still gets the backlog.
    fn rebalance(&mut self) -> Result<(), Status> {
        let (live, weights) = self.weights();
        let total_weight: u64 = weights.iter().sum();
        let consumer_has_room = self.consumer_credits > self.waiting.len() as u64;
        let mut changes: Vec<Option<CreditChange>> = vec![None; self.nodes.len()];
        for source in 0..self.nodes.len() {
            if !self.connected[source] {
                continue;
            }
            let keep = if !live[source] {
                0
            } else if weights[source] == 0 {
                if self.outstanding[source] == 0 && !consumer_has_room {
                    continue;
                }
                1
            } else {
                let window = self.consumer_credits.max(self.initial_credits);
                let share = (window * weights[source]).div_ceil(total_weight.max(1));
                if self.outstanding[source] <= 2 * share + 1 {
                    continue;
                }
                share
            };
            if self.outstanding[source] > keep {
                self.outstanding[source] = keep;
                changes[source] = Some(CreditChange::Set(keep as u32));
            } else if self.outstanding[source] < keep {
                self.outstanding[source] = keep;
                changes[source] = Some(CreditChange::Add(keep as u32));
            }
        }
        let promised = (0..self.nodes.len())
            .filter(|&source| weights[source] > 0)
            .map(|source| self.outstanding[source])
            .sum::<u64>()
            + self.waiting.len() as u64;
        let unpromised = self.consumer_credits.saturating_sub(promised);
        if unpromised > 0 {
            let grants = self.split.split(unpromised, &weights);
            for (source, grant) in grants.into_iter().enumerate() {
                if grant == 0 {
                    continue;
                }
                self.outstanding[source] += grant;
                let grant = u32::try_from(grant).unwrap_or(u32::MAX);
                changes[source] = Some(match changes[source] {
                    Some(CreditChange::Set(base)) => CreditChange::Set(base.saturating_add(grant)),
                    Some(CreditChange::Add(base)) => CreditChange::Add(base.saturating_add(grant)),
                    None => CreditChange::Add(grant),
                });
            }
        }
        for (source, change) in changes.into_iter().enumerate() {
            let Some(change) = change else {
                continue;
            };
            if source == 0 {
                match change {
                    CreditChange::Add(credits) => {
                        self.dispatcher.credit(self.local_consumer, credits)
                    }
                    CreditChange::Set(credits) => {
                        self.dispatcher.set_credits(self.local_consumer, credits)
                    }
                }
                .map_err(status::from_stopped)?;
            } else {
                let _peer_stream_gone =
                    self.peer_credits[source - 1].send((self.generations[source], change));
            }
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
    peers: Arc<Peers>,
}

/// Keeps a `local_only` consume stream open to one peer while the merge
/// lives, passing its deliveries in and the merge's credits out.
async fn follow_peer(
    source: PeerSource,
    mut credits: mpsc::UnboundedReceiver<(u64, CreditChange)>,
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
                credits: 1,
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
                if events.send(PeerEvent::Connected(source.index)).is_err() {
                    return;
                }
                let mut deliveries = response.into_inner();
                loop {
                    tokio::select! {
                        change = credits.recv() => {
                            let Some((meant_for, change)) = change else {
                                return;
                            };
                            if meant_for != generation {
                                continue;
                            }
                            let (credits, set) = match change {
                                CreditChange::Add(credits) => (credits, false),
                                CreditChange::Set(credits) => (credits, true),
                            };
                            let credit = v1::ConsumeRequest {
                                request: Some(consume_request::Request::Credit(v1::Credit { credits, set })),
                            };
                            let _ = requests.send(credit);
                        }
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
