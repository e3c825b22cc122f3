//! Group commit for the whole node: one OS thread makes the sled database
//! durable for every pending log append of every shard at once.
//!
//! openraft 0.9 waits for each append's flush within a group, so the only way
//! to amortise the fsync is across groups (and across the produces folded
//! into each entry). A waiter is completed only after the data is on disk:
//! sled's `flush()` writes its buffers but on Linux only calls
//! `sync_file_range`, which commits neither the drive's cache nor the file's
//! new size, so the flusher follows it with `fdatasync` of the database file,
//! of every blob file sled wrote for large values, and of the folders that
//! gained entries.
//!
//! IMPLEMENTATION CAVEATS
//! - sled's own `snap.*` recovery hints are not synced: sled rebuilds them from
//!   its log on start.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

/// Called once the data written before it was submitted is durable, or with the error that stopped that.
pub type FlushWaiter = Box<dyn FnOnce(io::Result<()>) + Send>;

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
    /// Starts the flusher thread for `db`, whose files live in `dir`.
    /// The thread ends when every handle is dropped or [`Flusher::stop`] is called.
    pub fn start(db: sled::Db, dir: &Path) -> io::Result<(Self, thread::JoinHandle<()>)> {
        let mut files = DurableFiles::open(dir)?;
        let (waiters, pending) = mpsc::channel::<FlushRequest>();
        let thread = thread::Builder::new()
            .name("floret-flusher".into())
            .spawn(move || {
                let mut stopping = false;
                while !stopping {
                    let Ok(first) = pending.recv() else { break };
                    let mut batch = Vec::new();
                    for request in std::iter::once(first).chain(pending.try_iter()) {
                        match request {
                            FlushRequest::Sync(waiter) => batch.push(waiter),
                            FlushRequest::Stop => stopping = true,
                        }
                    }
                    let result = db
                        .flush()
                        .map(drop)
                        .map_err(io::Error::other)
                        .and_then(|()| files.sync());
                    metrics::counter!("floret_store_syncs_total").increment(1);
                    metrics::histogram!("floret_store_sync_waiters").record(batch.len() as f64);
                    if let Err(error) = &result {
                        tracing::error!(%error, "sync of the database failed");
                    }
                    for waiter in batch {
                        waiter(clone_result(&result));
                    }
                }
            })?;
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

fn clone_result(result: &io::Result<()>) -> io::Result<()> {
    match result {
        Ok(()) => Ok(()),
        Err(error) => Err(io::Error::new(error.kind(), error.to_string())),
    }
}

/// The files of a sled database that must reach the disk before an append is durable.
struct DurableFiles {
    dir: PathBuf,
    db_file: File,
    blobs_dir: PathBuf,
    synced_blobs: HashSet<OsString>,
}

impl DurableFiles {
    fn open(dir: &Path) -> io::Result<Self> {
        let db_file = File::open(dir.join("db"))?;
        File::open(dir)?.sync_all()?;
        Ok(Self {
            dir: dir.to_path_buf(),
            db_file,
            blobs_dir: dir.join("blobs"),
            synced_blobs: HashSet::new(),
        })
    }

    fn sync(&mut self) -> io::Result<()> {
        self.db_file.sync_data()?;
        self.sync_new_blobs()
    }

    /// Blobs hold values too large for a page; sled never syncs them itself.
    fn sync_new_blobs(&mut self) -> io::Result<()> {
        let entries = match std::fs::read_dir(&self.blobs_dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        let mut present = HashSet::new();
        let mut synced_any = false;
        for entry in entries {
            let name = entry?.file_name();
            if !self.synced_blobs.contains(&name) {
                match File::open(self.blobs_dir.join(&name)) {
                    Ok(file) => file.sync_data()?,
                    Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                    Err(error) => return Err(error),
                }
                synced_any = true;
            }
            present.insert(name);
        }
        if synced_any {
            File::open(&self.blobs_dir)?.sync_all()?;
            File::open(&self.dir)?.sync_all()?;
        }
        self.synced_blobs = present;
        Ok(())
    }
}
