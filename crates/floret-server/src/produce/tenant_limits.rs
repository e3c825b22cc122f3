//! A tenant's limits over all its producers in a queue, cluster-wide: the
//! `max_messages`, `max_bytes` and `produce_rate` of its policy
//! (`floret policy set --queue q --tenant acme --max-messages 10000`),
//! checked by the leader of the shard a produce goes to.
//!
//! - What a tenant stores in a queue is summed shard by shard: from this
//!   node's replica of each shard it holds (the store's producer-group
//!   totals, as fresh as the replica), and from the gossip view for the
//!   shards it does not hold (their leaders publish what each tenant with
//!   limits stores in them, [`TenantLimits::report`]).
//! - A tenant's `produce_rate` is shared between the nodes its produces
//!   reach, max-min fair over the rate each node is asked for (its demand,
//!   gossiped too): a node asked for less than an even part gets what it
//!   asks, the others share the rest ([`node_rate`]). Each node keeps a token
//!   bucket of its part, which starts with an even part of one second's
//!   tokens, so the nodes' first buckets hold one second of the rate together.
//!
//! The decisions are pure ([`check_stored`], [`node_rate`], [`Demand`]);
//! this module gathers their figures.
//!
//! IMPLEMENTATION CAVEATS
//! - The limits are checked on admission, from figures that lag: produces
//!   admitted at once by several leaders (or within a gossip round, for
//!   shards this node does not hold) can pass a limit by what they add.
//!   Nothing is refused for a figure that is too high for longer than that.
//! - Without gossip (a one-node cluster, or a node cut off from it) a node
//!   counts the shards it holds and gives itself the whole rate. Until the
//!   other nodes' demand has gone round (a gossip round or two), each node
//!   refills at the whole rate too.
//! - A new leader's buckets start full, like producers' (`rate.rs`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use floret_cluster::{Liveness, Shards, TenantLoad, View};
use floret_store::ShardId;
use floret_store::policy::Policy;
use tokio::sync::watch;

use super::admission::describe_limits;
use super::rate::RateLimiter;
use crate::error::{OVER_LIMIT_RETRY_AFTER, RequestError};
use crate::policy;
use crate::request::InvalidRequest;

/// Demand meters idle this long are dropped.
const IDLE_DEMAND: Duration = Duration::from_secs(10);
/// The window demand is counted over.
const DEMAND_WINDOW: Duration = Duration::from_secs(1);

/// Refuses a produce of `incoming` (messages, bytes) by `tenant`, which
/// stores `stored` (messages, bytes) in the queue, if it would pass the
/// tenant's `limits`; a produce over them by itself can never be stored.
pub fn check_stored(
    tenant: &str,
    limits: &Policy,
    stored: (u64, u64),
    incoming: (u64, u64),
) -> Result<(), RequestError> {
    if limits.exceeded_by(incoming.0, incoming.1) {
        return Err(InvalidRequest::BatchOverTenantLimit {
            count: incoming.0 as usize,
            tenant: tenant.to_owned(),
            limits: describe_limits(limits),
        }
        .into());
    }
    if !limits.exceeded_by(stored.0 + incoming.0, stored.1 + incoming.1) {
        return Ok(());
    }
    Err(RequestError::Exhausted {
        message: format!(
            "tenant {tenant:?} stores {} messages ({} bytes) in this queue over all its producers, and this produce of {} would pass its limit ({}); nothing was stored, retry once consumers have drained it",
            stored.0,
            stored.1,
            incoming.0,
            describe_limits(limits)
        ),
        retry_after: OVER_LIMIT_RETRY_AFTER,
    })
}

