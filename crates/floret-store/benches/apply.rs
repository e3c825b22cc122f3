//! State-machine apply throughput: what one replica's apply costs per
//! message, for enqueue batches of several sizes and for acks (removals);
//! and the per-message cost of policies: an enqueue checked against a limit,
//! one that drops its producer's oldest message, and the policy and
//! delivery-time lookups the dispatcher makes for every dispatch, and the
//! read of the message it dispatches.
//!
//! Each iteration is one `apply` call with one raft entry, through openraft's
//! trait as a replica runs it, on a fresh data dir in the system temp dir.
//! The raft log is not involved (that is one append and one shared sync per
//! entry, see the WAL); this is the sled write every replica does after
//! commit.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use floret_store::policy::{Overflow, Policy};
use floret_store::{
    Command, Database, DelayedEnqueue, Enqueue, MessageRef, NewMessage, Op, SetPolicy,
    StateMachine, TypeConfig,
};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

/// The message size the targets are stated for.
const PAYLOAD_BYTES: usize = 128;

/// Messages per enqueue op: one produce call, a small batch, a large one.
const BATCH_SIZES: [usize; 3] = [1, 100, 1_000];

/// Producers folded into one entry by the proposer in the many-producers case
/// (one message each, the unbatched produce of many tenants).
const PRODUCERS_PER_ENTRY: usize = 100;

/// Messages removed per ack entry.
const ACKS_PER_ENTRY: usize = 100;

/// A state machine on a fresh data dir, with the runtime that drives it.
struct Replica {
    _dir: tempfile::TempDir,
    _database: Database,
    state_machine: StateMachine,
    runtime: tokio::runtime::Runtime,
    next_index: u64,
}

impl Replica {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let database = Database::open(dir.path()).expect("open data dir");
        let state_machine = database.state_machine(0, None).expect("state machine");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        Self {
            _dir: dir,
            _database: database,
            state_machine,
            runtime,
            next_index: 1,
        }
    }

    /// Applies one entry carrying `ops`.
    fn apply(&mut self, ops: Vec<Op>) {
        let entry = Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), self.next_index),
            payload: EntryPayload::Normal(Command { ops }),
        };
        self.next_index += 1;
        self.runtime
            .block_on(self.state_machine.apply([entry]))
            .expect("apply");
    }
}

fn enqueue(producer: String, messages: usize) -> Op {
    Op::Enqueue(Enqueue {
        queue: "default".into(),
        producer,
        producer_sequence: None,
        enqueued_at_ms: 1_700_000_000_000,
        messages: (0..messages)
            .map(|_| NewMessage {
                payload: vec![b'x'; PAYLOAD_BYTES],
                headers: BTreeMap::new(),
            })
            .collect(),
    })
}

fn apply_enqueue(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply_enqueue");
    for batch in BATCH_SIZES {
        let mut replica = Replica::new();
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_with_input(BenchmarkId::new("one_producer", batch), &batch, |b, _| {
            b.iter_batched(
                || vec![enqueue("tenant".into(), batch)],
                |ops| replica.apply(ops),
                criterion::BatchSize::SmallInput,
            );
        });
    }
    let mut replica = Replica::new();
    group.throughput(Throughput::Elements(PRODUCERS_PER_ENTRY as u64));
    group.bench_function(
        BenchmarkId::new("many_producers", PRODUCERS_PER_ENTRY),
        |b| {
            b.iter_batched(
                || {
                    (0..PRODUCERS_PER_ENTRY)
                        .map(|producer| enqueue(format!("tenant-{producer}"), 1))
                        .collect()
                },
                |ops| replica.apply(ops),
                criterion::BatchSize::SmallInput,
            );
        },
    );
    group.finish();
}

fn set_policy(producer: Option<String>, policy: Policy) -> Op {
    Op::SetPolicy(SetPolicy {
        queue: "default".into(),
        producer,
        policy,
        replace: true,
    })
}

