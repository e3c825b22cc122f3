//! Property tests of the scheduler against a model of what it owes each
//! producer: fair shares while everyone is backlogged, per-producer order,
//! redelivery of every handed-back message, and nothing left behind.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use floret_sched::{ProducerPolicy, Scheduler, SchedulerConfig, SettleError};
use proptest::prelude::*;

const TIMEOUT: Duration = Duration::from_secs(10);
const PRODUCERS: u8 = 4;

fn scheduler() -> Scheduler<u8> {
    Scheduler::new(SchedulerConfig {
        default_weight: 1,
        lease_timeout: TIMEOUT,
    })
}

/// Checks that in every window of the dispatch log each producer's count is
/// within its weight of `window * weight / total weight`.
fn assert_within_one_quantum(log: &[usize], weights: &[u32]) {
    let total = u64::from(weights.iter().sum::<u32>());
    for start in 0..log.len() {
        let mut counts = vec![0u64; weights.len()];
        for (length, &producer) in (1u64..).zip(&log[start..]) {
            counts[producer] += 1;
            for (index, (&count, &weight)) in counts.iter().zip(weights).enumerate() {
                let weight = u64::from(weight);
                let deviation = (count * total).abs_diff(length * weight);
                assert!(
                    deviation <= weight * total,
                    "producer {index} (weight {weight}) got {count} of {length} \
                     dispatches from {start}; weights {weights:?}, log {log:?}",
                );
            }
        }
    }
}

proptest! {
    #[test]
    fn backlogged_tenants_get_their_weighted_share_whatever_their_producer_counts(
        tenant_weights in prop::collection::vec(1u32..=4, 2..=4),
        producers_per_tenant in prop::collection::vec(1u8..=8, 4),
        dispatches in 1usize..200,
    ) {
        // Producer `16 * tenant + index` belongs to `tenant`.
        let mut scheduler = Scheduler::with_tenants(
            SchedulerConfig {
                default_weight: 1,
                lease_timeout: TIMEOUT,
            },
            |producer: &u8| *producer / 16,
        );
        let now = Instant::now();
        for (tenant, &weight) in (0u8..).zip(&tenant_weights) {
            scheduler.set_tenant_weight(&tenant, Some(weight));
            for index in 0..producers_per_tenant[usize::from(tenant)] {
                scheduler.enqueued(&(16 * tenant + index), 0..1_000);
            }
        }
        let log: Vec<usize> = (0..dispatches)
            .map(|_| usize::from(scheduler.next(now).expect("all backlogged").producer / 16))
            .collect();
        assert_within_one_quantum(&log, &tenant_weights);
    }

    #[test]
    fn backlogged_producers_get_their_weighted_share_in_every_round(
        weights in prop::collection::vec(1u32..=4, 2..=5),
        backlog in prop::collection::vec(1u64..=30, 5),
        steps in prop::collection::vec((0usize..5, 0u64..=6, 1usize..=8), 1..40),
    ) {
        let mut scheduler = scheduler();
        let now = Instant::now();
        let mut tails: Vec<u64> = backlog[..weights.len()].to_vec();
        for (producer, (&weight, &tail)) in (0u8..).zip(weights.iter().zip(&tails)) {
            scheduler.set_policy(&producer, Some(weighted(weight)));
            scheduler.enqueued(&producer, 0..tail);
        }
        let mut log = Vec::new();
        'run: for (arrival, batch, dispatches) in steps {
            let arrival = arrival % weights.len();
            scheduler.enqueued(&(arrival as u8), tails[arrival]..tails[arrival] + batch);
            tails[arrival] += batch;
            for _ in 0..dispatches {
                let dispatch = scheduler.next(now).expect("backlogged producers have messages");
                log.push(usize::from(dispatch.producer));
                // A producer that ran dry left the ring, and its share with it.
                let all_backlogged = (0..weights.len() as u8)
                    .all(|producer| scheduler.producer(&producer).is_some_and(|view| view.ready > 0));
                if !all_backlogged {
                    break 'run;
                }
            }
        }
        assert_within_one_quantum(&log, &weights);
    }
}

