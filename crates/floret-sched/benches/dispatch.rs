//! Dispatch decisions per second: floret's deficit round robin against the
//! naive round robin the idea came from, with every producer backlogged.
//!
//! Two measurements per producer count:
//! - `decide`: [`Scheduler::next`] alone, the decision "whose message goes
//!   out now", over producers whose backlogs outlast the measurement. The
//!   leases it grants are acked outside the timed part after every
//!   [`DECISIONS_PER_CHUNK`] decisions, so in-flight stays as bounded as a
//!   consumer's credits keep it.
//! - `steady_state`: one produce, one decision and one ack per iteration (the
//!   producer that was served gets one more message), the work a node does per
//!   message once every queue is backlogged. The naive baseline runs this loop
//!   too: its produce scans the whole producer deque (`contains`) before
//!   appending, as in the Java write-up, so it grows linearly with producers.
//!
//! The naive baseline lives here only; it is a yardstick, not an alternative.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::collections::{HashMap, VecDeque};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use floret_sched::{Dispatch, Scheduler, SchedulerConfig};

/// Messages each producer keeps backlogged: enough that no producer drains
/// during a measurement, few enough that the set-up stays quick.
const BACKLOG_PER_PRODUCER: u64 = 4;

/// Producer counts for floret's scheduler, from a few tenants to a million.
const FLORET_PRODUCERS: [usize; 5] = [10, 1_000, 10_000, 100_000, 1_000_000];

/// Decisions timed between two untimed rounds of acks in `decide`: about
/// what a busy consumer holds in flight.
const DECISIONS_PER_CHUNK: usize = 1_024;

/// Producer counts for the naive baseline; beyond 10,000 one of its produces
/// takes longer than a measurement is worth.
const NAIVE_PRODUCERS: [usize; 3] = [10, 1_000, 10_000];

/// Producer keys as the server holds them: shared strings, cloned per dispatch.
fn producer_keys(count: usize) -> Vec<Arc<str>> {
    (0..count)
        .map(|index| Arc::from(format!("tenant-{index:07}")))
        .collect()
}

/// Messages each producer has ready in `decide`: more than any measurement
/// dispatches (a backlog is a range, so its length costs nothing).
const ENDLESS_BACKLOG: u64 = 1 << 40;

/// A scheduler in which each of `count` producers has `backlog` messages
/// ready.
fn backlogged_scheduler(count: usize, backlog: u64) -> Scheduler<Arc<str>> {
    let mut scheduler = Scheduler::new(SchedulerConfig {
        default_weight: 1,
        lease_timeout: Duration::from_secs(30),
    });
    for key in producer_keys(count) {
        scheduler.enqueued(&key, 0..backlog);
    }
    scheduler
}

/// Settles a decision and gives its producer one more message, so the
/// backlog stays the same size.
fn settle_and_top_up(scheduler: &mut Scheduler<Arc<str>>, dispatch: &Dispatch<Arc<str>>) {
    scheduler
        .ack(&dispatch.producer, dispatch.sequence, dispatch.attempt)
        .expect("the dispatch was just leased");
    let next = dispatch.sequence + BACKLOG_PER_PRODUCER;
    scheduler.enqueued(&dispatch.producer, next..next + 1);
}

/// The naive round robin: a deque of producer ids with a linear membership
/// check on every produce, and a FIFO of sequences per producer.
struct NaiveRoundRobin {
    turn_order: VecDeque<Arc<str>>,
    queues: HashMap<Arc<str>, VecDeque<u64>>,
}

impl NaiveRoundRobin {
    fn backlogged(count: usize) -> Self {
        let mut naive = Self {
            turn_order: VecDeque::new(),
            queues: HashMap::new(),
        };
        for key in producer_keys(count) {
            for sequence in 0..BACKLOG_PER_PRODUCER {
                naive.produce(&key, sequence);
            }
        }
        naive
    }

    fn produce(&mut self, producer: &Arc<str>, sequence: u64) {
        self.queues
            .entry(producer.clone())
            .or_default()
            .push_back(sequence);
        if !self.turn_order.contains(producer) {
            self.turn_order.push_back(producer.clone());
        }
    }

    fn dispatch(&mut self) -> Option<(Arc<str>, u64)> {
        let producer = self.turn_order.pop_front()?;
        let queue = self.queues.get_mut(&producer)?;
        let sequence = queue.pop_front()?;
        if !queue.is_empty() {
            self.turn_order.push_back(producer.clone());
        }
        Some((producer, sequence))
    }
}

