use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::error::SettleError;

const TIMEOUT: Duration = Duration::from_secs(30);

fn scheduler() -> Scheduler<&'static str> {
    Scheduler::new(SchedulerConfig {
        default_weight: 1,
        lease_timeout: TIMEOUT,
    })
}

/// Producer names of the next `count` dispatches, e.g. "abab".
fn order(scheduler: &mut Scheduler<&'static str>, now: Instant, count: usize) -> String {
    (0..count)
        .map_while(|_| scheduler.next(now))
        .map(|dispatch| dispatch.producer)
        .collect()
}

/// Producers in every producer ring of every tier.
fn producer_ring_members<T>(scheduler: &Scheduler<&'static str, T>) -> usize {
    scheduler
        .tiers
        .values()
        .flat_map(|tier| tier.turns.iter())
        .map(|turn| turn.producers.members())
        .sum()
}

fn dispatch(producer: &'static str, sequence: u64, attempt: u32) -> Option<Dispatch<&'static str>> {
    Some(Dispatch {
        producer,
        sequence,
        attempt,
    })
}

#[test]
fn zero_default_weight_counts_as_one() {
    let mut scheduler = Scheduler::new(SchedulerConfig {
        default_weight: 0,
        ..SchedulerConfig::default()
    });
    scheduler.enqueued(&"a", 1..3);
    scheduler.enqueued(&"b", 1..3);
    assert_eq!(scheduler.backlogged_weight(), 2);
    assert_eq!(order(&mut scheduler, Instant::now(), 4), "abab");
}

#[test]
fn default_config_is_weight_one_and_thirty_seconds() {
    let config = SchedulerConfig::default();
    assert_eq!(config.default_weight, 1);
    assert_eq!(config.lease_timeout, Duration::from_secs(30));
}

#[test]
fn next_on_empty_scheduler_is_none() {
    let mut scheduler = scheduler();
    assert_eq!(scheduler.next(Instant::now()), None);
    assert_eq!(scheduler.next_deadline(), None);
}

#[test]
fn empty_range_creates_no_slot() {
    let mut scheduler = scheduler();
    scheduler.enqueued(&"a", 4..4);
    assert_eq!(scheduler.producer(&"a"), None);
    assert_eq!(scheduler.backlogged_producers(), 0);
}

#[test]
fn enqueued_counts_ready_messages_and_backlogged_producers() {
    let mut scheduler = scheduler();
    scheduler.enqueued(&"a", 1..4);
    scheduler.enqueued(&"b", 10..12);
    assert_eq!(scheduler.ready_messages(), 5);
    assert_eq!(scheduler.backlogged_producers(), 2);
    assert_eq!(scheduler.backlogged_weight(), 2);
    let view = scheduler.producer(&"a").unwrap();
    assert_eq!(
        view,
        ProducerView {
            ready: 3,
            in_flight: 0,
            weight: 1,
            deficit: 0
        }
    );
}

#[test]
fn enqueue_while_backlogged_does_not_join_the_ring_twice() {
    let mut scheduler = scheduler();
    scheduler.enqueued(&"a", 1..2);
    scheduler.enqueued(&"a", 2..3);
    scheduler.enqueued(&"b", 1..2);
    assert_eq!(producer_ring_members(&scheduler), 2);
    assert_eq!(order(&mut scheduler, Instant::now(), 3), "aba");
}

#[test]
fn overlapping_range_does_not_deliver_twice() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..3);
    assert_eq!(scheduler.next(now), dispatch("a", 1, 1));
    scheduler.enqueued(&"a", 1..4);
    assert_eq!(scheduler.ready_messages(), 2);
    assert_eq!(scheduler.next(now), dispatch("a", 2, 1));
    assert_eq!(scheduler.next(now), dispatch("a", 3, 1));
    assert_eq!(scheduler.next(now), None);
}

#[test]
fn hole_in_sequences_is_skipped_after_the_messages_before_it() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..3);
    scheduler.enqueued(&"a", 7..8);
    let sequences: Vec<u64> = std::iter::from_fn(|| scheduler.next(now))
        .map(|dispatch| dispatch.sequence)
        .collect();
    assert_eq!(sequences, [1, 2, 7]);
}

