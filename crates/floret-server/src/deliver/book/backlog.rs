//! Backlog reports: every consumer learns its queue's backlogged weight on
//! this node (the sum of the weights of the producers with messages ready
//! in the shards this node leads) when it subscribes and whenever it
//! changes, at most once per [`BACKLOG_REPORT_GAP`] so a weight that flips
//! with every message costs a report per gap, not per message. Consumers
//! are the sources of merges (`service/fan_in/`), which split a consumer's
//! credits between nodes by these reports instead of the gossip view.

use std::time::Duration;

use super::{ConsumerChannel, DispatchBook, Now, ShardContents};
use crate::deliver::ConsumerEvent;

/// Shortest time between two rounds of backlog reports.
pub const BACKLOG_REPORT_GAP: Duration = Duration::from_millis(10);

impl<S: ShardContents, C: ConsumerChannel> DispatchBook<S, C> {
    /// Tells the consumers of each queue whose backlogged weight changed
    /// since they were last told; does nothing before the gap after the
    /// last round has passed ([`Self::next_deadline`] wakes the caller then).
    pub fn report_backlogs(&mut self, now: Now) {
        if self.backlog_report_due.is_some_and(|due| now.instant < due) {
            return;
        }
        self.backlog_report_due = None;
        let mut reported = false;
        for queue in self.queues.values_mut() {
            let weight = queue.scheduler.backlogged_weight();
            if queue.consumers.is_empty() || weight == queue.reported_weight {
                continue;
            }
            queue.reported_weight = weight;
            reported = true;
            for id in &queue.consumers {
                if let Some(consumer) = self.consumers.get(id) {
                    let _closed_stream_is_noticed_by_the_pump =
                        consumer.channel.send(ConsumerEvent::Backlog(weight));
                }
            }
        }
        if reported {
            self.backlog_report_due = Some(now.instant + BACKLOG_REPORT_GAP);
        }
    }

    /// The weight a new consumer of `queue` is told first: what the
    /// queue's other consumers were told (a change since reaches them all
    /// in the next round), or the current weight if it has no others.
    pub(super) fn first_backlog_report(&mut self, queue: &std::sync::Arc<str>) -> u64 {
        let queue = self.queue(queue);
        if queue.consumers.is_empty() {
            queue.reported_weight = queue.scheduler.backlogged_weight();
        }
        queue.reported_weight
    }
}