/// One step of a random history.
#[derive(Debug, Clone)]
enum Op {
    /// A batch is committed: `len` sequences starting `gap` past the last
    /// announced end, or `overlap` before it when the producer has a slot.
    Enqueue {
        producer: u8,
        gap: u64,
        overlap: u64,
        len: u64,
    },
    /// Up to this many dispatches.
    Next(usize),
    /// Ack the n-th outstanding lease (modulo their number).
    Ack(usize),
    /// Nack the n-th outstanding lease.
    Nack(usize),
    /// Advance the clock by this many seconds and expire.
    Expire(u64),
    /// Ack something that is not leased: must be refused.
    StrayAck {
        producer: u8,
        sequence: u64,
        attempt: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..PRODUCERS, 0u64..3, 0u64..4, 1u64..6)
            .prop_map(|(producer, gap, overlap, len)| Op::Enqueue { producer, gap, overlap, len }),
        3 => (1usize..6).prop_map(Op::Next),
        2 => any::<usize>().prop_map(Op::Ack),
        1 => any::<usize>().prop_map(Op::Nack),
        1 => (0u64..=12).prop_map(Op::Expire),
        1 => (0..PRODUCERS, 0u64..30, 1u32..4)
            .prop_map(|(producer, sequence, attempt)| Op::StrayAck { producer, sequence, attempt }),
    ]
}

/// A leased message as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease {
    producer: u8,
    sequence: u64,
    attempt: u32,
    deadline: Instant,
}

/// What the scheduler owes each producer.
struct Model {
    now: Instant,
    /// One past the highest sequence announced, per producer.
    announced: Vec<u64>,
    /// Sequences owed a first delivery, in announcement order, per producer.
    expected_first: Vec<Vec<u64>>,
    /// First deliveries seen, per producer.
    delivered_first: Vec<Vec<u64>>,
    /// Handed-back messages and the attempt their redelivery must carry.
    owed: HashMap<(u8, u64), u32>,
    leases: Vec<Lease>,
}

impl Model {
    fn new() -> Self {
        Self {
            now: Instant::now(),
            announced: vec![0; PRODUCERS.into()],
            expected_first: vec![Vec::new(); PRODUCERS.into()],
            delivered_first: vec![Vec::new(); PRODUCERS.into()],
            owed: HashMap::new(),
            leases: Vec::new(),
        }
    }

    fn ready(&self, producer: u8) -> u64 {
        let index = usize::from(producer);
        let first = self.expected_first[index].len() - self.delivered_first[index].len();
        let owed = self
            .owed
            .keys()
            .filter(|(owner, _)| *owner == producer)
            .count();
        (first + owed) as u64
    }

    fn in_flight(&self, producer: u8) -> u64 {
        self.leases
            .iter()
            .filter(|lease| lease.producer == producer)
            .count() as u64
    }

    fn enqueue(
        &mut self,
        scheduler: &mut Scheduler<u8>,
        producer: u8,
        gap: u64,
        overlap: u64,
        len: u64,
    ) {
        let index = usize::from(producer);
        let last = self.announced[index];
        let start = if overlap > 0 && scheduler.producer(&producer).is_some() {
            last.saturating_sub(overlap)
        } else {
            last + gap
        };
        let end = start + len;
        scheduler.enqueued(&producer, start..end);
        self.expected_first[index].extend(start.max(last)..end);
        self.announced[index] = last.max(end);
    }

    /// Dispatches once; false when the scheduler had nothing.
    fn next(&mut self, scheduler: &mut Scheduler<u8>) -> bool {
        let Some(dispatch) = scheduler.next(self.now) else {
            assert!((0..PRODUCERS).all(|producer| self.ready(producer) == 0));
            return false;
        };
        let (producer, sequence, attempt) =
            (dispatch.producer, dispatch.sequence, dispatch.attempt);
        let index = usize::from(producer);
        if attempt == 1 {
            assert!(
                !self.owed.keys().any(|(owner, _)| *owner == producer),
                "producer {producer} got a first delivery before its redeliveries",
            );
            let position = self.delivered_first[index].len();
            assert_eq!(
                Some(&sequence),
                self.expected_first[index].get(position),
                "producer {producer}: first deliveries out of order",
            );
            self.delivered_first[index].push(sequence);
        } else {
            assert_eq!(
                self.owed.remove(&(producer, sequence)),
                Some(attempt),
                "producer {producer} sequence {sequence}: unexpected redelivery",
            );
        }
        self.leases.push(Lease {
            producer,
            sequence,
            attempt,
            deadline: self.now + TIMEOUT,
        });
        true
    }

    fn ack(&mut self, scheduler: &mut Scheduler<u8>, pick: usize) {
        if self.leases.is_empty() {
            return;
        }
        let lease = self.leases.swap_remove(pick % self.leases.len());
        assert_eq!(
            scheduler.ack(&lease.producer, lease.sequence, lease.attempt),
            Ok(())
        );
        assert_eq!(
            scheduler.ack(&lease.producer, lease.sequence, lease.attempt),
            Err(SettleError::NotLeased),
        );
    }