#[test]
fn flooding_producer_cannot_starve_quiet_ones() {
    let mut scheduler = scheduler();
    scheduler.enqueued(&"a", 1..1_000);
    scheduler.enqueued(&"b", 1..3);
    scheduler.enqueued(&"c", 1..2);
    assert_eq!(order(&mut scheduler, Instant::now(), 7), "abcabaa");
}

#[test]
fn producer_arriving_late_waits_one_round_at_most() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..1_000);
    scheduler.enqueued(&"b", 1..1_000);
    assert_eq!(order(&mut scheduler, now, 3), "aba");
    scheduler.enqueued(&"c", 1..2);
    assert_eq!(order(&mut scheduler, now, 3), "bac");
}

#[test]
fn weighted_producer_gets_weight_messages_per_turn() {
    let mut scheduler = scheduler();
    scheduler.set_policy(&"a", Some(weighted(3)));
    scheduler.enqueued(&"a", 1..100);
    scheduler.enqueued(&"b", 1..100);
    assert_eq!(scheduler.backlogged_weight(), 4);
    assert_eq!(order(&mut scheduler, Instant::now(), 8), "aaabaaab");
}

#[test]
fn deficit_counts_credits_left_in_the_turn() {
    let mut scheduler = scheduler();
    scheduler.set_policy(&"a", Some(weighted(3)));
    scheduler.enqueued(&"a", 1..100);
    scheduler.next(Instant::now());
    assert_eq!(scheduler.producer(&"a").unwrap().deficit, 2);
}

#[test]
fn weight_override_takes_effect_from_next_turn() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.set_policy(&"a", Some(weighted(3)));
    scheduler.enqueued(&"a", 1..100);
    scheduler.enqueued(&"b", 1..100);
    assert_eq!(order(&mut scheduler, now, 1), "a");
    scheduler.set_policy(&"a", Some(weighted(1)));
    assert_eq!(scheduler.backlogged_weight(), 2);
    assert_eq!(order(&mut scheduler, now, 6), "aababa");
}

#[test]
fn weight_override_survives_idle_producer() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.set_policy(&"a", Some(weighted(2)));
    assert_eq!(scheduler.producer(&"a"), None);
    scheduler.enqueued(&"a", 1..2);
    let first = scheduler.next(now).unwrap();
    scheduler.ack(&"a", first.sequence, first.attempt).unwrap();
    assert_eq!(scheduler.producer(&"a"), None);
    scheduler.enqueued(&"a", 2..3);
    assert_eq!(scheduler.producer(&"a").unwrap().weight, 2);
}

#[test]
fn zero_weight_override_counts_as_one() {
    let mut scheduler = scheduler();
    scheduler.set_policy(&"a", Some(weighted(0)));
    scheduler.enqueued(&"a", 1..2);
    assert_eq!(scheduler.producer(&"a").unwrap().weight, 1);
}

#[test]
fn cleared_weight_goes_back_to_default() {
    let mut scheduler = Scheduler::new(SchedulerConfig {
        default_weight: 2,
        ..SchedulerConfig::default()
    });
    scheduler.enqueued(&"a", 1..2);
    scheduler.set_policy(&"a", Some(weighted(5)));
    assert_eq!(scheduler.backlogged_weight(), 5);
    scheduler.set_policy(&"a", None);
    assert_eq!(scheduler.producer(&"a").unwrap().weight, 2);
    assert_eq!(scheduler.backlogged_weight(), 2);
}

#[test]
fn drained_producer_leaves_ring_with_no_credit_left() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.set_policy(&"a", Some(weighted(3)));
    scheduler.enqueued(&"a", 1..2);
    scheduler.next(now);
    assert_eq!(scheduler.backlogged_producers(), 0);
    assert_eq!(scheduler.backlogged_weight(), 0);
    assert_eq!(scheduler.producer(&"a").unwrap().deficit, 0);
    scheduler.enqueued(&"b", 1..3);
    scheduler.enqueued(&"a", 2..10);
    assert_eq!(order(&mut scheduler, now, 5), "baaab");
}

#[test]
fn dispatch_leases_until_now_plus_timeout() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..3);
    scheduler.next(now);
    assert_eq!(scheduler.next_deadline(), Some(now + TIMEOUT));
    assert_eq!((scheduler.ready_messages(), scheduler.in_flight()), (1, 1));
    assert_eq!(scheduler.producer(&"a").unwrap().in_flight, 1);
}

