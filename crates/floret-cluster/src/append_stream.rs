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
//! the peer being unreachable and retries. A call whose caller gave up (it
//! timed out, or openraft dropped it) is emptied where it waits in the
//! queue: it is not sent, and its payload is freed at once, so a slow peer
//! that makes openraft retry does not pile up copies of its appends.
//!
//! IMPLEMENTATION CAVEATS
//! - A call that times out leaves the stream open. A connection that hangs
//!   without closing is noticed by HTTP/2 keep-alive, as for unary calls on
//!   the same channel.
//! - Messages on one stream arrive in order: a large append (up to 4 MiB
//!   while a follower catches up) delays the calls sent after it by its
//!   transfer time (about 30 ms at 1 Gbit/s), far below the election
//!   timeout. Batches are kept small so that only such an append does.
//! - Votes and snapshot chunks still travel as unary calls: they are rare.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use floret_proto::peer::v1::peer_client::PeerClient;
use floret_proto::peer::v1::raft_answer::Outcome;
use floret_proto::peer::v1::{RaftCall, RaftCalls};
use floret_store::{NodeId, ShardId};
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

/// Why an append call brought nothing back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendCallError {
    /// No answer within the call's time: the peer may be slow, not gone.
    TimedOut,
    /// The peer refused the call or the stream broke.
    Failed(String),
}

/// A batch stops taking more messages once it holds this many payload bytes
/// (so it is at most this plus one message).
const BATCH_TARGET_BYTES: usize = 256 * 1024;

/// The stream of the messages `queued` yields, those already waiting when
/// one is taken sent along with it as one batch built by `wrap`.
///
/// The queue is unbounded: what goes in is bounded by its producers. openraft
/// keeps one append in flight per shard and peer, and a call it gives up on
/// is emptied in the queue; a node answers only what it was asked.
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

/// A call waiting in the queue to be sent; emptied by the stream when it
/// sends it, or by its caller when the caller gives up.
type QueuedCall = Arc<Mutex<Option<RaftCall>>>;

/// One opened stream: where calls are queued and who waits for answers.
struct Link {
    calls: mpsc::UnboundedSender<QueuedCall>,
    waiting: Arc<Mutex<Waiting>>,
}

/// Held by a caller while it waits: when it is dropped (answered, timed
/// out, or the caller's future dropped) the call leaves the queue and the
/// waiting list, whichever still holds it.
struct PendingCall {
    call_id: u64,
    queued: QueuedCall,
    waiting: Arc<Mutex<Waiting>>,
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        self.queued.lock().unwrap_or_else(|p| p.into_inner()).take();
        lock(&self.waiting).answers.remove(&self.call_id);
    }
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
    ) -> Result<Vec<u8>, AppendCallError> {
        let call_id = self.next_call_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        let call = RaftCall {
            call_id,
            shard_id: shard,
            payload,
        };
        let _pending = self.send(call, answer).map_err(AppendCallError::Failed)?;
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(Outcome::Payload(payload))) => Ok(payload),
            Ok(Ok(Outcome::Refused(why))) => Err(AppendCallError::Failed(why)),
            Ok(Err(_)) => Err(AppendCallError::Failed("the append stream broke".into())),
            Err(_) => Err(AppendCallError::TimedOut),
        }
    }

    /// Queues `call` on the open stream, opening one if there is none or it
    /// broke. Whether the stream broke is checked, and the caller added to
    /// its waiting list, under one lock, so a stream that ends meanwhile
    /// fails the call at once.
    fn send(
        &self,
        call: RaftCall,
        answer: oneshot::Sender<Outcome>,
    ) -> Result<PendingCall, String> {
        let mut link = self.link.lock().unwrap_or_else(|p| p.into_inner());
        if link.as_ref().is_none_or(|open| lock(&open.waiting).broken) {
            *link = Some(self.open());
        }
        let open = link.as_ref().expect("a link was just opened");
        let mut waiting = lock(&open.waiting);
        if waiting.broken {
            return Err("the append stream broke".into());
        }
        let call_id = call.call_id;
        let queued = Arc::new(Mutex::new(Some(call)));
        if open.calls.send(queued.clone()).is_err() {
            return Err("the append stream broke".into());
        }
        waiting.answers.insert(call_id, answer);
        Ok(PendingCall {
            call_id,
            queued,
            waiting: open.waiting.clone(),
        })
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

fn queued_bytes(queued: &QueuedCall) -> usize {
    queued
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map_or(0, |call| call.payload.len())
}

/// The calls still wanted, taken out of their queue slots.
fn take_calls(queued: Vec<QueuedCall>) -> RaftCalls {
    let calls = queued
        .iter()
        .filter_map(|slot| slot.lock().unwrap_or_else(|p| p.into_inner()).take())
        .collect();
    RaftCalls { calls }
}

/// Runs one stream: sends the queued calls, hands each answer to its caller,
/// and when the stream ends fails whoever still waits.
async fn carry(
    target: NodeId,
    mut client: PeerClient<Channel>,
    queued: mpsc::UnboundedReceiver<QueuedCall>,
    waiting: Arc<Mutex<Waiting>>,
) {
    let outgoing = batched(queued, queued_bytes, take_calls)
        .filter(|batch| std::future::ready(!batch.calls.is_empty()));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn queued_call(call_id: u64, bytes: usize) -> QueuedCall {
        Arc::new(Mutex::new(Some(RaftCall {
            call_id,
            shard_id: 1,
            payload: vec![0; bytes],
        })))
    }

    #[test]
    fn call_given_up_is_still_sent_and_kept_waiting() {
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let (answer, _answered) = oneshot::channel();
        lock(&waiting).answers.insert(7, answer);
        let given_up = queued_call(7, 4096);
        let wanted = queued_call(8, 16);
        drop(PendingCall {
            call_id: 7,
            queued: given_up.clone(),
            waiting: waiting.clone(),
        });
        assert!(lock(&waiting).answers.is_empty());
        assert_eq!(queued_bytes(&given_up), 0, "its payload is still held");
        let sent: Vec<u64> = take_calls(vec![given_up, wanted])
            .calls
            .iter()
            .map(|call| call.call_id)
            .collect();
        assert_eq!(sent, [8]);
    }

    #[tokio::test]
    async fn calls_queued_together_cost_a_message_each() {
        let (queue, queued) = mpsc::unbounded_channel::<Vec<u8>>();
        for bytes in [10, 20, BATCH_TARGET_BYTES, 5] {
            queue.send(vec![0; bytes]).unwrap();
        }
        drop(queue);
        let batches: Vec<Vec<usize>> = batched(queued, Vec::len, |batch| {
            batch.iter().map(Vec::len).collect()
        })
        .collect()
        .await;
        assert_eq!(batches, [vec![10, 20, BATCH_TARGET_BYTES], vec![5]]);
    }
}
