//! Backlog reports: every consumer learns its queue's backlog on this node
//! (the sum of the weights of the producers with messages ready in the
//! shards this node leads, and per tenant its producers' weight and its
//! own weight) when it subscribes and whenever it changes, at most once per
//! [`BACKLOG_REPORT_GAP`] so a backlog that changes with every message
//! costs a report per gap, not per message. Consumers are the sources of
//! merges (`service/fan_in/`), which split a consumer's credits between
//! nodes by these reports instead of the gossip view, and send back each
//! tenant's share on this node ([`DispatchBook::tenant_shares`]): the part
//! of the tenant's backlog in the cluster that is here.
//!
//! IMPLEMENTATION CAVEATS
//! - A report lists every backlogged tenant: with thousands of tenants in
//!   one queue, each report (and each share update) is that long.

use std::sync::Arc;
use std::time::Duration;

use super::queue::{QueueDispatch, Tenancy};
use super::{ConsumerChannel, ConsumerId, DispatchBook, Now, ShardContents};
use crate::deliver::{BacklogReport, ConsumerEvent, TenantBacklog, TenantShare};

/// Shortest time between two rounds of backlog reports.
pub const BACKLOG_REPORT_GAP: Duration = Duration::from_millis(10);

impl<S: ShardContents, C: ConsumerChannel> DispatchBook<S, C> {
    /// Tells the consumers of each queue whose backlog changed since they
    /// were last told; does nothing before the gap after the last round
    /// has passed ([`Self::next_deadline`] wakes the caller then).
    pub fn report_backlogs(&mut self, now: Now) {
        if self.backlog_report_due.is_some_and(|due| now.instant < due) {
            return;
        }
        self.backlog_report_due = None;
        let mut reported = false;
        for queue in self.queues.values_mut() {
            if queue.consumers.is_empty() || !queue.backlog_may_have_changed() {
                continue;
            }
            let report = backlog_report(queue, self.tenancy);
            if report == queue.reported {
                continue;
            }
            queue.reported = report;
            reported = true;
            for id in &queue.consumers {
                if let Some(consumer) = self.consumers.get(id) {
                    let _closed_stream_is_noticed_by_the_pump = consumer
                        .channel
                        .send(ConsumerEvent::Backlog(queue.reported.clone()));
                }
            }
        }
        if reported {
            self.backlog_report_due = Some(now.instant + BACKLOG_REPORT_GAP);
        }
    }

    /// The report a new consumer of `queue` is told first: what the
    /// queue's other consumers were told (a change since reaches them all
    /// in the next round), or the current backlog if it has no others.
    pub(super) fn first_backlog_report(&mut self, queue: &Arc<str>) -> BacklogReport {
        let tenancy = self.tenancy;
        let queue = self.queue(queue);
        if queue.consumers.is_empty() {
            queue.backlog_may_have_changed();
            queue.reported = backlog_report(queue, tenancy);
        }
        queue.reported.clone()
    }

    /// The tenants' shares on this node of the queue `consumer` reads, as
    /// the merge it feeds computed them: the queue's scheduler serves each
    /// tenant by its weight times its share here.
    pub fn tenant_shares(&mut self, consumer: ConsumerId, shares: Vec<TenantShare>, now: Now) {
        let Some(queue_name) = self.consumers.get(&consumer).map(|c| c.queue.clone()) else {
            return;
        };
        let queue = self.queue(&queue_name);
        queue.scheduler.set_tenant_shares(
            shares
                .into_iter()
                .map(|TenantShare { tenant, share }| (tenant, share)),
        );
        self.pump(&queue_name, now);
    }
}

/// The queue's backlog as consumers are told it; tenants in name order.
fn backlog_report(queue: &QueueDispatch, tenancy: Tenancy) -> BacklogReport {
    let tenants = match tenancy {
        Tenancy::Anonymous => Vec::new(),
        Tenancy::Namespaced => {
            let mut tenants: Vec<TenantBacklog> = queue
                .scheduler
                .backlogged_tenant_weights()
                .into_iter()
                .map(|(tenant, producer_weight, weight)| TenantBacklog {
                    tenant,
                    producer_weight,
                    weight,
                })
                .collect();
            tenants.sort_unstable();
            tenants
        }
    };
    BacklogReport {
        weight: queue.scheduler.backlogged_weight(),
        tenants,
    }
}