#[test]
fn acked_message_is_not_redelivered() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..2);
    scheduler.next(now);
    assert_eq!(scheduler.ack(&"a", 1, 1), Ok(()));
    assert_eq!(scheduler.in_flight(), 0);
    assert_eq!(scheduler.expire(now + TIMEOUT), 0);
    assert_eq!(scheduler.next(now + TIMEOUT), None);
}

#[test]
fn idle_producer_leaves_no_slot() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..3);
    scheduler.next(now);
    scheduler.next(now);
    scheduler.ack(&"a", 1, 1).unwrap();
    assert!(scheduler.producer(&"a").is_some());
    scheduler.ack(&"a", 2, 1).unwrap();
    assert_eq!(scheduler.producer(&"a"), None);
    assert_eq!(scheduler.slots.len(), 0);
}

#[test]
fn ack_of_expired_lease_is_refused() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..2);
    scheduler.next(now);
    assert_eq!(scheduler.expire(now + TIMEOUT), 1);
    assert_eq!(scheduler.ack(&"a", 1, 1), Err(SettleError::NotLeased));
    assert_eq!(scheduler.ready_messages(), 1);
}

#[test]
fn late_ack_of_first_attempt_cannot_settle_the_redelivery() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..2);
    scheduler.next(now);
    scheduler.expire(now + TIMEOUT);
    assert_eq!(scheduler.next(now + TIMEOUT), dispatch("a", 1, 2));
    assert_eq!(scheduler.ack(&"a", 1, 1), Err(SettleError::NotLeased));
    assert_eq!(scheduler.ack(&"a", 1, 2), Ok(()));
}

#[test]
fn double_ack_is_refused() {
    let mut scheduler = scheduler();
    scheduler.enqueued(&"a", 1..3);
    scheduler.next(Instant::now());
    scheduler.ack(&"a", 1, 1).unwrap();
    assert_eq!(scheduler.ack(&"a", 1, 1), Err(SettleError::NotLeased));
}

#[test]
fn ack_of_undelivered_message_is_refused() {
    let mut scheduler = scheduler();
    scheduler.enqueued(&"a", 1..3);
    assert_eq!(scheduler.ack(&"a", 1, 1), Err(SettleError::NotLeased));
    assert_eq!(scheduler.ack(&"b", 1, 1), Err(SettleError::NotLeased));
    assert_eq!(scheduler.ready_messages(), 2);
}

#[test]
fn redelivered_message_keeps_producer_order_first() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..5);
    scheduler.next(now);
    scheduler.next(now);
    scheduler.nack(&"a", 2, 1).unwrap();
    scheduler.nack(&"a", 1, 1).unwrap();
    assert_eq!(scheduler.next(now), dispatch("a", 1, 2));
    assert_eq!(scheduler.next(now), dispatch("a", 2, 2));
    assert_eq!(scheduler.next(now), dispatch("a", 3, 1));
}

#[test]
fn nack_puts_idle_producer_back_at_the_end_of_the_ring() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..2);
    scheduler.enqueued(&"b", 1..3);
    assert_eq!(order(&mut scheduler, now, 2), "ab");
    assert_eq!(scheduler.backlogged_producers(), 1);
    scheduler.nack(&"a", 1, 1).unwrap();
    assert_eq!(scheduler.backlogged_producers(), 2);
    assert_eq!((scheduler.ready_messages(), scheduler.in_flight()), (2, 1));
    assert_eq!(scheduler.next(now), dispatch("b", 2, 1));
    assert_eq!(scheduler.next(now), dispatch("a", 1, 2));
}

#[test]
fn nack_of_settled_message_is_refused() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..3);
    scheduler.next(now);
    scheduler.next(now);
    scheduler.ack(&"a", 1, 1).unwrap();
    assert_eq!(scheduler.nack(&"a", 1, 1), Err(SettleError::NotLeased));
    scheduler.nack(&"a", 2, 1).unwrap();
    assert_eq!(scheduler.nack(&"a", 2, 1), Err(SettleError::NotLeased));
    assert_eq!(scheduler.nack(&"z", 2, 1), Err(SettleError::NotLeased));
    assert_eq!((scheduler.ready_messages(), scheduler.in_flight()), (1, 0));
}