/// Times `iterations` decisions of `scheduler`, acking them outside the
/// timed part every [`DECISIONS_PER_CHUNK`].
fn time_decisions<T: Clone + Eq + std::hash::Hash>(
    scheduler: &mut Scheduler<Arc<str>, T>,
    start: Instant,
    clock: &mut u64,
    iterations: u64,
) -> Duration {
    let mut timed = Duration::ZERO;
    let mut decided = Vec::with_capacity(DECISIONS_PER_CHUNK);
    let mut remaining = iterations;
    while remaining > 0 {
        let chunk = remaining.min(DECISIONS_PER_CHUNK as u64);
        remaining -= chunk;
        let timer = Instant::now();
        for _ in 0..chunk {
            *clock += 1;
            let now = start + Duration::from_nanos(*clock);
            decided.push(black_box(scheduler.next(now).expect("backlogged")));
        }
        timed += timer.elapsed();
        for dispatch in decided.drain(..) {
            scheduler
                .ack(&dispatch.producer, dispatch.sequence, dispatch.attempt)
                .expect("the dispatch was just leased");
        }
    }
    timed
}

fn decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    group.throughput(Throughput::Elements(1));
    for count in FLORET_PRODUCERS {
        let mut scheduler = backlogged_scheduler(count, ENDLESS_BACKLOG);
        let start = Instant::now();
        let mut clock = 0u64;
        group.bench_with_input(BenchmarkId::new("floret", count), &count, |b, _| {
            b.iter_custom(|iterations| {
                time_decisions(&mut scheduler, start, &mut clock, iterations)
            });
        });
    }
    group.finish();
}

/// Tenants of the two-level measurement: a hundred producers each at a
/// million producers.
const TENANTS: usize = 10_000;

/// The tenant of a producer `tenant/producer`, as the server takes it.
fn tenant_of(producer: &Arc<str>) -> String {
    producer
        .split_once('/')
        .map_or_else(String::new, |(tenant, _)| tenant.to_owned())
}

/// `decide` with producers spread over [`TENANTS`] tenants: deficit round
/// robin over tenants, then over each tenant's producers.
fn decide_two_level(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide_two_level");
    group.throughput(Throughput::Elements(1));
    for count in [10_000, 1_000_000] {
        let mut scheduler = Scheduler::with_tenants(
            SchedulerConfig {
                default_weight: 1,
                lease_timeout: Duration::from_secs(30),
            },
            tenant_of,
        );
        for index in 0..count {
            let key: Arc<str> = Arc::from(format!("t{:05}/p{index:07}", index % TENANTS));
            scheduler.enqueued(&key, 0..ENDLESS_BACKLOG);
        }
        let start = Instant::now();
        let mut clock = 0u64;
        group.bench_with_input(BenchmarkId::new("floret", count), &count, |b, _| {
            b.iter_custom(|iterations| {
                time_decisions(&mut scheduler, start, &mut clock, iterations)
            });
        });
    }
    group.finish();
}

fn steady_state(c: &mut Criterion) {
    let mut group = c.benchmark_group("steady_state");
    group.throughput(Throughput::Elements(1));
    for count in FLORET_PRODUCERS {
        let mut scheduler = backlogged_scheduler(count, BACKLOG_PER_PRODUCER);
        let start = Instant::now();
        let mut clock = 0u64;
        group.bench_with_input(BenchmarkId::new("floret", count), &count, |b, _| {
            b.iter(|| {
                clock += 1;
                let now = start + Duration::from_nanos(clock);
                let dispatch = scheduler.next(now).expect("backlogged");
                settle_and_top_up(&mut scheduler, &dispatch);
                black_box(dispatch.sequence)
            });
        });
    }
    for count in NAIVE_PRODUCERS {
        let mut naive = NaiveRoundRobin::backlogged(count);
        group.bench_with_input(BenchmarkId::new("naive", count), &count, |b, _| {
            b.iter(|| {
                let (producer, sequence) = naive.dispatch().expect("backlogged");
                naive.produce(&producer, sequence + BACKLOG_PER_PRODUCER);
                black_box(sequence)
            });
        });
    }
    group.finish();
}

criterion_group!(benches, decide, decide_two_level, steady_state);
criterion_main!(benches);
