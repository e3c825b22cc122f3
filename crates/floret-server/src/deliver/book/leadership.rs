//! Gaining and losing the leadership of a shard: its queues are rebuilt
//! from the replicated producer records and policies, or dropped.

use std::collections::HashSet;
use std::sync::Arc;

use floret_store::ShardId;

use super::queue::ProducerKey;
use super::{ConsumerChannel, DispatchBook, Now, ShardContents};

impl<S: ShardContents, C: ConsumerChannel> DispatchBook<S, C> {
    /// Loads every producer with stored messages of a shard this node now
    /// leads, and the shard's policies.
    pub(super) fn rebuild_shard(&mut self, shard: ShardId, now: Now) {
        if !self.shards.holds(shard) {
            return;
        }
        let backlogs = match self.shards.backlogs(shard) {
            Ok(backlogs) => backlogs,
            Err(error) => {
                tracing::error!(shard, %error, "cannot read producers to rebuild the dispatcher");
                return;
            }
        };
        let mut touched = HashSet::new();
        for backlog in backlogs {
            let queue: Arc<str> = backlog.queue.into();
            let key = ProducerKey::new(shard, &backlog.producer);
            self.queue(&queue)
                .scheduler
                .enqueued(&key, backlog.sequences);
            touched.insert(queue);
        }
        let policies = self.shards.policies(shard);
        for (queue, defaults) in policies.queues_with_defaults() {
            let queue: Arc<str> = queue.into();
            let defaults = crate::policy::scheduling(defaults);
            self.queue(&queue).scheduler.set_defaults(defaults);
            self.apply_overrides(shard, &queue, &policies);
            touched.insert(queue);
        }
        tracing::info!(
            shard,
            queues = touched.len(),
            "leading shard; dispatcher rebuilt from its state"
        );
        for queue in touched {
            self.pump(&queue, now);
        }
    }

    /// Drops everything of a shard this node no longer leads, its
    /// producers' policy overrides included (a rebuild reads them again, as
    /// they are then).
    pub(super) fn forget_shard(&mut self, shard: ShardId) {
        if !self.shards.holds(shard) {
            return;
        }
        for (queue, producer) in self.shards.producers(shard) {
            if let Some(queue) = self.queues.get_mut(queue.as_str()) {
                queue.scheduler.forget(&ProducerKey::new(shard, &producer));
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