#[test]
fn expired_lease_is_redelivered_with_next_attempt() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..3);
    scheduler.next(now);
    assert_eq!(scheduler.expire(now + TIMEOUT), 1);
    assert_eq!(scheduler.in_flight(), 0);
    assert_eq!(scheduler.next(now + TIMEOUT), dispatch("a", 1, 2));
    assert_eq!(scheduler.next(now + TIMEOUT), dispatch("a", 2, 1));
}

#[test]
fn lease_does_not_expire_before_its_deadline() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..2);
    scheduler.next(now);
    assert_eq!(
        scheduler.expire(now + TIMEOUT - Duration::from_millis(1)),
        0
    );
    assert_eq!(scheduler.in_flight(), 1);
}

#[test]
fn expire_counts_only_live_leases() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..4);
    scheduler.next(now);
    scheduler.next(now);
    scheduler.next(now);
    scheduler.nack(&"a", 2, 1).unwrap();
    scheduler.ack(&"a", 3, 1).unwrap();
    assert_eq!(scheduler.expire(now + TIMEOUT), 1);
    assert_eq!(scheduler.lease_heap.len(), 0);
}

#[test]
fn next_deadline_skips_settled_leases_on_top() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    let later = now + Duration::from_secs(5);
    scheduler.enqueued(&"a", 1..3);
    scheduler.next(now);
    scheduler.next(later);
    scheduler.ack(&"a", 1, 1).unwrap();
    assert_eq!(scheduler.next_deadline(), Some(later + TIMEOUT));
    scheduler.ack(&"a", 2, 1).unwrap();
    assert_eq!(scheduler.next_deadline(), None);
}

#[test]
fn forgotten_producer_leaves_no_trace_but_its_weight() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.set_policy(&"a", Some(weighted(2)));
    scheduler.enqueued(&"a", 1..5);
    scheduler.next(now);
    scheduler.forget(&"a");
    assert_eq!(scheduler.producer(&"a"), None);
    assert_eq!(scheduler.backlogged_producers(), 0);
    assert_eq!(scheduler.backlogged_weight(), 0);
    assert_eq!((scheduler.ready_messages(), scheduler.in_flight()), (0, 0));
    assert_eq!(scheduler.next_deadline(), None);
    assert_eq!(scheduler.ack(&"a", 1, 1), Err(SettleError::NotLeased));
    scheduler.enqueued(&"a", 5..6);
    assert_eq!(scheduler.producer(&"a").unwrap().weight, 2);
}

#[test]
fn forgotten_producer_turn_passes_to_the_next() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..5);
    scheduler.enqueued(&"b", 1..5);
    scheduler.forget(&"a");
    scheduler.forget(&"nobody");
    assert_eq!(order(&mut scheduler, now, 3), "bbb");
    assert_eq!(producer_ring_members(&scheduler), 1);
}

#[test]
fn reused_slot_ignores_leases_of_its_previous_producer() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..2);
    scheduler.enqueued(&"b", 1..2);
    scheduler.next(now);
    scheduler.forget(&"a");
    scheduler.enqueued(&"c", 1..3);
    assert_eq!(scheduler.next(now), dispatch("b", 1, 1));
    assert_eq!(scheduler.next(now), dispatch("c", 1, 1));
    assert_eq!(scheduler.expire(now + TIMEOUT), 2);
    assert_eq!(scheduler.next(now + TIMEOUT), dispatch("c", 1, 2));
    assert_eq!(scheduler.next(now + TIMEOUT), dispatch("b", 1, 2));
    assert_eq!(scheduler.next(now + TIMEOUT), dispatch("c", 2, 1));
    assert_eq!(scheduler.next(now + TIMEOUT), None);
}

#[test]
fn scheduler_takes_the_servers_arc_str_keys() {
    let mut scheduler: Scheduler<Arc<str>> = Scheduler::new(SchedulerConfig::default());
    let producer: Arc<str> = Arc::from("tenant-1");
    scheduler.enqueued(&producer, 1..2);
    let dispatch = scheduler.next(Instant::now()).unwrap();
    assert_eq!(&*dispatch.producer, "tenant-1");
    assert_eq!(scheduler.ack(&producer, 1, 1), Ok(()));
}

