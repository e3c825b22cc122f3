//! Storage work that blocks for long (a whole shard tree read or replaced,
//! a snapshot file written and synced, every state machine made durable)
//! runs on tokio's blocking threads, never on a runtime worker; work that
//! may block for long and must finish before its caller goes on (an
//! apply) runs in place of the worker, which hands its other tasks over.
//!
//! openraft runs each shard's state machine and raft core as tasks on the
//! node's runtime. Blocking a worker thread for a second holds up the tasks
//! queued on it too, and the task the blocked one woke last waits in that
//! thread's own slot, which no other thread takes. Under a large backlog a
//! snapshot's capture (842 ms) held its shard's raft core that long: the
//! leader's heartbeats stopped and the followers called an election.

use std::io;

/// Runs `work` on a blocking thread and waits for it. A panic in `work`
/// goes on in the caller; a runtime shutting down meanwhile is an error.
pub(crate) async fn off_the_runtime<R: Send + 'static>(
    work: impl FnOnce() -> R + Send + 'static,
) -> io::Result<R> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => Ok(result),
        Err(error) => match error.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_cancelled) => Err(io::Error::other("the runtime is shutting down")),
        },
    }
}

/// Runs `work`, which may take long, in place: on a multi-threaded
/// runtime the worker first hands its queued tasks (and the one it woke
/// last) to another thread, so they do not wait for `work`. On any other
/// runtime, or none, `work` just runs.
pub fn may_block<R>(work: impl FnOnce() -> R) -> R {
    let flavor = tokio::runtime::Handle::try_current().map(|runtime| runtime.runtime_flavor());
    match flavor {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}
