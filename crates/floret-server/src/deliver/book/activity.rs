//! The book's counters per queue, for the Admin service and the load view.

use std::collections::HashMap;

use super::{ConsumerChannel, DispatchBook, Now, ShardContents};
use crate::deliver::{ProducerActivity, QueueActivity};

impl<S: ShardContents, C: ConsumerChannel> DispatchBook<S, C> {
    /// Delivery counters of every queue; with `with_producers`, also each
    /// recently delivered producer's fairness figures (costs O(producers)).
    pub fn activity(&mut self, with_producers: bool, now: Now) -> HashMap<String, QueueActivity> {
        let now_second = now.unix_ms / 1_000;
        let consumers = &self.consumers;
        self.queues
            .iter_mut()
            .map(|(name, queue)| {
                let producers = if with_producers {
                    queue
                        .fairness
                        .figures(now_second)
                        .into_iter()
                        .map(|(key, fairness)| {
                            let view = queue.scheduler.producer(&key);
                            let activity = ProducerActivity {
                                fairness,
                                weight: view.map_or(1, |v| v.weight),
                                deficit: view.map_or(0, |v| v.deficit),
                                ready: view.map_or(0, |v| v.ready),
                            };
                            (key.producer.to_string(), activity)
                        })
                        .collect()
                } else {
                    HashMap::new()
                };
                let mut in_flight_by_producer: HashMap<String, u64> = HashMap::new();
                for lease in queue.holders.keys() {
                    *in_flight_by_producer
                        .entry(lease.producer.producer.to_string())
                        .or_default() += 1;
                }
                let activity = QueueActivity {
                    in_flight: queue.scheduler.in_flight(),
                    ready: queue.scheduler.ready_messages(),
                    backlogged_producers: queue.scheduler.backlogged_producers() as u64,
                    backlogged_weight: queue.scheduler.backlogged_weight(),
                    delivered: queue.delivered,
                    acked: queue.acked,
                    redelivered: queue.redelivered,
                    in_flight_by_producer,
                    consumers: queue
                        .consumers
                        .iter()
                        .filter(|id| consumers.get(id).is_some_and(|c| !c.for_peer))
                        .count() as u64,
                    producers,
                };
                (name.to_string(), activity)
            })
            .collect()
    }
}
