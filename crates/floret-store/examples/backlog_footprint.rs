//! What a backlog costs one replica's state machine: applies `ENTRIES`
//! entries of `MESSAGES` 128-byte messages (100 producers taking turns, no
//! acks) to a fresh data dir in the system temp dir, then prints the bytes
//! the process wrote, the database's size on disk, its anonymous resident
//! memory and the apply time.
//!
//! ```sh
//! cargo run --release -p floret-store --example backlog_footprint -- 10000 100 64
//! ```
//!
//! The third argument is sled's cache in MiB (`storage.cache_bytes`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use floret_store::{Command, Database, Enqueue, NewMessage, Op, StoreOptions, TypeConfig};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

/// A field of a `/proc/self` file, in the file's unit.
fn proc_field(file: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/self/{file}")).expect("procfs");
    text.lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .expect("field present")
}

fn argument(position: usize, default: u64) -> u64 {
    std::env::args()
        .nth(position)
        .map_or(default, |value| value.parse().expect("a number"))
}

fn main() {
    let entries = argument(1, 10_000);
    let messages = argument(2, 100) as usize;
    let cache_mib = argument(3, 64);
    let dir = tempfile::tempdir().expect("temp dir");
    let options = StoreOptions {
        cache_bytes: cache_mib << 20,
        ..StoreOptions::default()
    };
    let database = Database::open_with(dir.path(), options).expect("data dir");
    let mut state_machine = database.state_machine(0, None).expect("state machine");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let written_before = proc_field("io", "write_bytes:");
    let resident_before = proc_field("status", "RssAnon:");
    let started = Instant::now();
    for index in 1..=entries {
        let enqueue = Op::Enqueue(Enqueue {
            queue: "default".into(),
            producer: format!("tenant-{}", index % 100),
            producer_sequence: None,
            enqueued_at_ms: 1_700_000_000_000,
            messages: (0..messages)
                .map(|_| NewMessage {
                    payload: vec![b'x'; 128],
                    headers: BTreeMap::new(),
                })
                .collect(),
        });
        let entry = Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Command { ops: vec![enqueue] }),
        };
        runtime
            .block_on(state_machine.apply([entry]))
            .expect("apply");
    }
    let applied_in = started.elapsed();
    runtime.block_on(database.sync()).expect("sync");
    // sled's IO threads finish writing its buffers after the sync returns.
    std::thread::sleep(Duration::from_secs(1));
    let mb = |bytes: u64| bytes as f64 / 1e6;
    println!(
        "{} messages: applied in {applied_in:.2?}, wrote {:.0} MB, {:.0} MB on disk, anonymous RSS +{:.1} MiB",
        entries as usize * messages,
        mb(proc_field("io", "write_bytes:") - written_before),
        mb(database.size_on_disk()),
        (proc_field("status", "RssAnon:") - resident_before) as f64 / 1024.0,
    );
}
