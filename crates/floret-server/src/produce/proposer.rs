//! Folds concurrent operations for one shard into one raft entry.
//!
//! openraft 0.9 flushes once per entry within a group, so throughput comes
//! from operations per entry. Each shard has a proposer task: it takes the
//! first waiting operation, waits for one of `proposals_in_flight` slots, and
//! meanwhile more operations queue up; then it composes one entry from them
//! (up to `max_entry_ops` / `max_entry_bytes`). Under load entries fill by
//! themselves; an idle shard adds no linger to a lone produce. While
//! another entry is in flight, a part-filled one waits for its commit and
//! keeps filling (`EntryLanes::leaves_now`): calls that trickle in go in
//! fewer, fuller entries, and only full ones are pipelined.
//!
//! Waiting operations are kept in one line per producer (`lanes.rs`): an
//! entry takes settles first, then the producers in turn, so a flood of
//! calls from one producer does not delay another's produce by more than an
//! entry, and a producer past its bound of waiting calls is refused
//! ([`ProposeError::ProducerQueueFull`]), as is one holding its share
//! when all lines together hold the shard's bound of bytes
//! ([`ProposeError::ShardQueueFull`]). An operation whose callers all
//! went away before its entry was composed is not proposed. Plain produces
//! (no idempotency sequence) of one producer waiting in its line are
//! folded into one operation, each caller answered with its own sequences.
//!
//! An operation's commit timeout runs from the moment it is proposed here,
//! not from when its entry leaves: without a majority, the calls queued
//! behind the entries in flight are answered UNAVAILABLE when their own
//! time is up, and those still waiting are then never proposed.
//!
//! While the node hands a shard's leadership back to its preferred replica,
//! the shard's proposer is paused: new operations fail at once with
//! [`ProposeError::HandingOver`] (clients retry), because any append would
//! renew the followers' leader lease and block the hand-over's election.
//!
//! IMPLEMENTATION CAVEATS
//! - A lost leadership fails every op of the entry with NotLeader; the client
//!   retries with its idempotency sequence.
//! - Folded produces share the first call's commit time (`enqueued_at_ms`)
//!   and the producer's limits are checked on the folded operation: near
//!   its `max_messages`, every folded call is refused where some alone
//!   would have fitted (each is told to retry).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floret_cluster::ShardGroup;
use floret_store::{DelayedEnqueue, NodeId, Op, OpReply, ShardId};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use super::lanes::{EntryLanes, Lane, LaneFull, LaneLimits};
use commit::{commit, not_committed};

mod commit;
use crate::config::BatchingConfig;

/// Why an operation was not committed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// This node does not lead the shard (anymore); the outcome is not applied.
    #[error("this node does not lead shard {shard}{}", leader.map(|l| format!(" (node {l} does)")).unwrap_or_default())]
    NotLeader {
        /// The shard.
        shard: ShardId,
        /// The leader, when known.
        leader: Option<NodeId>,
    },
    /// The leadership is being handed to the shard's preferred replica; nothing was proposed.
    #[error("shard {shard} is handing its leadership to its preferred replica")]
    HandingOver {
        /// The shard.
        shard: ShardId,
    },
    /// The producer has as many produce calls waiting here as it may; nothing was proposed.
    #[error(
        "producer {producer:?} has {calls} produce calls ({bytes} bytes) waiting for shard {shard} on this node, as many as it may; nothing was stored, retry later (other producers are not held back)"
    )]
    ProducerQueueFull {
        /// The shard.
        shard: ShardId,
        /// The producer.
        producer: String,
        /// Its calls waiting.
        calls: usize,
        /// Their bytes.
        bytes: usize,
    },
    /// The shard's lines hold their bound, and the producer at least its
    /// share of it; nothing was proposed.
    #[error(
        "shard {shard} has {waiting} bytes of produce calls waiting on this node (batching.max_queued_bytes_per_shard), and producer {producer:?} holds {bytes} of them, at least its share; nothing was stored, retry later (producers under their share are still accepted)"
    )]
    ShardQueueFull {
        /// The shard.
        shard: ShardId,
        /// The producer.
        producer: String,
        /// Its bytes waiting.
        bytes: usize,
        /// Bytes waiting from every producer.
        waiting: usize,
    },
    /// The raft group stopped or failed; the outcome is unknown.
    #[error("shard {shard} cannot commit: {reason}")]
    Unavailable {
        /// The shard.
        shard: ShardId,
        /// What failed.
        reason: String,
    },
}

pub(super) type Reply = oneshot::Sender<Result<OpReply, ProposeError>>;

struct Proposal {
    op: Op,
    bytes: usize,
    /// Who waits for the outcome: the caller, or the callers whose plain
    /// produces were folded into `op`, in order, each with its message count.
    callers: Vec<(Reply, u64)>,
}