#[test]
fn lease_check_does_not_settle_the_lease() {
    let now = Instant::now();
    let mut scheduler: Scheduler<&str> = Scheduler::new(SchedulerConfig::default());
    scheduler.enqueued(&"p", 0..1);
    let dispatch = scheduler.next(now).unwrap();
    assert!(scheduler.is_leased(&"p", 0, dispatch.attempt));
    assert!(!scheduler.is_leased(&"p", 0, dispatch.attempt + 1));
    assert!(!scheduler.is_leased(&"q", 0, 1));
    assert_eq!(scheduler.in_flight(), 1);
    scheduler.ack(&"p", 0, dispatch.attempt).unwrap();
    assert!(!scheduler.is_leased(&"p", 0, dispatch.attempt));
}

#[test]
fn expired_leases_are_named_for_the_caller() {
    let now = Instant::now();
    let mut scheduler: Scheduler<&str> = Scheduler::new(SchedulerConfig {
        default_weight: 1,
        lease_timeout: Duration::from_secs(1),
    });
    scheduler.enqueued(&"p", 0..2);
    scheduler.next(now).unwrap();
    scheduler.next(now).unwrap();
    scheduler.ack(&"p", 1, 1).unwrap();
    let expired = scheduler.expire_leases(now + Duration::from_secs(1));
    assert_eq!(
        expired,
        vec![Dispatch {
            producer: "p",
            sequence: 0,
            attempt: 1
        }]
    );
}

/// An override giving `weight` and the defaults' other settings.
fn weighted(weight: u32) -> ProducerPolicy {
    ProducerPolicy {
        weight,
        ..ProducerPolicy::default()
    }
}

fn tiered(priority: u32) -> ProducerPolicy {
    ProducerPolicy {
        priority,
        ..ProducerPolicy::default()
    }
}

fn capped(max_in_flight: u32) -> ProducerPolicy {
    ProducerPolicy {
        max_in_flight: Some(max_in_flight),
        ..ProducerPolicy::default()
    }
}

#[test]
fn higher_priority_tier_drains_before_a_lower_one_is_served() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.set_policy(&"h", Some(tiered(5)));
    scheduler.set_policy(&"i", Some(tiered(5)));
    scheduler.enqueued(&"a", 0..3);
    scheduler.enqueued(&"h", 0..2);
    scheduler.enqueued(&"i", 0..2);
    assert_eq!(order(&mut scheduler, now, 7), "hihiaaa");
}

#[test]
fn producer_moved_to_another_tier_is_served_there_once_per_turn() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 0..4);
    scheduler.enqueued(&"b", 0..4);
    scheduler.set_policy(&"b", Some(tiered(1)));
    assert_eq!(order(&mut scheduler, now, 2), "bb");
    scheduler.set_policy(&"b", None);
    assert_eq!(order(&mut scheduler, now, 6), "ababaa");
    assert_eq!(scheduler.backlogged_producers(), 0);
}

#[test]
fn max_in_flight_one_keeps_order_across_a_redelivery() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.set_policy(&"a", Some(capped(1)));
    scheduler.enqueued(&"a", 0..3);
    scheduler.enqueued(&"b", 0..3);
    assert_eq!(scheduler.next(now), dispatch("a", 0, 1));
    assert_eq!(order(&mut scheduler, now, 2), "bb");
    assert_eq!(scheduler.backlogged_producers(), 1);
    scheduler.nack(&"a", 0, 1).unwrap();
    assert_eq!(scheduler.next(now), dispatch("b", 2, 1));
    assert_eq!(scheduler.next(now), dispatch("a", 0, 2));
    assert_eq!(scheduler.next(now), None);
    scheduler.ack(&"a", 0, 2).unwrap();
    assert_eq!(scheduler.next(now), dispatch("a", 1, 1));
    scheduler.nack(&"a", 1, 1).unwrap();
    assert_eq!(scheduler.next(now), dispatch("a", 1, 2));
    assert_eq!(scheduler.next(now), None);
}

#[test]
fn lowered_in_flight_limit_takes_a_producer_out_of_the_ring_at_once() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 0..5);
    scheduler.enqueued(&"b", 0..5);
    assert_eq!(order(&mut scheduler, now, 2), "ab");
    scheduler.set_policy(&"a", Some(capped(1)));
    assert_eq!(order(&mut scheduler, now, 3), "bbb");
    scheduler.ack(&"a", 0, 1).unwrap();
    assert_eq!(order(&mut scheduler, now, 3), "ba");
}