    fn nack(&mut self, scheduler: &mut Scheduler<u8>, pick: usize) {
        if self.leases.is_empty() {
            return;
        }
        let lease = self.leases.swap_remove(pick % self.leases.len());
        assert_eq!(
            scheduler.nack(&lease.producer, lease.sequence, lease.attempt),
            Ok(())
        );
        self.owed
            .insert((lease.producer, lease.sequence), lease.attempt + 1);
    }

    fn expire(&mut self, scheduler: &mut Scheduler<u8>, seconds: u64) {
        self.now += Duration::from_secs(seconds);
        let now = self.now;
        let (expired, live): (Vec<Lease>, Vec<Lease>) = std::mem::take(&mut self.leases)
            .into_iter()
            .partition(|lease| lease.deadline <= now);
        self.leases = live;
        for lease in &expired {
            self.owed
                .insert((lease.producer, lease.sequence), lease.attempt + 1);
        }
        assert_eq!(scheduler.expire(self.now), expired.len());
    }

    fn stray_ack(&self, scheduler: &mut Scheduler<u8>, producer: u8, sequence: u64, attempt: u32) {
        let leased = self.leases.iter().any(|lease| {
            (lease.producer, lease.sequence, lease.attempt) == (producer, sequence, attempt)
        });
        if !leased {
            assert_eq!(
                scheduler.ack(&producer, sequence, attempt),
                Err(SettleError::NotLeased)
            );
        }
    }

    /// Counters and per-producer views agree with the model.
    fn check(&self, scheduler: &Scheduler<u8>) {
        let mut backlogged = 0;
        for producer in 0..PRODUCERS {
            let (ready, in_flight) = (self.ready(producer), self.in_flight(producer));
            backlogged += usize::from(ready > 0);
            match scheduler.producer(&producer) {
                None => assert_eq!(
                    (ready, in_flight),
                    (0, 0),
                    "producer {producer} lost its slot"
                ),
                Some(view) => {
                    assert_eq!(
                        (view.ready, view.in_flight),
                        (ready, in_flight),
                        "producer {producer}"
                    );
                    assert!(
                        ready + in_flight > 0,
                        "idle producer {producer} kept a slot"
                    );
                }
            }
        }
        assert_eq!(scheduler.backlogged_producers(), backlogged);
        assert_eq!(scheduler.backlogged_weight(), backlogged as u64);
        assert_eq!(scheduler.in_flight(), self.leases.len() as u64);
        let earliest = self.leases.iter().map(|lease| lease.deadline).min();
        assert_eq!(scheduler.next_deadline(), earliest);
        let ready: u64 = (0..PRODUCERS).map(|producer| self.ready(producer)).sum();
        assert_eq!(scheduler.ready_messages(), ready);
    }
}

proptest! {
    #[test]
    fn every_message_is_delivered_in_order_and_redelivered_until_acked(
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut scheduler = scheduler();
        let mut model = Model::new();
        for op in ops {
            match op {
                Op::Enqueue { producer, gap, overlap, len } => {
                    model.enqueue(&mut scheduler, producer, gap, overlap, len);
                }
                Op::Next(count) => {
                    for _ in 0..count {
                        if !model.next(&mut scheduler) {
                            break;
                        }
                    }
                }
                Op::Ack(pick) => model.ack(&mut scheduler, pick),
                Op::Nack(pick) => model.nack(&mut scheduler, pick),
                Op::Expire(seconds) => model.expire(&mut scheduler, seconds),
                Op::StrayAck { producer, sequence, attempt } => {
                    model.stray_ack(&mut scheduler, producer, sequence, attempt);
                }
            }
            model.check(&scheduler);
        }

        while model.next(&mut scheduler) {}
        while !model.leases.is_empty() {
            model.ack(&mut scheduler, 0);
        }
        model.check(&scheduler);

        prop_assert_eq!(&model.delivered_first, &model.expected_first);
        prop_assert!(model.owed.is_empty(), "never redelivered: {:?}", model.owed);
        prop_assert_eq!(scheduler.backlogged_producers(), 0);
        prop_assert_eq!(scheduler.ready_messages(), 0);
        prop_assert_eq!(scheduler.in_flight(), 0);
        prop_assert_eq!(scheduler.next_deadline(), None);
        for producer in 0..PRODUCERS {
            prop_assert_eq!(scheduler.producer(&producer), None);
        }
    }
}

/// An override giving `weight` and the defaults' other settings.
fn weighted(weight: u32) -> ProducerPolicy {
    ProducerPolicy {
        weight,
        ..ProducerPolicy::default()
    }
}