/// This node's part of a tenant's `rate` (messages/s) when it is asked for
/// `own` messages/s and the other nodes for `others`: max-min fair, so a
/// node asking less than an even part gets what it asks and the others
/// share the rest; when all ask for less than the rate together, this node
/// gets whatever the others leave. At least one message/s.
pub fn node_rate(rate: u32, own: f64, others: &[f64]) -> u32 {
    let rate = f64::from(rate);
    let asked_elsewhere: f64 = others.iter().sum();
    let part = if own + asked_elsewhere <= rate {
        rate - asked_elsewhere
    } else {
        let mut demands: Vec<f64> = others.iter().copied().chain([own]).collect();
        demands.sort_by(f64::total_cmp);
        let (mut left, mut sharing) = (rate, demands.len() as f64);
        let mut level = left / sharing;
        for demand in demands {
            if demand > level {
                break;
            }
            left -= demand;
            sharing -= 1.0;
            level = if sharing > 0.0 { left / sharing } else { left };
        }
        own.min(level)
    };
    part.ceil().max(1.0) as u32
}

/// How many messages a tenant asks one node to store per second: the rate
/// over the last whole window, or the count of the current one if higher.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    window_start: Instant,
    in_window: u64,
    last_rate: f64,
}

impl Demand {
    /// A meter that starts counting at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            window_start: now,
            in_window: 0,
            last_rate: 0.0,
        }
    }

    /// `messages` asked for at `now`.
    pub fn record(&mut self, messages: u64, now: Instant) {
        self.roll(now);
        self.in_window += messages;
    }

    /// Messages per second asked for, as of `now`.
    pub fn rate(&mut self, now: Instant) -> f64 {
        self.roll(now);
        self.last_rate.max(self.in_window as f64)
    }

    /// When the meter last counted anything.
    fn idle_since(&self) -> Instant {
        self.window_start
    }

    fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed < DEMAND_WINDOW {
            return;
        }
        self.last_rate = if elapsed < DEMAND_WINDOW * 2 {
            self.in_window as f64 / elapsed.as_secs_f64()
        } else {
            0.0
        };
        if self.in_window > 0 || self.last_rate > 0.0 {
            self.window_start = now;
        }
        self.in_window = 0;
    }
}

/// A tenant in a queue.
type TenantOfQueue = (String, String);

/// The tenants' limits on this node.
pub struct TenantLimits {
    shards: Arc<Shards>,
    /// The gossip view, once gossip runs (never on a one-node cluster).
    view: OnceLock<watch::Receiver<Arc<View>>>,
    /// Per tenant with a `produce_rate`: what it asks of this node.
    demand: Mutex<HashMap<TenantOfQueue, Demand>>,
    /// Per tenant with a `produce_rate`: its bucket of this node's part.
    buckets: RateLimiter,
}

impl TenantLimits {
    /// Limits over the shard replicas `shards` holds.
    pub fn new(shards: Arc<Shards>) -> Self {
        Self {
            shards,
            view: OnceLock::new(),
            demand: Mutex::default(),
            buckets: RateLimiter::default(),
        }
    }

    /// Takes the other nodes' figures from `view` from now on.
    pub fn follow_view(&self, view: watch::Receiver<Arc<View>>) {
        let _ = self.view.set(view);
    }

    /// Refuses a produce of `incoming` (messages, bytes) into `queue` by
    /// `tenant` that would pass a limit of `limits` (the tenant's policy).
    pub fn admit(
        &self,
        queue: &str,
        tenant: &str,
        limits: &Policy,
        incoming: (u64, u64),
        now: Instant,
    ) -> Result<(), RequestError> {
        if limits.max_messages.is_some() || limits.max_bytes.is_some() {
            check_stored(tenant, limits, self.stored(queue, tenant), incoming)?;
        }
        let Some(rate) = limits.produce_rate else {
            return Ok(());
        };
        let key = (queue.to_owned(), tenant.to_owned());
        let own = {
            let mut demand = self.demand.lock().expect("demand lock");
            let meter = demand
                .entry(key.clone())
                .or_insert_with(|| Demand::new(now));
            meter.record(incoming.0, now);
            meter.rate(now)
        };
        let part = node_rate(rate, own, &self.demand_elsewhere(&key));
        let bucket_of = policy::tenant_policy_key(tenant);
        let nodes = self.shards.peers().others().count() + 1;
        self.buckets
            .take_from(
                queue,
                &bucket_of,
                part,
                incoming.0,
                now,
                f64::from(rate) / nodes as f64,
            )
            .map_err(|wait| {
                crate::telemetry::count_for_queue("floret_produce_throttled_total", queue, 1);
                RequestError::Exhausted {
                    message: format!(
                        "tenant {tenant:?} is over its produce_rate of {rate} messages/s over all its producers (this node's part: {part}/s); nothing was stored, retry later"
                    ),
                    retry_after: wait,
                }
            })
    }