/// Handle to one shard's proposer task.
#[derive(Clone)]
pub struct ShardProposer {
    shard: ShardId,
    /// How long a caller waits for its operation, queueing included.
    commit_timeout: Duration,
    proposals: mpsc::UnboundedSender<(Lane, Proposal)>,
    paused_until: Arc<Mutex<Option<Instant>>>,
    /// One permit per entry that may be in flight; an entry holds one
    /// until it is committed.
    slots: Arc<Semaphore>,
    slot_count: u32,
}

/// The proposers of the shards this node holds.
#[derive(Clone, Default)]
pub struct Proposers(Arc<BTreeMap<ShardId, ShardProposer>>);

impl Proposers {
    /// Proposers by shard.
    pub fn new(proposers: BTreeMap<ShardId, ShardProposer>) -> Self {
        Self(Arc::new(proposers))
    }

    /// The proposer of `shard`, if this node holds a replica of it.
    pub fn get(&self, shard: ShardId) -> Option<&ShardProposer> {
        self.0.get(&shard)
    }
}

impl ShardProposer {
    /// Starts the proposer task of `shard`, proposing to whichever group
    /// of the shard `group` holds at the time (a retired replica's group
    /// is replaced by a fresh one).
    pub fn spawn(
        shard: ShardId,
        group: watch::Receiver<Arc<ShardGroup>>,
        batching: BatchingConfig,
    ) -> Self {
        let (proposals, pending) = mpsc::unbounded_channel();
        let commit_timeout = Duration::from_millis(batching.commit_timeout_ms);
        let slot_count = u32::try_from(batching.proposals_in_flight).unwrap_or(u32::MAX);
        let slots = Arc::new(Semaphore::new(slot_count as usize));
        tokio::spawn(run(shard, group, batching, pending, slots.clone()));
        Self {
            shard,
            commit_timeout,
            proposals,
            paused_until: Arc::default(),
            slots,
            slot_count,
        }
    }

    /// Waits until none of this proposer's entries is in flight, and keeps
    /// any more from leaving while the permit is held: the shard's raft log
    /// stops growing here. Operations already queued wait (their callers
    /// time out and retry); new ones are refused only while paused.
    pub async fn hold_every_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots
            .clone()
            .acquire_many_owned(self.slot_count)
            .await
            .ok()
    }

    /// Refuses new operations for `pause` (or until [`Self::resume`]).
    pub fn pause(&self, pause: Duration) {
        *self.paused_until.lock().expect("pause lock") = Some(Instant::now() + pause);
    }

    /// Takes operations again.
    pub fn resume(&self) {
        *self.paused_until.lock().expect("pause lock") = None;
    }

    fn paused(&self) -> bool {
        self.paused_until
            .lock()
            .expect("pause lock")
            .is_some_and(|until| Instant::now() < until)
    }

    /// Proposes `op` and waits for it to be committed and applied, for at
    /// most the commit timeout; an operation still queued then is dropped.
    pub async fn propose(&self, op: Op) -> Result<OpReply, ProposeError> {
        if self.paused() {
            return Err(ProposeError::HandingOver { shard: self.shard });
        }
        let (reply, replied) = oneshot::channel();
        let bytes = op_bytes(&op);
        let lane = lane_of(&op);
        let messages = match &op {
            Op::Enqueue(enqueue) => enqueue.messages.len() as u64,
            _ => 0,
        };
        let callers = vec![(reply, messages)];
        self.proposals
            .send((lane, Proposal { op, bytes, callers }))
            .map_err(|_| self.stopped())?;
        match tokio::time::timeout(self.commit_timeout, replied).await {
            Ok(answer) => answer.map_err(|_| self.stopped())?,
            Err(_) => Err(not_committed(self.shard, self.commit_timeout)),
        }
    }

    fn stopped(&self) -> ProposeError {
        ProposeError::Unavailable {
            shard: self.shard,
            reason: "the node is shutting down".into(),
        }
    }
}

/// Produces wait in their producer's line; everything else settles or governs.
fn lane_of(op: &Op) -> Lane {
    match op {
        Op::Enqueue(enqueue) | Op::EnqueueDelayed(DelayedEnqueue { enqueue, .. }) => {
            Lane::Producer {
                queue: enqueue.queue.clone(),
                producer: enqueue.producer.clone(),
            }
        }
        Op::Remove(_)
        | Op::SetPolicy(_)
        | Op::SetSink(_)
        | Op::ForgetIdle(_)
        | Op::Discard(_)
        | Op::ReplayDeadLetters(_)
        | Op::DeleteDeadLetters(_) => Lane::Settle,
    }
}

fn op_bytes(op: &Op) -> usize {
    match op {
        Op::Enqueue(enqueue) | Op::EnqueueDelayed(DelayedEnqueue { enqueue, .. }) => {
            enqueue.messages.iter().map(|m| m.payload.len() + 64).sum()
        }
        Op::Remove(messages) => messages.len() * 64,
        Op::SetPolicy(_) | Op::SetSink(_) => 128,
        Op::ForgetIdle(idle) => idle.len() * 64,
        Op::Discard(discard) => discard.messages.len() * 96,
        Op::ReplayDeadLetters(selection) | Op::DeleteDeadLetters(selection) => {
            selection.ids.len() * 16
        }
    }
}

