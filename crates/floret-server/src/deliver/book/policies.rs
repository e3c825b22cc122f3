//! Following policy changes: the scheduler takes the producers' weights,
//! tiers and in-flight limits, and the tenants' weights, from the shard's
//! replicated policies (a tenant's policy is stored in every shard as the
//! override of producer id `tenant/`, [`policy::PolicyOwner::Tenant`]).

use std::sync::Arc;

use floret_store::ShardId;
use floret_store::policy::PolicyTable;

use super::queue::ProducerKey;
use super::{ConsumerChannel, DispatchBook, Now, ShardContents};
use crate::policy;

impl<S: ShardContents, C: ConsumerChannel> DispatchBook<S, C> {
    /// A queue's defaults or a producer's override changed in `shard`. A
    /// queue-wide change arrives once from every shard; each time only that
    /// shard's overrides are resolved again (against its own, now updated,
    /// defaults), and the defaults are set once.
    pub(super) fn policy_changed(
        &mut self,
        shard: ShardId,
        queue: &Arc<str>,
        producer: Option<&str>,
        now: Now,
    ) {
        if !self.shards.holds(shard) {
            return;
        }
        match producer {
            None => {
                let defaults = policy::scheduling(self.shards.stored_policy(shard, queue, None));
                let scheduler = &mut self.queue(queue).scheduler;
                if scheduler.defaults() != defaults {
                    scheduler.set_defaults(defaults);
                }
                if self.leads(shard) {
                    let policies = self.shards.policies(shard);
                    self.apply_overrides(shard, queue, &policies);
                }
            }
            Some(producer) if let Some(tenant) = policy::tenant_of_policy_key(producer) => {
                let weight = self
                    .shards
                    .stored_policy(shard, queue, Some(producer))
                    .weight;
                self.queue(queue)
                    .scheduler
                    .set_tenant_weight(&tenant.to_owned(), weight);
            }
            Some(producer) if self.leads(shard) => {
                let stored = self.shards.stored_policy(shard, queue, Some(producer));
                let scheduling = (!stored.is_empty())
                    .then(|| policy::scheduling(self.shards.policy(shard, queue, producer)));
                self.queue(queue)
                    .scheduler
                    .set_policy(&ProducerKey::new(shard, producer), scheduling);
            }
            Some(_) => return,
        }
        self.pump(queue, now);
    }

    /// Gives the scheduler of `queue` the overrides of `shard`'s producers
    /// and the queue's tenant weights, as `policies` (the shard's table,
    /// read once by the caller) has them.
    pub(super) fn apply_overrides(
        &mut self,
        shard: ShardId,
        queue: &Arc<str>,
        policies: &PolicyTable,
    ) {
        let scheduler = &mut self.queue(queue).scheduler;
        for producer in policies.overridden(queue) {
            if let Some(tenant) = policy::tenant_of_policy_key(producer) {
                let weight = policies.stored(queue, Some(producer)).weight;
                scheduler.set_tenant_weight(&tenant.to_owned(), weight);
                continue;
            }
            let policy = policies.effective(queue, producer);
            scheduler.set_policy(
                &ProducerKey::new(shard, producer),
                Some(policy::scheduling(policy)),
            );
        }
    }
}
