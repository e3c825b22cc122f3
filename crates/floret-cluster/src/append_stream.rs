//! The append-entries stream to one peer: the append-entries calls of every
//! shard to that node share one long-lived gRPC stream
//! (`Peer.AppendEntriesStream`), and [`batched`] sends whatever queued up
//! while the stream was busy as one message, on both sides.
//!
//! With a unary call per append, each shard's appends and heartbeats cost an
//! HTTP/2 stream, headers, a task and several wake-ups on both nodes; with 16
//! shards that per-call work was a large part of a node's CPU at one message
//! per produce. Answers come back as each shard finishes, matched to their
//! calls by id, so a shard waiting on its disk holds up no other.
//!
//! The stream is opened by the first call and again by the first call after
//! it broke. A break fails every call waiting on it; openraft takes that as
//! the peer being unreachable and retries.
//!
//! IMPLEMENTATION CAVEATS
//! - A call that times out leaves the stream open. A connection that hangs
//!   without closing is noticed by HTTP/2 keep-alive, as for unary calls on
//!   the same channel.
//! - Votes and snapshot chunks still travel as unary calls: they are rare.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use floret_proto::peer::v1::peer_client::PeerClient;
use floret_proto::peer::v1::raft_answer::Outcome;
use floret_proto::peer::v1::{RaftCall, RaftCalls};
use floret_store::{NodeId, ShardId};
use futures::Stream;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

/// A batch stops taking more messages once it holds this many payload bytes
/// (so it is at most this plus one message).
const BATCH_TARGET_BYTES: usize = 4 * 1024 * 1024;

/// The stream of the messages `queued` yields, those already waiting when
/// one is taken sent along with it as one batch built by `wrap`.
///
/// The queue is unbounded: what goes in is bounded by its producers (openraft
/// keeps one append in flight per shard and peer; a node answers only what
/// it was asked).
pub fn batched<T, B>(
    mut queued: mpsc::UnboundedReceiver<T>,
    payload_bytes: fn(&T) -> usize,
    wrap: fn(Vec<T>) -> B,
) -> impl Stream<Item = B> + Send + 'static
where
    T: Send + 'static,
    B: Send + 'static,
{
    futures::stream::poll_fn(move |cx| {
        queued.poll_recv(cx).map(|first| {
            first.map(|first| {
                let mut bytes = payload_bytes(&first);
                let mut batch = vec![first];
                while bytes < BATCH_TARGET_BYTES {
                    let Ok(next) = queued.try_recv() else { break };
                    bytes += payload_bytes(&next);
                    batch.push(next);
                }
                wrap(batch)
            })
        })
    })
}

/// Calls waiting for their answers on one stream.
#[derive(Default)]
struct Waiting {
    /// The stream ended: nothing more will be answered on it.
    broken: bool,
    answers: HashMap<u64, oneshot::Sender<Outcome>>,
}

/// One opened stream: where calls are queued and who waits for answers.
struct Link {
    calls: mpsc::UnboundedSender<RaftCall>,
    waiting: Arc<Mutex<Waiting>>,
}

fn lock(waiting: &Mutex<Waiting>) -> MutexGuard<'_, Waiting> {
    waiting
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The append-entries calls of every shard to one peer.
pub struct AppendStream {
    target: NodeId,
    client: PeerClient<Channel>,
    link: Mutex<Option<Link>>,
    next_call_id: AtomicU64,
}

impl std::fmt::Debug for AppendStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppendStream")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl AppendStream {
    /// The stream to `target`, opened on the first call.
    pub fn new(target: NodeId, client: PeerClient<Channel>) -> Self {
        Self {
            target,
            client,
            link: Mutex::new(None),
            next_call_id: AtomicU64::new(0),
        }
    }

    /// Sends `shard`'s encoded append-entries request and waits at most
    /// `timeout` for the encoded result. `Err` says why nothing usable came
    /// back (the peer refused the call, the stream broke, the time ran out).
    pub async fn call(
        &self,
        shard: ShardId,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, String> {
        let call_id = self.next_call_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        let call = RaftCall {
            call_id,
            shard_id: shard,
            payload,
        };
        let waiting = self.send(call, answer)?;
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(Outcome::Payload(payload))) => Ok(payload),
            Ok(Ok(Outcome::Refused(why))) => Err(why),
            Ok(Err(_)) => Err("the append stream broke".into()),
            Err(_) => {
                lock(&waiting).answers.remove(&call_id);
                Err(format!("no answer within {timeout:?}"))
            }
        }
    }

    /// Queues `call` on the open stream, opening one if there is none or it
    /// broke, and returns who waits on that stream.
    fn send(
        &self,
        call: RaftCall,
        answer: oneshot::Sender<Outcome>,
    ) -> Result<Arc<Mutex<Waiting>>, String> {
        let mut link = self.link.lock().unwrap_or_else(|p| p.into_inner());
        if link.as_ref().is_none_or(|open| lock(&open.waiting).broken) {
            *link = Some(self.open());
        }
        let open = link.as_ref().expect("a link was just opened");
        let mut waiting = lock(&open.waiting);
        let call_id = call.call_id;
        waiting.answers.insert(call_id, answer);
        if open.calls.send(call).is_err() {
            waiting.answers.remove(&call_id);
            return Err("the append stream broke".into());
        }
        Ok(open.waiting.clone())
    }

    fn open(&self) -> Link {
        let (calls, queued) = mpsc::unbounded_channel();
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        tokio::spawn(carry(
            self.target,
            self.client.clone(),
            queued,
            waiting.clone(),
        ));
        Link { calls, waiting }
    }
}

/// Runs one stream: sends the queued calls, hands each answer to its caller,
/// and when the stream ends fails whoever still waits.
async fn carry(
    target: NodeId,
    mut client: PeerClient<Channel>,
    queued: mpsc::UnboundedReceiver<RaftCall>,
    waiting: Arc<Mutex<Waiting>>,
) {
    let outgoing = batched(
        queued,
        |call| call.payload.len(),
        |calls| RaftCalls { calls },
    );
    let why = match client.append_entries_stream(outgoing).await {
        Err(status) => status.to_string(),
        Ok(response) => {
            let mut answers = response.into_inner();
            loop {
                match answers.message().await {
                    Ok(Some(batch)) => {
                        let mut waiting = lock(&waiting);
                        for answer in batch.answers {
                            if let (Some(caller), Some(outcome)) =
                                (waiting.answers.remove(&answer.call_id), answer.outcome)
                            {
                                let _gone = caller.send(outcome);
                            }
                        }
                    }
                    Ok(None) => break "closed by the peer".to_owned(),
                    Err(status) => break status.to_string(),
                }
            }
        }
    };
    tracing::debug!(target, %why, "append stream ended");
    let mut waiting = lock(&waiting);
    waiting.broken = true;
    waiting.answers.clear();
}
