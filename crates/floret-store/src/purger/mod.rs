//! Purging raft log entries a snapshot covers, on the node's purger thread
//! instead of in the shards' raft cores.
//!
//! Before entries are purged the state machines must be durable: after the
//! purge only they (and the snapshot) hold what those entries did. That
//! sync writes out every shard's unwritten changes, which takes hundreds
//! of milliseconds under load, and openraft 0.9 awaits `purge` inside the
//! shard's raft core, where it holds up heartbeats until the followers call
//! an election. So a shard's log store only queues its purge here and
//! returns; this thread makes one state-machine sync for every purge
//! waiting, then purges each shard's log.
//!
//! A purge not done yet costs only disk: openraft reads none of those
//! entries again, and after a crash they are still in the log, where
//! nothing needs them (openraft re-applies from the state machines' last
//! applied id). A purge whose sync fails is dropped with an error logged;
//! the shard's next purge, up to a later entry, covers its entries.
//!
//! A purge of every entry the log holds (a snapshot installed past them,
//! or openraft's clean-up at start) waits for its record: the entries the
//! leader sends next would otherwise follow a hole after a crash.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;

use tokio::sync::oneshot;

use crate::durability::StateMachineDurability;
use crate::types::{LogId, ShardId};
use crate::wal::Wal;

/// What the purger works on: the node's state machines and raft log.
pub(crate) trait PurgeTarget: Send + 'static {
    /// Makes everything applied to the state machines so far durable.
    fn sync_state_machines(&self) -> io::Result<()>;
    /// Drops `shard`'s entries up to `upto`, inclusive, from the raft log.
    fn purge_log(&self, shard: ShardId, upto: LogId) -> io::Result<()>;
}

/// The node's state machines and raft log.
pub(crate) struct NodeStorage {
    pub(crate) state_machines: StateMachineDurability,
    pub(crate) log: Arc<Wal>,
}

impl PurgeTarget for NodeStorage {
    fn sync_state_machines(&self) -> io::Result<()> {
        self.state_machines.sync()
    }

    fn purge_log(&self, shard: ShardId, upto: LogId) -> io::Result<()> {
        self.log.purge(shard, upto)
    }
}

/// Handle to the node's purger thread; cheap to clone, one per shard store.
#[derive(Clone)]
pub(crate) struct Purger {
    requests: mpsc::Sender<PurgeRequest>,
}

/// Where the outcome of one shard's purge goes.
type PurgeDone = oneshot::Sender<Result<(), String>>;

enum PurgeRequest {
    Purge {
        shard: ShardId,
        upto: LogId,
        done: Option<PurgeDone>,
    },
    /// Answered once every purge queued before it is done.
    Settled(oneshot::Sender<()>),
    /// Do what is queued, then end the thread.
    Stop,
}

impl Purger {
    /// Starts the purger thread around `target`. The thread ends when every
    /// handle is dropped or [`Purger::stop`] is called.
    pub(crate) fn start(target: impl PurgeTarget) -> io::Result<(Self, thread::JoinHandle<()>)> {
        let (requests, queued) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("floret-purger".into())
            .spawn(move || run_purger(target, queued))?;
        Ok((Self { requests }, thread))
    }

    /// Queues the purge of `shard`'s entries up to `upto`, inclusive. A
    /// stopped purger drops it: the entries stay in the log.
    pub(crate) fn purge(&self, shard: ShardId, upto: LogId) {
        let _stopped = self.requests.send(PurgeRequest::Purge {
            shard,
            upto,
            done: None,
        });
    }

    /// Purges `shard`'s entries up to `upto` and waits until the purge
    /// record is written, or says why it was not.
    pub(crate) async fn purge_and_wait(&self, shard: ShardId, upto: LogId) -> io::Result<()> {
        let (done, outcome) = oneshot::channel();
        self.requests
            .send(PurgeRequest::Purge {
                shard,
                upto,
                done: Some(done),
            })
            .map_err(|_| io::Error::other("the purger thread has stopped"))?;
        match outcome.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(io::Error::other(why)),
            Err(_) => Err(io::Error::other("the purger thread has stopped")),
        }
    }

    /// Waits until every purge queued before this call is done (or dropped).
    pub(crate) async fn settled(&self) {
        let (settled, answer) = oneshot::channel();
        if self.requests.send(PurgeRequest::Settled(settled)).is_ok() {
            let _stopped = answer.await;
        }
    }

    /// Asks the thread to do what is queued and end.
    pub(crate) fn stop(&self) {
        let _already_stopped = self.requests.send(PurgeRequest::Stop);
    }
}

/// The requests taken together in one turn of the thread.
#[derive(Default)]
struct Turn {
    /// The furthest purge asked of each shard.
    upto: BTreeMap<ShardId, LogId>,
    /// Callers waiting for their shard's purge.
    waiting: Vec<(ShardId, PurgeDone)>,
    settled: Vec<oneshot::Sender<()>>,
    stop: bool,
}

impl Turn {
    fn gather(requests: impl IntoIterator<Item = PurgeRequest>) -> Self {
        let mut turn = Self::default();
        for request in requests {
            match request {
                PurgeRequest::Purge { shard, upto, done } => {
                    let furthest = turn.upto.entry(shard).or_insert(upto);
                    *furthest = (*furthest).max(upto);
                    if let Some(done) = done {
                        turn.waiting.push((shard, done));
                    }
                }
                PurgeRequest::Settled(settled) => turn.settled.push(settled),
                PurgeRequest::Stop => turn.stop = true,
            }
        }
        turn
    }
}

fn run_purger(target: impl PurgeTarget, queued: mpsc::Receiver<PurgeRequest>) {
    while let Ok(first) = queued.recv() {
        let turn = Turn::gather(std::iter::once(first).chain(queued.try_iter()));
        let outcomes = purge(&target, turn.upto);
        for (shard, done) in turn.waiting {
            let outcome = outcomes.get(&shard).cloned().unwrap_or(Ok(()));
            let _caller_gone = done.send(outcome);
        }
        for settled in turn.settled {
            let _caller_gone = settled.send(());
        }
        if turn.stop {
            return;
        }
    }
}

/// Each shard's outcome: its purge record written, or why not.
fn purge(
    target: &impl PurgeTarget,
    upto: BTreeMap<ShardId, LogId>,
) -> BTreeMap<ShardId, Result<(), String>> {
    if upto.is_empty() {
        return BTreeMap::new();
    }
    if let Err(error) = target.sync_state_machines() {
        tracing::error!(
            %error,
            "making the state machines durable before purging the raft log failed; the entries stay"
        );
        let why = format!("making the state machines durable failed: {error}");
        return upto
            .into_keys()
            .map(|shard| (shard, Err(why.clone())))
            .collect();
    }
    upto.into_iter()
        .map(|(shard, upto)| {
            let outcome = target.purge_log(shard, upto).map_err(|error| {
                tracing::error!(shard, %error, "purging the raft log failed; the entries stay");
                error.to_string()
            });
            (shard, outcome)
        })
        .collect()
}

#[cfg(test)]
mod tests;