    /// What `tenant` stores in `queue` over every shard: this node's
    /// replicas where it holds one, the leaders' gossip elsewhere.
    fn stored(&self, queue: &str, tenant: &str) -> (u64, u64) {
        let mut held_here = HashSet::new();
        let (mut messages, mut bytes) = (0, 0);
        for group in self.shards.groups() {
            held_here.insert(group.id);
            let totals = group.reader.totals().group(queue, tenant);
            messages += totals.messages;
            bytes += totals.bytes;
        }
        let mut elsewhere: HashMap<ShardId, (u64, u64)> = HashMap::new();
        self.for_each_other_node(|led, load| {
            if let Some(load) = load.get(&(queue.to_owned(), tenant.to_owned())) {
                for &(shard, messages, bytes) in &load.shards {
                    if !held_here.contains(&shard) && led.contains(&shard) {
                        elsewhere.insert(shard, (messages, bytes));
                    }
                }
            }
        });
        for (shard_messages, shard_bytes) in elsewhere.into_values() {
            messages += shard_messages;
            bytes += shard_bytes;
        }
        (messages, bytes)
    }

    /// The demand the other live nodes report for `key`.
    fn demand_elsewhere(&self, key: &TenantOfQueue) -> Vec<f64> {
        let mut demands = Vec::new();
        self.for_each_other_node(|_, load| {
            if let Some(load) = load.get(key).filter(|load| load.demand > 0.0) {
                demands.push(load.demand);
            }
        });
        demands
    }

    /// Calls `each` with the shards every other node not dead leads and
    /// its tenant loads.
    fn for_each_other_node(
        &self,
        mut each: impl FnMut(&[ShardId], &BTreeMap<TenantOfQueue, TenantLoad>),
    ) {
        let Some(view) = self.view.get() else {
            return;
        };
        let view = view.borrow().clone();
        let own = self.shards.peers().node_id();
        for (node, seen) in view.iter() {
            if *node != own && seen.liveness != Liveness::Dead {
                each(&seen.report.shards_led, &seen.report.tenants);
            }
        }
    }

    /// What this node publishes about the tenants with limits: what each
    /// stores in the shards it leads, and what it asks of this node.
    pub fn report(&self, now: Instant) -> BTreeMap<TenantOfQueue, TenantLoad> {
        let mut report: BTreeMap<TenantOfQueue, TenantLoad> = BTreeMap::new();
        {
            let mut demand = self.demand.lock().expect("demand lock");
            demand.retain(|key, meter| {
                let rate = meter.rate(now);
                if rate > 0.0 {
                    report.entry(key.clone()).or_default().demand = rate;
                }
                now.saturating_duration_since(meter.idle_since()) < IDLE_DEMAND
            });
        }
        let led: Vec<_> = self
            .shards
            .groups()
            .filter(|group| self.shards.leads(group.id))
            .collect();
        let Some(any_shard) = self.shards.groups().next() else {
            return report;
        };
        let limited: Vec<TenantOfQueue> = any_shard.reader.with_policies(|table| {
            table
                .overrides()
                .filter(|(_, _, policy)| {
                    policy.max_messages.is_some() || policy.max_bytes.is_some()
                })
                .filter_map(|(queue, key, _)| {
                    let tenant = policy::tenant_of_policy_key(key)?;
                    Some((queue.to_owned(), tenant.to_owned()))
                })
                .collect()
        });
        for (queue, tenant) in limited {
            let shards: Vec<_> = led
                .iter()
                .filter_map(|group| {
                    let totals = group.reader.totals().group(&queue, &tenant);
                    (totals.messages > 0).then_some((group.id, totals.messages, totals.bytes))
                })
                .collect();
            if !shards.is_empty() {
                report.entry((queue, tenant)).or_default().shards = shards;
            }
        }
        report
    }
}

#[cfg(test)]
mod tests;
