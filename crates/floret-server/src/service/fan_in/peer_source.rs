//! One peer's dispatcher as a source of a merge: a consume stream of its
//! own dispatcher (`Peer.Consume`, on its peer port) kept open while the
//! merge lives, its deliveries and backlog reports passed in and the
//! merge's credits passed out; a broken stream is opened again after a
//! pause. A node that joins while the merge lives becomes a source too
//! ([`Merge::follow_new_members`]).

use std::sync::Arc;

use floret_cluster::Peers;
use floret_proto::peer::v1::peer_client::PeerClient;
use floret_proto::peer::v1::{PeerConsumeResponse, peer_consume_response};
use floret_proto::v1::{self, consume_request};
use floret_store::NodeId;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

use crate::deliver::StreamOwner;
use crate::service::convert::{self, STREAM_OWNER_METADATA, stream_owner_metadata};
use crate::service::request_id;
use tokio::time::Instant;

use super::merge::Merge;
use super::{
    CreditChange, MAX_DELIVERY_BYTES, OPEN_TIMEOUT, PeerEvent, RECONNECT_PAUSE, SourceIndex,
    SourceRequest,
};

impl Merge {
    /// Adds every member not yet a source as one (all of them when the
    /// merge begins, then each node that joins while it lives), and
    /// follows its stream.
    pub(super) fn follow_new_members(&mut self) {
        for node in self.peers.others() {
            if self.nodes.contains(&node) {
                continue;
            }
            let index = self.nodes.len();
            let (credit_sender, credit_receiver) = mpsc::unbounded_channel();
            self.nodes.push(node);
            self.peer_credits.push(credit_sender);
            self.connected.push(false);
            self.outstanding.push(0);
            self.generations.push(0);
            self.reports.push(None);
            self.reported.push(None);
            self.shares_sent.push(None);
            self.last_heard.push(Instant::now());
            self.split.add_source();
            tokio::spawn(request_id::within_call(follow_peer(
                PeerSource {
                    index,
                    node,
                    queue: self.queue.clone(),
                    owner: self.owner.clone(),
                    peers: self.peers.clone(),
                },
                credit_receiver,
                self.peer_events.clone(),
            )));
        }
    }
}

/// One peer's dispatcher as a source of the merge.
pub(super) struct PeerSource {
    pub index: SourceIndex,
    pub node: NodeId,
    pub queue: String,
    /// The consumer's stream, named to the peer so its leases are the
    /// consumer's.
    pub owner: StreamOwner,
    pub peers: Arc<Peers>,
}

/// Keeps a consume stream of one peer's own dispatcher open while the merge
/// lives, passing its deliveries in and the merge's credits out.
pub(super) async fn follow_peer(
    source: PeerSource,
    mut credits: mpsc::UnboundedReceiver<(u64, SourceRequest)>,
    events: mpsc::UnboundedSender<PeerEvent>,
) {
    let Some(channel) = source.peers.channel(source.node) else {
        return;
    };
    let mut generation = 0;
    loop {
        while credits.try_recv().is_ok() {}
        let (requests, outgoing) = mpsc::unbounded_channel();
        match open(&source, channel.clone(), &requests, outgoing).await {
            Ok(deliveries) => {
                if events.send(PeerEvent::Connected(source.index)).is_err() {
                    return;
                }
                let stream = PeerStream {
                    source: &source,
                    generation,
                    requests: &requests,
                    events: &events,
                };
                if stream.relay(deliveries, &mut credits).await == Relay::MergeGone {
                    return;
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

/// Opens a consume stream of the source's queue on its node's own dispatcher,
/// with one credit; `requests` feeds `outgoing`, the stream's requests.
async fn open(
    source: &PeerSource,
    channel: Channel,
    requests: &mpsc::UnboundedSender<v1::ConsumeRequest>,
    outgoing: mpsc::UnboundedReceiver<v1::ConsumeRequest>,
) -> Result<Streaming<PeerConsumeResponse>, Status> {
    let subscribe = v1::ConsumeRequest {
        request: Some(consume_request::Request::Subscribe(v1::Subscribe {
            queue: source.queue.clone(),
            credits: 1,
        })),
    };
    let _ = requests.send(subscribe);
    let mut client = PeerClient::new(channel).max_decoding_message_size(MAX_DELIVERY_BYTES);
    let mut request = tonic::Request::new(UnboundedReceiverStream::new(outgoing));
    request
        .metadata_mut()
        .insert(STREAM_OWNER_METADATA, stream_owner_metadata(&source.owner));
    let opened = tokio::time::timeout(OPEN_TIMEOUT, client.consume(request))
        .await
        .unwrap_or_else(|_| Err(Status::deadline_exceeded("no answer")))?;
    Ok(opened.into_inner())
}

/// How relaying a peer stream ended.
#[derive(Debug, PartialEq, Eq)]
enum Relay {
    /// The stream ended or broke: open it again.
    StreamEnded,
    /// The merge is gone: stop.
    MergeGone,
}

/// One open stream to a peer, as the relay uses it.
struct PeerStream<'a> {
    source: &'a PeerSource,
    /// Which stream of the source this is; credits meant for another are dropped.
    generation: u64,
    requests: &'a mpsc::UnboundedSender<v1::ConsumeRequest>,
    events: &'a mpsc::UnboundedSender<PeerEvent>,
}

impl PeerStream<'_> {
    /// Passes deliveries and backlog reports to the merge and its credits
    /// to the peer until either side ends.
    async fn relay(
        &self,
        mut deliveries: Streaming<PeerConsumeResponse>,
        credits: &mut mpsc::UnboundedReceiver<(u64, SourceRequest)>,
    ) -> Relay {
        loop {
            tokio::select! {
                change = credits.recv() => {
                    let Some((meant_for, change)) = change else {
                        return Relay::MergeGone;
                    };
                    if meant_for == self.generation {
                        match change {
                            SourceRequest::Credit(change) => self.send_credit(change),
                            SourceRequest::TenantShares(shares) => {
                                let _ = self.requests.send(convert::tenant_shares_to_wire(&shares));
                            }
                        }
                    }
                }
                message = deliveries.message() => match message {
                    Ok(Some(PeerConsumeResponse { response: Some(response) })) => {
                        let event = match response {
                            peer_consume_response::Response::Delivery(delivery) => {
                                PeerEvent::Delivery(self.source.index, self.generation, delivery)
                            }
                            peer_consume_response::Response::Backlog(backlog) => PeerEvent::Backlog(
                                self.source.index,
                                self.generation,
                                convert::backlog_from_wire(backlog),
                            ),
                            peer_consume_response::Response::Settled(_) => continue,
                        };
                        if self.events.send(event).is_err() {
                            return Relay::MergeGone;
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => return Relay::StreamEnded,
                    Err(status) => {
                        tracing::debug!(node = self.source.node, %status, "peer consume stream broke");
                        return Relay::StreamEnded;
                    }
                },
            }
        }
    }

    fn send_credit(&self, change: CreditChange) {
        let (credits, set) = match change {
            CreditChange::Add(credits) => (credits, false),
            CreditChange::Set(credits) => (credits, true),
        };
        let credit = v1::ConsumeRequest {
            request: Some(consume_request::Request::Credit(v1::Credit {
                credits,
                set,
            })),
        };
        let _ = self.requests.send(credit);
    }
}