#[test]
fn dropped_messages_are_never_dispatched() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 0..5);
    assert_eq!(scheduler.next(now), dispatch("a", 0, 1));
    scheduler.nack(&"a", 0, 1).unwrap();
    assert_eq!(scheduler.drop_before(&"a", 3), 3);
    assert_eq!(scheduler.ready_messages(), 2);
    assert_eq!(scheduler.next(now), dispatch("a", 3, 1));
    assert_eq!(scheduler.drop_before(&"a", 10), 1);
    assert_eq!(scheduler.next(now), None);
    assert_eq!(scheduler.backlogged_producers(), 0);
    scheduler.ack(&"a", 3, 1).unwrap();
    assert!(scheduler.producer(&"a").is_none());
}

#[test]
fn new_defaults_reach_producers_without_an_override_only() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.set_policy(&"b", Some(weighted(1)));
    scheduler.enqueued(&"a", 0..6);
    scheduler.enqueued(&"b", 0..6);
    scheduler.set_defaults(weighted(3));
    assert_eq!(scheduler.backlogged_weight(), 4);
    assert_eq!(order(&mut scheduler, now, 8), "aaabaaab");
}

#[test]
fn held_message_lets_the_others_go_first_and_comes_back_once_released() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 0..3);
    scheduler.enqueued(&"b", 0..2);
    assert_eq!(scheduler.next(now), dispatch("a", 0, 1));
    scheduler.hold(&"a", 0, 1).unwrap();
    assert_eq!(scheduler.in_flight(), 0);
    assert_eq!(order(&mut scheduler, now, 4), "baba");
    assert_eq!(scheduler.next(now), None);
    assert!(scheduler.unhold(&"a", 0));
    assert!(!scheduler.unhold(&"a", 0), "released twice");
    assert_eq!(scheduler.next(now), dispatch("a", 0, 1));
}

#[test]
fn forgotten_producer_has_nothing_held_to_release() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 0..1);
    scheduler.next(now);
    scheduler.hold(&"a", 0, 1).unwrap();
    assert!(
        scheduler.producer(&"a").is_some(),
        "a held message keeps the slot"
    );
    scheduler.forget(&"a");
    assert!(!scheduler.unhold(&"a", 0));
    assert_eq!(scheduler.ready_messages(), 0);
}

#[test]
fn forgotten_overrides_leave_their_producers_on_the_defaults() {
    let mut scheduler = scheduler();
    scheduler.set_policy(&"a", Some(weighted(3)));
    scheduler.set_policy(&"b", Some(tiered(2)));
    scheduler.enqueued(&"a", 0..4);
    scheduler.enqueued(&"b", 0..4);
    scheduler.forget_overrides(|producer| *producer == "a" || *producer == "b");
    assert_eq!(scheduler.backlogged_weight(), 2);
    assert_eq!(order(&mut scheduler, Instant::now(), 4), "abab");
}

#[test]
fn forgetting_a_producer_hides_the_leases_it_held() {
    let mut scheduler = scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a", 1..4);
    scheduler.enqueued(&"b", 1..2);
    scheduler.next(now);
    scheduler.next(now);
    assert_eq!(scheduler.forget(&"b"), 1);
    assert_eq!(scheduler.forget(&"b"), 0);
    assert_eq!(scheduler.forget(&"nobody"), 0);
    scheduler.next(now);
    assert_eq!(scheduler.forget(&"a"), 2);
}

/// A scheduler whose producers `tenant/name` belong to `tenant`.
fn tenant_scheduler() -> Scheduler<&'static str, &'static str> {
    Scheduler::with_tenants(
        SchedulerConfig {
            default_weight: 1,
            lease_timeout: TIMEOUT,
        },
        |producer: &&'static str| producer.split_once('/').map_or("", |(tenant, _)| tenant),
    )
}

/// Tenants of the next `count` dispatches, e.g. "abab".
fn tenant_order(
    scheduler: &mut Scheduler<&'static str, &'static str>,
    now: Instant,
    count: usize,
) -> String {
    (0..count)
        .map_while(|_| scheduler.next(now))
        .map(|dispatch| dispatch.producer.split_once('/').map_or("", |(t, _)| t))
        .collect()
}

