//! Group commit for the whole node: one OS thread makes the raft log
//! durable for every pending append of every shard with one sync call.
//!
//! openraft 0.9 waits for each append's flush within a group, so the only way
//! to amortise the sync is across groups (and across the produces folded into
//! each entry). A waiter is completed only after the sync returned; a failed
//! sync completes every waiter with the error (an append callback that is
//! never completed would hang its group forever).
//!
//! While other writers are busy, a sync waits up to a couple of
//! milliseconds for a page of their writes to gather (`pacer.rs`); a
//! writer alone is synced at once.

use std::io;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::Instant;

mod pacer;
#[cfg(test)]
mod tests;

use pacer::{Pace, SyncPacer};

/// Called once the data written before it was submitted is durable, or with the error that stopped that.
pub type FlushWaiter = Box<dyn FnOnce(io::Result<()>) + Send>;

/// What the flusher makes durable: the node's raft log.
pub trait SyncTarget: Send + 'static {
    /// Makes every write made before the call durable.
    fn sync(&self) -> io::Result<()>;
    /// Bytes written since it was opened, from which the flusher learns the
    /// write rate and how much a sync would carry.
    fn bytes_written(&self) -> u64;
}

/// Handle to the node's flusher thread; cheap to clone, one per shard store.
#[derive(Clone)]
pub struct Flusher {
    waiters: mpsc::Sender<FlushRequest>,
}

enum FlushRequest {
    Sync(FlushWaiter),
    /// Sync what is pending, then end the thread (so the database lock is released).
    Stop,
}

impl Flusher {
    /// Starts the flusher thread around `target`. The thread ends when every
    /// handle is dropped or [`Flusher::stop`] is called.
    pub fn start(target: impl SyncTarget) -> io::Result<(Self, thread::JoinHandle<()>)> {
        let (waiters, pending) = mpsc::channel::<FlushRequest>();
        let thread = thread::Builder::new()
            .name("floret-flusher".into())
            .spawn(move || run_flusher(target, pending))?;
        Ok((Self { waiters }, thread))
    }

    /// Runs `waiter` after the next sync that covers everything written before this call.
    pub fn after_next_sync(&self, waiter: FlushWaiter) {
        if let Err(mpsc::SendError(FlushRequest::Sync(waiter))) =
            self.waiters.send(FlushRequest::Sync(waiter))
        {
            waiter(Err(io::Error::other("the flusher thread has stopped")));
        }
    }

    /// Asks the thread to sync what is pending and end; later waiters get an error.
    pub fn stop(&self) {
        let _already_stopped = self.waiters.send(FlushRequest::Stop);
    }

    /// Waits until everything written before this call is durable.
    pub async fn sync(&self) -> io::Result<()> {
        let (done, synced) = tokio::sync::oneshot::channel();
        self.after_next_sync(Box::new(move |result| {
            let _receiver_gone = done.send(result);
        }));
        synced
            .await
            .unwrap_or_else(|_| Err(io::Error::other("the flusher thread has stopped")))
    }
}

/// The flusher thread: gathers waiters, syncs when the pacer says so, and
/// completes them.
fn run_flusher(target: impl SyncTarget, pending: mpsc::Receiver<FlushRequest>) {
    let mut pacer = SyncPacer::default();
    let mut stopping = false;
    while !stopping {
        let Ok(first) = pending.recv() else { break };
        let first_waiter_at = Instant::now();
        let mut batch = Vec::new();
        let mut take = |request: FlushRequest, stopping: &mut bool| match request {
            FlushRequest::Sync(waiter) => batch.push(waiter),
            FlushRequest::Stop => *stopping = true,
        };
        take(first, &mut stopping);
        while !stopping {
            pending
                .try_iter()
                .for_each(|request| take(request, &mut stopping));
            if stopping {
                break;
            }
            let now = Instant::now();
            match pacer.pace(now, first_waiter_at, target.bytes_written()) {
                Pace::SyncNow => break,
                Pace::WaitUntil(until) => {
                    match pending.recv_timeout(until.saturating_duration_since(now)) {
                        Ok(request) => take(request, &mut stopping),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => stopping = true,
                    }
                }
            }
        }
        pacer.syncing(Instant::now(), target.bytes_written());
        let sync_started = Instant::now();
        let result = target.sync();
        metrics::histogram!("floret_store_sync_seconds")
            .record(sync_started.elapsed().as_secs_f64());
        pacer.synced(target.bytes_written());
        metrics::counter!("floret_store_syncs_total").increment(1);
        metrics::histogram!("floret_store_sync_waiters").record(batch.len() as f64);
        if let Err(error) = &result {
            tracing::error!(%error, "sync of the raft log failed");
        }
        for waiter in batch {
            waiter(clone_result(&result));
        }
    }
    for request in pending.try_iter() {
        if let FlushRequest::Sync(waiter) = request {
            waiter(Err(io::Error::other(
                "the flusher stopped before this sync",
            )));
        }
    }
}

fn clone_result(result: &io::Result<()>) -> io::Result<()> {
    match result {
        Ok(()) => Ok(()),
        Err(error) => Err(io::Error::new(error.kind(), error.to_string())),
    }
}