/// Enqueues of one message under a limit: checked and never reached, and
/// reached with `drop_oldest` (every enqueue deletes the oldest message).
fn apply_enqueue_with_limits(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply_enqueue_with_limits");
    group.throughput(Throughput::Elements(1));
    let limits = [
        ("under_limit", u64::MAX, Overflow::Reject),
        ("drop_oldest_at_limit", 100, Overflow::DropOldest),
    ];
    for (name, max_messages, overflow) in limits {
        let mut replica = Replica::new();
        replica.apply(vec![set_policy(
            None,
            Policy {
                max_messages: Some(max_messages),
                overflow: Some(overflow),
                ..Policy::default()
            },
        )]);
        replica.apply(vec![enqueue("tenant".into(), 100)]);
        group.bench_function(BenchmarkId::new(name, 1), |b| {
            b.iter_batched(
                || vec![enqueue("tenant".into(), 1)],
                |ops| replica.apply(ops),
                criterion::BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

/// What the dispatcher asks a shard for every message it dispatches: the
/// producer's policy in force and whether the message is delayed; on a
/// shard without policies or delayed messages, and on one with 1,000
/// producer overrides and 1,000 delayed messages.
fn dispatch_lookups(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatch_lookups");
    group.throughput(Throughput::Elements(1));
    let empty = Replica::new();
    let mut governed = Replica::new();
    governed.apply(vec![set_policy(
        None,
        Policy {
            max_attempts: Some(5),
            ..Policy::default()
        },
    )]);
    governed.apply(
        (0..1_000)
            .map(|producer| {
                set_policy(
                    Some(format!("tenant-{producer}")),
                    Policy {
                        weight: Some(2),
                        ..Policy::default()
                    },
                )
            })
            .collect(),
    );
    let Op::Enqueue(delayed) = enqueue("delayed".into(), 1_000) else {
        unreachable!("enqueue builds an Enqueue")
    };
    governed.apply(vec![Op::EnqueueDelayed(DelayedEnqueue {
        enqueue: delayed,
        deliver_at_ms: 1_800_000_000_000,
    })]);
    for (name, replica) in [("no_policies", &empty), ("1000_overrides", &governed)] {
        let reader = replica.state_machine.reader();
        group.bench_function(BenchmarkId::new("policy", name), |b| {
            b.iter(|| reader.policy("default", std::hint::black_box("tenant-7")));
        });
        group.bench_function(BenchmarkId::new("deliver_at", name), |b| {
            b.iter(|| reader.deliver_at("default", std::hint::black_box("tenant-7"), 3));
        });
    }
    group.finish();
}

fn apply_ack(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply_ack");
    let mut replica = Replica::new();
    let mut next_sequence = 0u64;
    group.throughput(Throughput::Elements(ACKS_PER_ENTRY as u64));
    group.bench_function(BenchmarkId::new("one_producer", ACKS_PER_ENTRY), |b| {
        b.iter_custom(|iterations| {
            let mut timed = Duration::ZERO;
            for _ in 0..iterations {
                replica.apply(vec![enqueue("tenant".into(), ACKS_PER_ENTRY)]);
                let removals = (next_sequence..next_sequence + ACKS_PER_ENTRY as u64)
                    .map(|sequence| MessageRef {
                        queue: "default".into(),
                        producer: "tenant".into(),
                        sequence,
                    })
                    .collect();
                next_sequence += ACKS_PER_ENTRY as u64;
                let timer = Instant::now();
                replica.apply(vec![Op::Remove(removals)]);
                timed += timer.elapsed();
            }
            timed
        });
    });
    group.bench_function(
        BenchmarkId::new("one_each_of_producers", ACKS_PER_ENTRY),
        |b| {
            b.iter_custom(|iterations| {
                let mut replica = Replica::new();
                let producers: Vec<String> = (0..ACKS_PER_ENTRY)
                    .map(|producer| format!("tenant-{producer}"))
                    .collect();
                for _ in 0..iterations.div_ceil(100) {
                    for producer in &producers {
                        replica.apply(vec![enqueue(producer.clone(), 100)]);
                    }
                }
                let mut timed = Duration::ZERO;
                for sequence in 0..iterations {
                    let removals = producers
                        .iter()
                        .map(|producer| MessageRef {
                            queue: "default".into(),
                            producer: producer.clone(),
                            sequence,
                        })
                        .collect();
                    let timer = Instant::now();
                    replica.apply(vec![Op::Remove(removals)]);
                    timed += timer.elapsed();
                }
                timed
            });
        },
    );
    group.finish();
}

/// Reading the message a dispatch decision named, from a producer whose
/// backlog came in produce calls of 100 messages: what the dispatcher does
/// for every message it hands out.
fn dispatch_read(c: &mut Criterion) {
    const BACKLOG: u64 = 10_000;
    let mut group = c.benchmark_group("dispatch_read");
    group.throughput(Throughput::Elements(1));
    let mut replica = Replica::new();
    for _ in 0..BACKLOG / 100 {
        replica.apply(vec![enqueue("tenant".into(), 100)]);
    }
    let reader = replica.state_machine.reader();
    let mut sequence = 0;
    group.bench_function("message", |b| {
        b.iter(|| {
            sequence = (sequence + 37) % BACKLOG;
            reader
                .message("default", "tenant", std::hint::black_box(sequence))
                .expect("read")
                .expect("stored")
        });
    });
    group.finish();
}

criterion_group!(
    benches,
    apply_enqueue,
    apply_ack,
    apply_enqueue_with_limits,
    dispatch_lookups,
    dispatch_read
);
criterion_main!(benches);