#[test]
fn a_tenant_with_a_hundred_producers_gets_a_hundred_shares() {
    let mut scheduler = tenant_scheduler();
    let now = Instant::now();
    let many: Vec<&'static str> = (0..100)
        .map(|index| &*Box::leak(format!("a/p{index}").into_boxed_str()))
        .collect();
    for producer in &many {
        scheduler.enqueued(producer, 1..11);
    }
    scheduler.enqueued(&"b/only", 1..101);
    assert_eq!(scheduler.backlogged_tenants(), 2);
    assert_eq!(scheduler.backlogged_producers(), 101);
    let order = tenant_order(&mut scheduler, now, 200);
    assert_eq!(order.matches('a').count(), 100);
    assert_eq!(order.matches('b').count(), 100);
    assert!(order.starts_with("abab"), "{order}");
}

#[test]
fn a_tenants_producers_share_its_turns_round_robin() {
    let mut scheduler = tenant_scheduler();
    let now = Instant::now();
    for producer in ["a/1", "a/2", "a/3", "b/1"] {
        scheduler.enqueued(&producer, 1..10);
    }
    let producers: Vec<&str> = (0..6)
        .map_while(|_| scheduler.next(now))
        .map(|dispatch| dispatch.producer)
        .collect();
    assert_eq!(producers, ["a/1", "b/1", "a/2", "b/1", "a/3", "b/1"]);
}

#[test]
fn tenant_weight_three_gets_three_messages_per_turn() {
    let mut scheduler = tenant_scheduler();
    let now = Instant::now();
    scheduler.set_tenant_weight(&"a", Some(3));
    scheduler.enqueued(&"a/1", 1..20);
    scheduler.enqueued(&"a/2", 1..20);
    scheduler.enqueued(&"b/1", 1..20);
    assert_eq!(scheduler.backlogged_tenant_weight(), 4);
    assert_eq!(tenant_order(&mut scheduler, now, 8), "aaabaaab");
    scheduler.set_tenant_weight(&"a", None);
    assert_eq!(scheduler.backlogged_tenant_weight(), 2);
    assert_eq!(tenant_order(&mut scheduler, now, 4), "abab");
}

#[test]
fn a_producer_weight_inside_a_tenant_splits_the_tenants_share() {
    let mut scheduler = tenant_scheduler();
    let now = Instant::now();
    scheduler.set_policy(
        &"a/heavy",
        Some(ProducerPolicy {
            weight: 2,
            ..ProducerPolicy::default()
        }),
    );
    scheduler.enqueued(&"a/heavy", 1..100);
    scheduler.enqueued(&"a/light", 1..100);
    scheduler.enqueued(&"b/1", 1..100);
    let producers: Vec<&str> = (0..60)
        .map_while(|_| scheduler.next(now))
        .map(|dispatch| dispatch.producer)
        .collect();
    let count = |name: &str| producers.iter().filter(|p| **p == name).count();
    assert_eq!(count("b/1"), 30);
    assert_eq!(count("a/heavy"), 20);
    assert_eq!(count("a/light"), 10);
}

#[test]
fn a_drained_tenant_leaves_and_rejoins_at_the_back() {
    let mut scheduler = tenant_scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a/1", 1..2);
    scheduler.enqueued(&"b/1", 1..5);
    scheduler.enqueued(&"c/1", 1..5);
    assert_eq!(tenant_order(&mut scheduler, now, 4), "abcb");
    assert_eq!(scheduler.backlogged_tenants(), 2);
    scheduler.enqueued(&"a/2", 1..3);
    assert_eq!(tenant_order(&mut scheduler, now, 5), "cbacb");
}

#[test]
fn a_forgotten_tenants_index_is_reused_without_its_stale_turns() {
    let mut scheduler = tenant_scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a/1", 1..5);
    scheduler.enqueued(&"b/1", 1..5);
    scheduler.forget(&"a/1");
    assert_eq!(scheduler.backlogged_tenants(), 1);
    scheduler.enqueued(&"c/1", 1..5);
    scheduler.enqueued(&"a/9", 1..5);
    assert_eq!(scheduler.backlogged_tenants(), 3);
    let order = tenant_order(&mut scheduler, now, 9);
    assert_eq!(order.matches('a').count(), 3, "{order}");
    assert_eq!(order.matches('b').count(), 3, "{order}");
    assert_eq!(order.matches('c').count(), 3, "{order}");
}

