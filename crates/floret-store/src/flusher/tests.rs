//! The flusher thread against a fake log: when waiters are completed, and with what.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use super::*;

/// A log whose syncs wait for a release and can be made to fail.
struct FakeLog {
    bytes: AtomicU64,
    syncs: AtomicUsize,
    release: Mutex<mpsc::Receiver<()>>,
    fail: bool,
}

impl SyncTarget for Arc<FakeLog> {
    fn sync(&self) -> io::Result<()> {
        self.release.lock().unwrap().recv().ok();
        self.syncs.fetch_add(1, Ordering::SeqCst);
        if self.fail {
            Err(io::Error::other("disk gone"))
        } else {
            Ok(())
        }
    }

    fn bytes_written(&self) -> u64 {
        self.bytes.load(Ordering::SeqCst)
    }
}

fn fake_log(fail: bool) -> (Arc<FakeLog>, mpsc::Sender<()>) {
    let (release, released) = mpsc::channel();
    let log = Arc::new(FakeLog {
        bytes: AtomicU64::new(0),
        syncs: AtomicUsize::new(0),
        release: Mutex::new(released),
        fail,
    });
    (log, release)
}

/// Registers a waiter that reports its result on the returned channel.
fn wait_for_sync(flusher: &Flusher) -> mpsc::Receiver<io::Result<()>> {
    let (done, results) = mpsc::channel();
    flusher.after_next_sync(Box::new(move |result| done.send(result).unwrap()));
    results
}

#[test]
fn waiter_is_completed_only_after_the_sync_returns() {
    let (log, release) = fake_log(false);
    let (flusher, thread) = Flusher::start(log.clone()).unwrap();
    log.bytes.store(100, Ordering::SeqCst);
    let result = wait_for_sync(&flusher);
    assert!(
        result.recv_timeout(Duration::from_millis(50)).is_err(),
        "completed while the sync was still running"
    );
    release.send(()).unwrap();
    result
        .recv_timeout(Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(log.syncs.load(Ordering::SeqCst), 1);
    drop(release);
    flusher.stop();
    thread.join().unwrap();
}

#[test]
fn failed_sync_reaches_every_waiter() {
    let (log, release) = fake_log(true);
    let (flusher, thread) = Flusher::start(log.clone()).unwrap();
    let first = wait_for_sync(&flusher);
    let second = wait_for_sync(&flusher);
    drop(release);
    for result in [first, second] {
        let error = result.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(error.is_err(), "a waiter was told its data is durable");
    }
    flusher.stop();
    thread.join().unwrap();
}

#[test]
fn stop_syncs_what_is_pending_before_the_thread_ends() {
    let (log, release) = fake_log(false);
    drop(release);
    let (flusher, thread) = Flusher::start(log.clone()).unwrap();
    let result = wait_for_sync(&flusher);
    flusher.stop();
    thread.join().unwrap();
    result.recv().unwrap().unwrap();
    let late = wait_for_sync(&flusher);
    assert!(
        late.recv().unwrap().is_err(),
        "a waiter after the stop was told its data is durable"
    );
}
