//! Properties of the dispatch book over random sequences of events:
//! produces on two shards, consumers coming and going, credits, acks, nacks,
//! lease expiries and leadership lost and regained.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use floret_store::ShardId;
use proptest::prelude::*;

use super::Harness;
use crate::deliver::{ConsumerId, SettleKind};
use crate::delivery_id::DeliveryId;

const QUEUE: &str = "q";
const SHARDS: usize = 2;
const PRODUCERS: [&str; 3] = ["a", "b", "c"];

#[derive(Debug, Clone)]
enum Event {
    Produce { producer: usize, count: u64 },
    Subscribe { credits: u32 },
    Credit { consumer: usize, credits: u32 },
    Ack { delivery: usize },
    Nack { delivery: usize },
    Gone { consumer: usize },
    Advance { seconds: u64 },
    Leadership { shard: ShardId, leader: bool },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => (0..PRODUCERS.len(), 1..4u64)
            .prop_map(|(producer, count)| Event::Produce { producer, count }),
        1 => (0..4u32).prop_map(|credits| Event::Subscribe { credits }),
        2 => (0..4usize, 1..4u32).prop_map(|(consumer, credits)| Event::Credit { consumer, credits }),
        3 => (0..16usize).prop_map(|delivery| Event::Ack { delivery }),
        1 => (0..16usize).prop_map(|delivery| Event::Nack { delivery }),
        1 => (0..4usize).prop_map(|consumer| Event::Gone { consumer }),
        1 => (0..40u64).prop_map(|seconds| Event::Advance { seconds }),
        1 => (0..SHARDS as ShardId, any::<bool>())
            .prop_map(|(shard, leader)| Event::Leadership { shard, leader }),
    ]
}

/// The harness and what the test saw: consumers, their credits and deliveries.
struct Model {
    harness: Harness,
    consumers: Vec<ConsumerId>,
    /// Credits granted to each consumer, and deliveries it received.
    granted: BTreeMap<ConsumerId, u64>,
    received: BTreeMap<ConsumerId, u64>,
    /// Deliveries received and not yet settled by the test, oldest first.
    outstanding: Vec<DeliveryId>,
    produced: u64,
}

impl Model {
    fn new() -> Self {
        let mut harness = Harness::new(SHARDS);
        for shard in 0..SHARDS as ShardId {
            harness.leadership(shard, true);
        }
        Self {
            harness,
            consumers: Vec::new(),
            granted: BTreeMap::new(),
            received: BTreeMap::new(),
            outstanding: Vec::new(),
            produced: 0,
        }
    }

    fn apply(&mut self, event: Event) {
        let harness = &mut self.harness;
        match event {
            Event::Produce { producer, count } => {
                let shard = (producer % SHARDS) as ShardId;
                harness.produce(shard, QUEUE, PRODUCERS[producer], count, None);
                self.produced += count;
            }
            Event::Subscribe { credits } => {
                let id = harness.subscribe(QUEUE, credits);
                self.consumers.push(id);
                self.granted.insert(id, u64::from(credits));
            }
            Event::Credit { consumer, credits } => {
                if let Some(&id) = self.consumers.get(consumer) {
                    harness.credit(id, credits, false);
                    *self.granted.entry(id).or_default() += u64::from(credits);
                }
            }
            Event::Ack { delivery } | Event::Nack { delivery }
                if delivery < self.outstanding.len() =>
            {
                let id = self.outstanding.remove(delivery);
                let kind = match event {
                    Event::Ack { .. } => SettleKind::Ack,
                    _ => SettleKind::Nack,
                };
                harness.settle(kind, &id, true);
            }
            Event::Ack { .. } | Event::Nack { .. } => {}
            Event::Gone { consumer } => {
                if consumer < self.consumers.len() {
                    let id = self.consumers.remove(consumer);
                    harness.gone(id);
                }
            }
            Event::Advance { seconds } => harness.advance(Duration::from_secs(seconds)),
            Event::Leadership { shard, leader } => harness.leadership(shard, leader),
        }
        self.record_deliveries();
    }

    fn record_deliveries(&mut self) {
        for (consumer, id) in self.harness.take_deliveries() {
            *self.received.entry(consumer).or_default() += 1;
            self.outstanding.push(id);
        }
    }

    /// A consumer never received more deliveries than the credits it was granted.
    fn check_credits(&self) -> Result<(), TestCaseError> {
        for (consumer, &received) in &self.received {
            let granted = self.granted.get(consumer).copied().unwrap_or(0);
            prop_assert!(
                received <= granted,
                "consumer {consumer} received {received} deliveries on {granted} credits"
            );
        }
        Ok(())
    }

    /// No message is leased to two consumers at once, and the book's two
    /// records of who holds what agree.
    fn check_leases(&self) -> Result<(), TestCaseError> {
        let book = &self.harness.book;
        let mut leased = HashSet::new();
        for queue in book.queues.values() {
            for (lease, holder) in &queue.holders {
                let message = (lease.producer.clone(), lease.sequence);
                prop_assert!(leased.insert(message), "{lease:?} is leased twice");
                let consumer = book.consumers.get(&holder.consumer);
                prop_assert!(
                    consumer.is_some_and(|c| c.held.contains(lease)),
                    "holder {} of {lease:?} does not know it holds it",
                    holder.consumer
                );
            }
        }
        let held: usize = book.consumers.values().map(|c| c.held.len()).sum();
        prop_assert_eq!(held, leased.len(), "consumers hold leases nobody recorded");
        Ok(())
    }

    /// Leads every shard again, lets every lease lapse, and acks everything
    /// a fresh consumer receives: every message produced must come out.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for shard in 0..SHARDS as ShardId {
            self.harness.leadership(shard, true);
        }
        for id in std::mem::take(&mut self.consumers) {
            self.harness.gone(id);
        }
        self.harness.advance(Duration::from_secs(31));
        self.harness.take_deliveries();
        let drainer = self.harness.subscribe(QUEUE, 0);
        let mut acked = HashSet::new();
        for _ in 0..=self.produced {
            self.harness.credit(drainer, 8, false);
            let deliveries = self.harness.take_deliveries();
            if deliveries.is_empty() {
                break;
            }
            for (_, id) in deliveries {
                self.harness.settle(SettleKind::Ack, &id, true);
                prop_assert!(
                    acked.insert((id.producer.clone(), id.sequence)),
                    "{id:?} came twice"
                );
            }
        }
        let stranded = self.harness.stored_count();
        prop_assert_eq!(stranded, 0, "{} messages were stranded", stranded);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn deliveries_respect_credits_leases_and_lose_nothing(
        events in proptest::collection::vec(event(), 1..60)
    ) {
        let mut model = Model::new();
        for event in events {
            model.apply(event);
            model.check_credits()?;
            model.check_leases()?;
        }
        model.drain()?;
    }
}