#[test]
fn a_higher_tier_goes_first_whatever_the_tenants() {
    let mut scheduler = tenant_scheduler();
    let now = Instant::now();
    scheduler.set_policy(
        &"b/urgent",
        Some(ProducerPolicy {
            priority: 1,
            ..ProducerPolicy::default()
        }),
    );
    scheduler.enqueued(&"a/1", 1..5);
    scheduler.enqueued(&"b/urgent", 1..3);
    scheduler.enqueued(&"b/normal", 1..5);
    let producers: Vec<&str> = (0..4)
        .map_while(|_| scheduler.next(now))
        .map(|dispatch| dispatch.producer)
        .collect();
    assert_eq!(producers, ["b/urgent", "b/urgent", "a/1", "b/normal"]);
}

#[test]
fn an_in_flight_limit_takes_the_producer_out_but_not_its_tenant() {
    let mut scheduler = tenant_scheduler();
    let now = Instant::now();
    scheduler.set_policy(
        &"a/strict",
        Some(ProducerPolicy {
            max_in_flight: Some(1),
            ..ProducerPolicy::default()
        }),
    );
    scheduler.enqueued(&"a/strict", 1..5);
    scheduler.enqueued(&"a/free", 1..5);
    scheduler.enqueued(&"b/1", 1..5);
    let producers: Vec<&str> = (0..6)
        .map_while(|_| scheduler.next(now))
        .map(|dispatch| dispatch.producer)
        .collect();
    assert_eq!(
        producers,
        ["a/strict", "b/1", "a/free", "b/1", "a/free", "b/1"]
    );
    scheduler.ack(&"a/strict", 1, 1).unwrap();
    let after_ack: Vec<&str> = (0..4)
        .map_while(|_| scheduler.next(now))
        .map(|dispatch| dispatch.producer)
        .collect();
    assert!(after_ack.contains(&"a/strict"), "{after_ack:?}");
}

#[test]
fn a_tenant_with_a_third_of_its_backlog_here_gets_a_third_of_its_turns() {
    let mut scheduler = tenant_scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a/1", 1..1_000);
    scheduler.enqueued(&"b/1", 1..1_000);
    scheduler.set_tenant_shares([("a", crate::WHOLE_SHARE / 3 + 1)]);
    assert_eq!(tenant_order(&mut scheduler, now, 8), "bbabbbab");
    let order = tenant_order(&mut scheduler, now, 400);
    assert_eq!(order.matches('a').count(), 100, "{order}");
    scheduler.set_tenant_shares([]);
    assert_eq!(
        tenant_order(&mut scheduler, now, 4).matches('a').count(),
        2,
        "an unlisted tenant goes back to a whole share"
    );
}

#[test]
fn a_share_is_kept_while_its_tenant_holds_nothing() {
    let mut scheduler = tenant_scheduler();
    let now = Instant::now();
    scheduler.set_tenant_shares([("a", crate::WHOLE_SHARE / 2)]);
    scheduler.enqueued(&"a/1", 1..100);
    scheduler.enqueued(&"b/1", 1..100);
    let order = tenant_order(&mut scheduler, now, 30);
    assert_eq!(order.matches('a').count(), 10, "{order}");
}

#[test]
fn a_tiny_share_still_gets_a_sixty_fourth_and_decisions_end() {
    let mut scheduler = tenant_scheduler();
    let now = Instant::now();
    scheduler.enqueued(&"a/1", 1..1_000);
    scheduler.enqueued(&"b/1", 1..1_000);
    scheduler.set_tenant_shares([("a", 1), ("b", 0)]);
    let order = tenant_order(&mut scheduler, now, 130);
    assert_eq!(order.len(), 130);
    assert_eq!(
        order.matches('a').count(),
        65,
        "both at the minimum: {order}"
    );
}

#[test]
fn shares_multiply_tenant_weights() {
    let mut scheduler = tenant_scheduler();
    let now = Instant::now();
    scheduler.set_tenant_weight(&"a", Some(3));
    scheduler.enqueued(&"a/1", 1..1_000);
    scheduler.enqueued(&"b/1", 1..1_000);
    scheduler.set_tenant_shares([("a", crate::WHOLE_SHARE / 3 + 1)]);
    let order = tenant_order(&mut scheduler, now, 200);
    assert_eq!(order.matches('a').count(), 100, "{order}");
    let mut reported = scheduler.backlogged_tenant_weights();
    reported.sort();
    assert_eq!(reported, [("a", 1, 3), ("b", 1, 1)]);
}
