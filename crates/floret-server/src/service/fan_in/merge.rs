//! The merge task of one consumer: takes deliveries from this node's
//! dispatcher and every peer's stream (a node that joins while it runs
//! becomes a source too), forwards them within the consumer's
//! credits (holding the rest), handles the consumer's credits, acks and
//! nacks, and rebalances the sources' credits (`credits.rs`) on every event
//! and every [`REBALANCE_INTERVAL`].

use std::collections::VecDeque;
use std::sync::Arc;

use floret_cluster::Peers;

use floret_proto::v1::{self, consume_request, consume_response};
use floret_store::NodeId;
use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::time::Instant;
use tonic::{Status, Streaming};

use super::inbound;
use super::outbound::credit_room;
use super::tenant_shares::{SourceShares, source_shares};
use super::{
    FIRST_SPLIT_WAIT, Outbound, PeerEvent, REBALANCE_INTERVAL, SourceIndex, SourceRequest, Sources,
};
use crate::deliver::{
    BacklogReport, ConsumerEvent, ConsumerId, DispatcherHandle, SettleKind, SettledBy, StreamOwner,
    TenantShare,
};
use crate::delivery_id;
use crate::request::{self, InvalidRequest};
use crate::service::convert;
use crate::service::credit_split::CreditSplit;
use crate::service::request_id;
use crate::settle::Settler;

/// The size deliveries are assumed to have before any was measured: until
/// then a consumer may be promised 1,024 credits' worth (16 MiB), so one
/// that never reads cannot be promised its whole window of large messages.
const FIRST_DELIVERY_BYTES_GUESS: u64 = 16 * 1024;

/// What the merge task works on.
pub(super) struct Merge {
    pub(super) queue: String,
    /// The consumer's stream, which alone settles what it is delivered.
    pub(super) settled_by: SettledBy,
    /// The consumer's stream as the peers' dispatchers are told it.
    pub(super) owner: StreamOwner,
    /// The members, for following each one that joins.
    pub(super) peers: Arc<Peers>,
    /// Where the peer streams send their events.
    pub(super) peer_events: mpsc::UnboundedSender<PeerEvent>,
    pub(super) dispatcher: DispatcherHandle,
    pub(super) local_consumer: ConsumerId,
    /// Node of each source (this node first).
    pub(super) nodes: Vec<NodeId>,
    /// Credit senders of the peer streams, by source index - 1; each change
    /// names the stream generation it is meant for.
    pub(super) peer_credits: Vec<mpsc::UnboundedSender<(u64, SourceRequest)>>,
    /// Whether each source's stream is open (the local one always is).
    pub(super) connected: Vec<bool>,
    /// Credits each source was given and has not used for a delivery yet.
    pub(super) outstanding: Vec<u64>,
    /// Generation of each source's current stream; deliveries of an older
    /// stream no longer count against its credits.
    pub(super) generations: Vec<u64>,
    /// The backlog each source last reported on its current stream (None
    /// before its first report).
    pub(super) reports: Vec<Option<BacklogReport>>,
    /// What each source weighs in the credit split, from every source's
    /// report (`tenant_shares.rs`; None before its first report).
    pub(super) reported: Vec<Option<u64>>,
    /// The tenant shares each source's current stream was last sent (None:
    /// nothing sent on it yet).
    pub(super) shares_sent: Vec<Option<Vec<TenantShare>>>,
    /// When each source was last heard from on its current stream.
    pub(super) last_heard: Vec<Instant>,
    /// When the first split may go ahead without every source's report.
    pub(super) split_from: Instant,
    pub(super) split: CreditSplit,
    /// Whether to weigh sources by their reports (else equally).
    pub(super) cross_node_split: bool,
    /// Credits the consumer granted and no delivery has used.
    pub(super) consumer_credits: u64,
    /// Most credits a consumer may hold.
    pub(super) max_credits: u64,
    /// The consumer's first credits: its window, as far as this node knows.
    pub(super) initial_credits: u64,
    /// Deliveries that arrived while the consumer had no credit or room.
    pub(super) waiting: VecDeque<(SourceIndex, v1::Delivery)>,
    pub(super) outbound: Outbound,
    /// Recent deliveries' encoded size, smoothed: how many more fit in the
    /// consumer's unread bound.
    pub(super) average_delivery_bytes: u64,
}

