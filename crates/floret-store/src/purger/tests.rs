//! The purger's turns, over a fake node whose state-machine sync waits
//! for the test to let it finish.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::{CommittedLeaderId, LogId as RaftLogId};

use super::*;

const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Done {
    Synced,
    SyncFailed,
    Purged(ShardId, u64),
}

/// A node whose syncs each wait for one `()` on `finish_sync`.
struct FakeNode {
    done: Arc<Mutex<Vec<Done>>>,
    sync_began: mpsc::Sender<()>,
    finish_sync: Mutex<mpsc::Receiver<bool>>,
}

impl PurgeTarget for FakeNode {
    fn sync_state_machines(&self) -> io::Result<()> {
        let _test_gone = self.sync_began.send(());
        let succeeds = self.finish_sync.lock().unwrap().recv().unwrap_or(false);
        let mut done = self.done.lock().unwrap();
        if succeeds {
            done.push(Done::Synced);
            Ok(())
        } else {
            done.push(Done::SyncFailed);
            Err(io::Error::other("disk gone"))
        }
    }

    fn purge_log(&self, shard: ShardId, upto: LogId) -> io::Result<()> {
        self.done
            .lock()
            .unwrap()
            .push(Done::Purged(shard, upto.index));
        Ok(())
    }
}

struct Harness {
    purger: Purger,
    thread: thread::JoinHandle<()>,
    done: Arc<Mutex<Vec<Done>>>,
    sync_began: mpsc::Receiver<()>,
    finish_sync: mpsc::Sender<bool>,
}

impl Harness {
    fn start() -> Self {
        let done = Arc::default();
        let (began, sync_began) = mpsc::channel();
        let (finish_sync, finish) = mpsc::channel();
        let (purger, thread) = Purger::start(FakeNode {
            done: Arc::clone(&done),
            sync_began: began,
            finish_sync: Mutex::new(finish),
        })
        .unwrap();
        Self {
            purger,
            thread,
            done,
            sync_began,
            finish_sync,
        }
    }

    fn wait_for_a_sync_to_begin(&self) {
        self.sync_began
            .recv_timeout(DEADLINE)
            .expect("a sync began within the deadline");
    }

    async fn settled(&self) {
        tokio::time::timeout(DEADLINE, self.purger.settled())
            .await
            .expect("the purger settled within the deadline");
    }

    fn done(&self) -> Vec<Done> {
        self.done.lock().unwrap().clone()
    }

    fn stop(self) {
        self.purger.stop();
        drop(self.finish_sync);
        self.thread.join().unwrap();
    }
}

fn log_id(index: u64) -> LogId {
    RaftLogId::new(CommittedLeaderId::new(1, 1), index)
}

#[tokio::test]
async fn purge_returns_while_the_state_machines_are_still_syncing() {
    let harness = Harness::start();
    harness.purger.purge(0, log_id(5));
    harness.wait_for_a_sync_to_begin();
    assert_eq!(harness.done(), [], "the caller did not wait for the sync");
    harness.finish_sync.send(true).unwrap();
    harness.settled().await;
    assert_eq!(harness.done(), [Done::Synced, Done::Purged(0, 5)]);
    harness.stop();
}

#[tokio::test]
async fn purges_waiting_together_share_one_sync_and_keep_the_furthest() {
    let harness = Harness::start();
    harness.purger.purge(0, log_id(5));
    harness.wait_for_a_sync_to_begin();
    harness.purger.purge(0, log_id(7));
    harness.purger.purge(1, log_id(3));
    harness.purger.purge(0, log_id(9));
    harness.finish_sync.send(true).unwrap();
    harness.finish_sync.send(true).unwrap();
    harness.settled().await;
    assert_eq!(
        harness.done(),
        [
            Done::Synced,
            Done::Purged(0, 5),
            Done::Synced,
            Done::Purged(0, 9),
            Done::Purged(1, 3),
        ]
    );
    harness.stop();
}

#[tokio::test]
async fn failed_sync_purges_nothing_and_the_next_purge_covers_it() {
    let harness = Harness::start();
    harness.purger.purge(2, log_id(4));
    harness.finish_sync.send(false).unwrap();
    harness.settled().await;
    assert_eq!(harness.done(), [Done::SyncFailed]);
    harness.purger.purge(2, log_id(8));
    harness.finish_sync.send(true).unwrap();
    harness.settled().await;
    assert_eq!(
        harness.done(),
        [Done::SyncFailed, Done::Synced, Done::Purged(2, 8)]
    );
    harness.stop();
}

#[tokio::test]
async fn purge_waited_for_reports_a_failed_sync() {
    let harness = Harness::start();
    harness.finish_sync.send(false).unwrap();
    let failed = tokio::time::timeout(DEADLINE, harness.purger.purge_and_wait(1, log_id(3)))
        .await
        .unwrap();
    assert!(failed.unwrap_err().to_string().contains("disk gone"));
    harness.finish_sync.send(true).unwrap();
    tokio::time::timeout(DEADLINE, harness.purger.purge_and_wait(1, log_id(4)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        harness.done(),
        [Done::SyncFailed, Done::Synced, Done::Purged(1, 4)]
    );
    harness.stop();
}
