//! Gaining and losing the leadership of a shard: its queues are rebuilt
//! from the replicated producer records and policies, or dropped.

use std::collections::HashSet;
use std::sync::Arc;

use floret_store::ShardId;

use super::super::queue::ProducerKey;
use super::Dispatcher;

impl Dispatcher {
    /// Loads every producer with stored messages of a shard this node now leads.
    pub(super) fn rebuild_shard(&mut self, shard: ShardId) {
        let Some(reader) = self.readers[shard as usize].clone() else {
            return;
        };
        let mut touched = HashSet::new();
        for entry in reader.producers() {
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) => {
                    tracing::error!(shard, %error, "cannot read producers to rebuild the dispatcher");
                    return;
                }
            };
            if entry.record.messages == 0 {
                continue;
            }
            let first =
                match reader.oldest_message(&entry.queue, &entry.producer, entry.record.head) {
                    Ok(Some((sequence, _))) => sequence,
                    Ok(None) => continue,
                    Err(error) => {
                        tracing::error!(shard, %error, "cannot read a producer's oldest message");
                        continue;
                    }
                };
            let queue: Arc<str> = entry.queue.into();
            let key = ProducerKey {
                shard,
                producer: entry.producer.into(),
            };
            self.queue(&queue)
                .scheduler
                .enqueued(&key, first..entry.record.tail);
            touched.insert(queue);
        }
        for (queue, defaults) in reader.policies().queues_with_defaults() {
            let queue: Arc<str> = queue.into();
            let defaults = crate::policy::scheduling(defaults);
            self.queue(&queue).scheduler.set_defaults(defaults);
            self.apply_overrides(shard, &queue);
            touched.insert(queue);
        }
        tracing::info!(
            shard,
            queues = touched.len(),
            "leading shard; dispatcher rebuilt from its state"
        );
        for queue in touched {
            self.pump(&queue);
        }
    }

    /// Drops everything of a shard this node no longer leads, its
    /// producers' policy overrides included (a rebuild reads them again, as
    /// they are then).
    pub(super) fn forget_shard(&mut self, shard: ShardId) {
        let Some(reader) = self.readers[shard as usize].clone() else {
            return;
        };
        for entry in reader.producers().flatten() {
            let key = ProducerKey {
                shard,
                producer: entry.producer.into(),
            };
            if let Some(queue) = self.queues.get_mut(entry.queue.as_str()) {
                queue.scheduler.forget(&key);
            }
        }
        for queue in self.queues.values_mut() {
            queue
                .holders
                .retain(|lease, _| lease.producer.shard != shard);
            queue
                .scheduler
                .forget_overrides(|producer| producer.shard == shard);
        }
        for consumer in self.consumers.values_mut() {
            consumer.held.retain(|lease| lease.producer.shard != shard);
        }
    }
}