/// Serves one consumer of `queue` from every node: subscribes here and at
/// every peer as `owner`, then merges until the consumer's stream ends.
pub async fn serve(
    sources: Sources,
    queue: String,
    credits: u32,
    owner: StreamOwner,
    inbound: Streaming<v1::ConsumeRequest>,
    outbound: Outbound,
) -> Result<(), Status> {
    let Sources {
        dispatcher,
        settler,
        peers,
        max_credits,
        cross_node_split,
    } = sources;
    let (local_events, local_deliveries) = mpsc::unbounded_channel();
    let local_consumer = dispatcher
        .subscribe(queue.clone(), 1, local_events, false, owner.clone())
        .await
        .map_err(Status::from)?;
    let (peer_events, peer_deliveries) = mpsc::unbounded_channel();
    let started = Instant::now();
    let mut merge = Merge {
        queue,
        settled_by: SettledBy::Stream(owner.clone()),
        owner,
        dispatcher,
        local_consumer,
        nodes: vec![peers.node_id()],
        peers,
        peer_events,
        peer_credits: Vec::new(),
        connected: vec![true],
        outstanding: vec![1],
        generations: vec![0],
        reports: vec![None],
        reported: vec![None],
        shares_sent: vec![None],
        last_heard: vec![started],
        split_from: started + FIRST_SPLIT_WAIT,
        split: CreditSplit::new(1),
        cross_node_split,
        consumer_credits: u64::from(credits.min(max_credits)),
        max_credits: u64::from(max_credits),
        initial_credits: u64::from(credits.min(max_credits)),
        waiting: VecDeque::new(),
        outbound,
        average_delivery_bytes: FIRST_DELIVERY_BYTES_GUESS,
    };
    merge.follow_new_members();
    tokio::spawn(request_id::within_call(merge.run(
        inbound,
        local_deliveries,
        peer_deliveries,
        settler,
    )));
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
        tokio::spawn(inbound::read_requests(inbound, requests_sender));
        let mut tick = tokio::time::interval(REBALANCE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stream = self.outbound.clone();
        let mut member_changes = self.peers.member_changes();
        loop {
            tokio::select! {
                _ = tick.tick() => self.forward_waiting(),
                Ok(()) = member_changes.changed() => self.follow_new_members(),
                () = stream.taken() => self.forward_waiting(),
                request = requests.recv() => match request {
                    Some(Ok((request, settling))) => {
                        if let Err(status) = self.on_request(request, settling, &settler) {
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
                    ConsumerEvent::Backlog(report) => self.on_report(0, Some(report)),
                },
                Some(event) = peers.recv() => match event {
                    PeerEvent::Connected(source) => {
                        self.connected[source] = true;
                        self.outstanding[source] = 1;
                        self.shares_sent[source] = None;
                        self.last_heard[source] = Instant::now();
                    }
                    PeerEvent::Delivery(source, generation, delivery) => {
                        self.heard_from(source, generation);
                        self.on_delivery(source, generation, delivery);
                    }
                    PeerEvent::Backlog(source, generation, report) => {
                        if self.heard_from(source, generation) {
                            self.on_report(source, Some(report));
                        }
                    }
                    PeerEvent::Disconnected(source) => {
                        self.connected[source] = false;
                        self.outstanding[source] = 0;
                        self.generations[source] += 1;
                        self.on_report(source, None);
                        self.waiting.retain(|(index, _)| *index != source);
                    }
                },
            }
            if self.outbound.is_closed() {
                break;
            }
            if let Err(status) = self.rebalance(Instant::now()) {
                let _consumer_gone = self.outbound.send(Err(status));
                break;
            }
        }
        self.dispatcher.consumer_gone(self.local_consumer);
    }

    /// Notes that `source` spoke on its stream of `generation`; false if
    /// that stream is no longer its current one.
    fn heard_from(&mut self, source: SourceIndex, generation: u64) -> bool {
        let current = generation == self.generations[source];
        if current {
            self.last_heard[source] = Instant::now();
        }
        current
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
        self.waiting.push_back((source, delivery));
        self.forward_waiting();
    }

    /// Credits the merge may use now: the consumer's, as far as its
    /// stream has room for unread deliveries.
    pub(super) fn usable_credits(&self) -> u64 {
        credit_room(
            self.consumer_credits,
            self.outbound.unread_bytes(),
            self.average_delivery_bytes,
        )
    }

    /// Forwards held deliveries, oldest first, while the consumer has
    /// credit and room. When room is what it lacks, the client's next read
    /// wakes the merge; the room is looked at again after asking, so a
    /// read in between is not missed.
    fn forward_waiting(&mut self) {
        loop {
            while self.usable_credits() > 0 {
                let Some((_, delivery)) = self.waiting.pop_front() else {
                    return;
                };
                self.forward(delivery);
            }
            if self.waiting.is_empty() || self.consumer_credits == 0 {
                return;
            }
            self.outbound.wait_for_room();
            if self.usable_credits() == 0 {
                return;
            }
        }
    }

    /// Source `source` reported its backlog (None: its stream closed):
    /// every source's weight is computed again, and each source whose
    /// tenants' shares changed is told them (with the cross-node split off,
    /// backlogged nodes get equal credits whatever their tenants, so every
    /// tenant keeps a whole share).
    fn on_report(&mut self, source: SourceIndex, report: Option<BacklogReport>) {
        if self.reports[source] == report {
            return;
        }
        self.reports[source] = report;
        let reports: Vec<Option<&BacklogReport>> =
            self.reports.iter().map(Option::as_ref).collect();
        let SourceShares { weights, shares } = source_shares(&reports);
        self.reported = weights;
        if !self.cross_node_split {
            return;
        }
        for (source, shares) in shares.into_iter().enumerate() {
            if !self.connected[source] || self.shares_sent[source].as_ref() == Some(&shares) {
                continue;
            }
            if source == 0 {
                let _stopping = self
                    .dispatcher
                    .tenant_shares(self.local_consumer, shares.clone());
            } else {
                let request = (
                    self.generations[source],
                    SourceRequest::TenantShares(shares.clone()),
                );
                let _peer_stream_gone = self.peer_credits[source - 1].send(request);
            }
            self.shares_sent[source] = Some(shares);
        }
    }

    fn forward(&mut self, delivery: v1::Delivery) {
        self.consumer_credits -= 1;
        let bytes = delivery.encoded_len() as u64;
        self.average_delivery_bytes =
            self.average_delivery_bytes - self.average_delivery_bytes / 16 + bytes / 16;
        let _consumer_gone = self.outbound.send_delivery(delivery, bytes);
    }

    /// Handles one request of the consumer; `settling` holds an ack's or
    /// nack's place in the stream's bound until its settle is answered.
    fn on_request(
        &mut self,
        request: v1::ConsumeRequest,
        settling: Option<OwnedSemaphorePermit>,
        settler: &Settler,
    ) -> Result<(), Status> {
        match request.request {
            Some(consume_request::Request::Credit(credit)) if credit.set => {
                Err(InvalidRequest::Malformed(
                    "credit.set is for the streams between nodes (on the peer port); consumers add credits",
                )
                .into())
            }
            Some(consume_request::Request::Credit(credit)) => {
                let credits = request::credits(credit.credits)?;
                self.on_credit(credits)
            }
            Some(consume_request::Request::Ack(settle)) => {
                let kind = request::settle_kind(false, &settle)?;
                self.settle(kind, settle, settling, settler)
            }
            Some(consume_request::Request::Nack(settle)) => {
                let kind = request::settle_kind(true, &settle)?;
                self.settle(kind, settle, settling, settler)
            }
            Some(consume_request::Request::Subscribe(_)) => Err(InvalidRequest::Malformed(
                "this stream is already subscribed; open another stream for another queue",
            )
            .into()),
            Some(consume_request::Request::TenantShares(_)) => Err(InvalidRequest::Malformed(
                "tenant_shares is for the streams between nodes (on the peer port)",
            )
            .into()),
            None => Err(InvalidRequest::Malformed("empty consume request").into()),
        }
    }

    fn on_credit(&mut self, credits: u32) -> Result<(), Status> {
        self.consumer_credits = (self.consumer_credits + u64::from(credits)).min(self.max_credits);
        self.forward_waiting();
        Ok(())
    }

    fn settle(
        &self,
        kind: SettleKind,
        settle: v1::Settle,
        settling: Option<OwnedSemaphorePermit>,
        settler: &Settler,
    ) -> Result<(), Status> {
        if settle.delivery_ids.is_empty() {
            return Err(
                InvalidRequest::Malformed("an ack or nack needs at least one delivery_id").into(),
            );
        }
        let (own, foreign): (Vec<String>, Vec<String>) = settle
            .delivery_ids
            .into_iter()
            .partition(|id| delivery_id::queue_of(id).is_none_or(|queue| queue == self.queue));
        if !foreign.is_empty() {
            tracing::warn!(target: "audit", queue = %self.queue, refused = foreign.len(), "settle refused: deliveries of another queue on this stream");
            crate::auth::count_refusal("queue");
        }
        let refused: Vec<v1::SettleOutcome> = foreign
            .into_iter()
            .map(|delivery_id| v1::SettleOutcome {
                message: format!(
                    "delivery {delivery_id} is not of queue {:?}, which this stream consumes: settle it on its own queue's stream",
                    self.queue
                ),
                delivery_id,
                code: tonic::Code::PermissionDenied as i32,
            })
            .collect();
        let (settler, outbound) = (settler.clone(), self.outbound.clone());
        let settled_by = self.settled_by.clone();
        tokio::spawn(async move {
            let mut outcomes = refused;
            if !own.is_empty()
                && let Ok(settled) = settler
                    .settle_holding(kind, own, &settled_by, settling)
                    .await
            {
                outcomes.extend(settled.into_iter().map(convert::settle_outcome));
            }
            if !outcomes.is_empty() {
                let _consumer_gone = outbound.send(Ok(v1::ConsumeResponse {
                    response: Some(consume_response::Response::Settled(v1::SettleResult {
                        outcomes,
                    })),
                }));
            }
        });
        tracing::trace!(queue = self.queue, "settle sent");
        Ok(())
    }
}