async fn run(
    shard: ShardId,
    group: watch::Receiver<Arc<ShardGroup>>,
    batching: BatchingConfig,
    mut pending: mpsc::UnboundedReceiver<(Lane, Proposal)>,
    slots: Arc<Semaphore>,
) {
    let commit_timeout = Duration::from_millis(batching.commit_timeout_ms);
    let limits = LaneLimits {
        entry_ops: batching.max_entry_ops,
        entry_bytes: batching.max_entry_bytes,
        producer_calls: batching.max_queued_calls_per_producer,
        producer_bytes: batching.max_queued_bytes_per_producer,
        shard_bytes: batching.max_queued_bytes_per_shard,
    };
    let mut lanes = EntryLanes::new(limits, abandoned);
    let in_flight = Arc::new(EntriesInFlight::default());
    let mut closed = false;
    loop {
        if lanes.is_empty() {
            let Some(first) = pending.recv().await else {
                break;
            };
            queue(shard, &mut lanes, first);
        }
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        while let Ok(next) = pending.try_recv() {
            queue(shard, &mut lanes, next);
        }
        while !closed && !lanes.leaves_now(in_flight.count()) {
            tokio::select! {
                next = pending.recv() => match next {
                    Some(next) => queue(shard, &mut lanes, next),
                    None => closed = true,
                },
                () = in_flight.one_done.notified() => {}
            }
            while let Ok(next) = pending.try_recv() {
                queue(shard, &mut lanes, next);
            }
        }
        let entry = lanes.next_entry();
        if entry.is_empty() {
            if closed {
                break;
            }
            continue;
        }
        metrics::histogram!("floret_entry_ops").record(entry.len() as f64);
        let entry_in_flight = in_flight.proposed();
        let raft = group.borrow().raft.clone();
        tokio::spawn(async move {
            commit(shard, raft, entry, commit_timeout, slot).await;
            drop(entry_in_flight);
        });
    }
}

/// How many of a shard's entries are proposed and not yet committed (or
/// failed), and a wake-up for the proposer each time one is.
#[derive(Default)]
struct EntriesInFlight {
    entries: AtomicUsize,
    one_done: Notify,
}

impl EntriesInFlight {
    fn count(&self) -> usize {
        self.entries.load(Ordering::Acquire)
    }

    /// Counts one more entry until the returned guard is dropped (its
    /// commit task ended, however it ended).
    fn proposed(self: &Arc<Self>) -> EntryInFlight {
        self.entries.fetch_add(1, Ordering::AcqRel);
        EntryInFlight(self.clone())
    }
}

/// One entry counted in [`EntriesInFlight`] until dropped.
struct EntryInFlight(Arc<EntriesInFlight>);

impl Drop for EntryInFlight {
    fn drop(&mut self) {
        self.0.entries.fetch_sub(1, Ordering::AcqRel);
        self.0.one_done.notify_one();
    }
}

/// Puts `proposal` in its line, or refuses it when its producer's line is full.
fn queue(shard: ShardId, lanes: &mut EntryLanes<Proposal>, (lane, proposal): (Lane, Proposal)) {
    let bytes = proposal.bytes;
    if let Err((refused, full)) = lanes.push(lane, proposal, bytes, fold) {
        metrics::counter!("floret_produce_queue_full_total").increment(1);
        let producer = match &refused.op {
            Op::Enqueue(enqueue) | Op::EnqueueDelayed(DelayedEnqueue { enqueue, .. }) => {
                enqueue.producer.clone()
            }
            _ => String::new(),
        };
        let LaneFull {
            calls,
            bytes,
            shard_bytes,
        } = full;
        let error = match shard_bytes {
            None => ProposeError::ProducerQueueFull {
                shard,
                producer,
                calls,
                bytes,
            },
            Some(waiting) => ProposeError::ShardQueueFull {
                shard,
                producer,
                bytes,
                waiting,
            },
        };
        for (reply, _) in refused.callers {
            let _caller_gone = reply.send(Err(error.clone()));
        }
    }
}

/// Whether every caller of `proposal` has gone away.
fn abandoned(proposal: &Proposal) -> bool {
    proposal.callers.iter().all(|(reply, _)| reply.is_closed())
}

/// Folds `next` into `waiting` when both are plain produces (no
/// idempotency sequence, no delay) of the producer whose line they wait in:
/// one operation, whose sequences are handed out to the callers in order.
/// An idempotent produce is never folded: its sequence is checked alone.
/// Hands `next` back when it does not fold.
fn fold(waiting: &mut Proposal, next: Proposal) -> Option<Proposal> {
    let Op::Enqueue(into) = &mut waiting.op else {
        return Some(next);
    };
    match next.op {
        Op::Enqueue(from)
            if into.producer_sequence.is_none() && from.producer_sequence.is_none() =>
        {
            debug_assert!(into.queue == from.queue && into.producer == from.producer);
            into.messages.extend(from.messages);
            waiting.callers.extend(next.callers);
            None
        }
        op => Some(Proposal { op, ..next }),
    }
}
