//! Single decisions of the dispatch book, each named after the bug it prevents.

use std::time::Duration;

use floret_store::policy::Policy;

use super::{Harness, LEASE_TIMEOUT, MAX_CREDITS, TENANT, owner};
use crate::deliver::book::pump::DISCARDS_PER_PUMP;
use crate::deliver::{ConsumerEvent, SettleCode, SettleKind, SettledBy, TenantShare};
use crate::delivery_id::DeliveryId;

fn id(producer: &str, sequence: u64, attempt: u32) -> DeliveryId {
    DeliveryId {
        shard: 0,
        queue: "q".to_owned(),
        producer: producer.to_owned(),
        sequence,
        attempt,
    }
}

fn led_harness() -> Harness {
    let mut harness = Harness::new(1);
    harness.leadership(0, true);
    harness
}

#[test]
fn acked_message_is_not_redelivered_while_its_removal_commits() {
    let mut harness = led_harness();
    harness.produce(0, "q", "a", 1, None);
    let consumer = harness.subscribe("q", 2);
    assert_eq!(harness.take_deliveries(), vec![(consumer, id("a", 0, 1))]);
    let outcome = harness.settle(SettleKind::Ack, &id("a", 0, 1), false);
    assert_eq!(outcome.code, SettleCode::Ok);
    assert_eq!(outcome.removal, Some(id("a", 0, 1)));
    harness.advance(LEASE_TIMEOUT - Duration::from_millis(1));
    assert!(harness.take_deliveries().is_empty());
    let now = harness.now();
    harness.book.removal_committed(&[id("a", 0, 1)], true, now);
    harness.advance(LEASE_TIMEOUT);
    assert!(
        harness.take_deliveries().is_empty(),
        "an acked lease came back"
    );
}

#[test]
fn settle_tells_a_message_that_never_existed_from_an_acked_one() {
    let mut harness = led_harness();
    harness.produce(0, "q", "a", 1, None);
    harness.subscribe("q", 1);
    harness.take_deliveries();
    assert_eq!(
        harness.settle(SettleKind::Ack, &id("a", 0, 1), true).code,
        SettleCode::Ok
    );
    let again = harness.settle(SettleKind::Ack, &id("a", 0, 1), true);
    assert_eq!(
        (again.code, again.message.as_str()),
        (SettleCode::Ok, "already acked")
    );
    let nack = harness.settle(SettleKind::Nack, &id("a", 0, 1), true);
    assert_eq!(nack.code, SettleCode::FailedPrecondition);
    let never = harness.settle(SettleKind::Ack, &id("a", 5, 1), true);
    assert_eq!(never.code, SettleCode::NotFound);
    let unknown_producer = harness.settle(SettleKind::Ack, &id("zz", 0, 1), true);
    assert_eq!(unknown_producer.code, SettleCode::NotFound);
}

#[test]
fn ack_of_a_lapsed_attempt_does_not_settle_the_redelivery() {
    let mut harness = led_harness();
    harness.produce(0, "q", "a", 1, None);
    let consumer = harness.subscribe("q", 2);
    harness.take_deliveries();
    harness.advance(LEASE_TIMEOUT);
    assert_eq!(harness.take_deliveries(), vec![(consumer, id("a", 0, 2))]);
    let late = harness.settle(SettleKind::Ack, &id("a", 0, 1), true);
    assert_eq!(late.code, SettleCode::FailedPrecondition);
    assert!(harness.stored(0, "q", "a", 0));
}

#[test]
fn settle_after_losing_the_shard_is_refused_not_applied() {
    let mut harness = led_harness();
    harness.produce(0, "q", "a", 1, None);
    harness.subscribe("q", 1);
    harness.take_deliveries();
    harness.leadership(0, false);
    let outcome = harness.settle(SettleKind::Ack, &id("a", 0, 1), true);
    assert_eq!(outcome.code, SettleCode::FailedPrecondition);
    assert_eq!(outcome.removal, None);
    let malformed = harness.book.settle(
        SettleKind::Ack,
        vec![Err("x".to_owned())],
        &SettledBy::Tenant(TENANT.into()),
        harness.now(),
    );
    assert_eq!(malformed[0].code, SettleCode::InvalidArgument);
    let no_shard = DeliveryId {
        shard: 9,
        ..id("a", 0, 1)
    };
    let outcome = harness.settle(SettleKind::Ack, &no_shard, true);
    assert_eq!(outcome.code, SettleCode::NotFound);
}

#[test]
fn credits_granted_past_the_maximum_are_capped() {
    let mut harness = led_harness();
    harness.produce(0, "q", "a", u64::from(MAX_CREDITS) + 5, None);
    harness.subscribe("q", MAX_CREDITS + 500);
    assert_eq!(harness.take_deliveries().len(), MAX_CREDITS as usize);
}

#[test]
fn closed_stream_hands_its_message_to_the_next_consumer() {
    let mut harness = led_harness();
    let first = harness.subscribe("q", 1);
    let second = harness.subscribe("q", 1);
    harness.close(first);
    harness.produce(0, "q", "a", 1, None);
    assert_eq!(harness.take_deliveries(), vec![(second, id("a", 0, 2))]);
}

#[test]
fn a_backlog_expired_in_an_outage_is_discarded_in_bounded_steps() {
    let mut harness = led_harness();
    let count = DISCARDS_PER_PUMP as u64 + 10;
    harness.produce(0, "q", "a", count, None);
    let ttl = Policy {
        ttl_ms: Some(1_000),
        ..Policy::default()
    };
    harness.set_policy(0, "q", None, ttl);
    harness.advance(Duration::from_secs(2));
    harness.subscribe("q", 5);
    let first: usize = harness.pending_discards.iter().map(|d| d.ids.len()).sum();
    assert_eq!(first, DISCARDS_PER_PUMP);
    assert_eq!(harness.commit_discards(), DISCARDS_PER_PUMP);
    assert_eq!(harness.commit_discards(), 10, "the commit pumps the rest");
    assert_eq!(harness.stored_count(), 0);
    assert!(harness.take_deliveries().is_empty());
}

#[test]
fn outbox_counts_first_deliveries_and_lapsed_leases() {
    let mut harness = led_harness();
    harness.produce(0, "q", "a", 3, None);
    harness.subscribe("q", 3);
    harness.take_deliveries();
    let outbox = harness.book.take_outbox();
    assert_eq!(
        (outbox.first_deliveries.len(), outbox.lease_expiries),
        (0, 0),
        "taken by the harness"
    );
    let now = harness.now();
    let later = super::Now {
        instant: now.instant + LEASE_TIMEOUT,
        unix_ms: now.unix_ms + LEASE_TIMEOUT.as_millis() as u64,
    };
    harness.book.tick(later);
    let outbox = harness.book.take_outbox();
    assert_eq!(outbox.lease_expiries, 3);
    assert!(
        harness.take_deliveries().is_empty(),
        "the consumer has no credit left"
    );
}

#[test]
fn next_deadline_is_the_earliest_lease_held_message_or_backlog_report() {
    let mut harness = led_harness();
    assert_eq!(harness.book.next_deadline(harness.now()), None);
    harness.produce(0, "q", "a", 1, Some(5_000));
    harness.subscribe("q", 1);
    let now = harness.now();
    assert_eq!(
        harness.book.next_deadline(now),
        Some(now.instant + crate::deliver::book::BACKLOG_REPORT_GAP),
        "the held message left the backlog: the report of that waits for the gap"
    );
    harness.advance(crate::deliver::book::BACKLOG_REPORT_GAP);
    let now = harness.now();
    assert_eq!(
        harness.book.next_deadline(now),
        Some(now.instant + Duration::from_secs(5) - crate::deliver::book::BACKLOG_REPORT_GAP)
    );
}

#[test]
fn subscribes_to_new_queue_names_leave_entries_walked_for_good() {
    let mut harness = led_harness();
    for i in 0..100 {
        let consumer = harness.subscribe(&format!("probe-{i}"), 1);
        harness.gone(consumer);
    }
    assert_eq!(harness.book.queue_count(), 0);

    harness.produce(0, "backlogged", "a", 1, None);
    let weighted = Policy {
        weight: Some(3),
        ..Policy::default()
    };
    harness.set_policy(0, "governed", None, weighted);
    for queue in ["backlogged", "governed"] {
        let consumer = harness.subscribe(queue, 0);
        harness.gone(consumer);
    }
    assert_eq!(
        harness.book.queue_count(),
        2,
        "a queue with a backlog or a policy keeps its entry"
    );

    let consumer = harness.subscribe("backlogged", 1);
    let (_, delivered) = harness.take_deliveries().remove(0);
    harness.settle(SettleKind::Ack, &delivered, true);
    harness.gone(consumer);
    assert_eq!(
        harness.book.queue_count(),
        1,
        "a drained queue without consumers is dropped; the governed one stays"
    );
}

#[test]
fn a_delivery_cannot_be_settled_on_another_stream_even_of_its_tenant() {
    let mut harness = led_harness();
    harness.produce(0, "q", "a", 1, None);
    harness.subscribe_as("q", 1, owner(TENANT, 1));
    harness.take_deliveries();
    let ticket = harness.ticket(&id("a", 0, 1));
    for kind in [SettleKind::Ack, SettleKind::Nack, SettleKind::DeadLetter] {
        let other_stream = SettledBy::Stream(owner(TENANT, 2));
        let refused = harness.settle_as(kind, ticket.clone(), &other_stream, true);
        assert_eq!(refused.code, SettleCode::PermissionDenied, "{kind:?}");
        assert_eq!(refused.removal, None);
    }
    assert!(
        harness.take_deliveries().is_empty(),
        "a refused nack redelivered"
    );
    let own_stream = SettledBy::Stream(owner(TENANT, 1));
    let acked = harness.settle_as(SettleKind::Ack, ticket, &own_stream, true);
    assert_eq!(acked.code, SettleCode::Ok);
    assert!(!harness.stored(0, "q", "a", 0));
}

#[test]
fn another_tenant_cannot_ack_or_nack_a_delivery_through_ack() {
    let mut harness = led_harness();
    harness.produce(0, "q", "a", 1, None);
    harness.subscribe_as("q", 1, owner("acme", 1));
    harness.take_deliveries();
    let ticket = harness.ticket(&id("a", 0, 1));
    let intruder = SettledBy::Tenant("globex".into());
    for kind in [SettleKind::Ack, SettleKind::Nack] {
        let refused = harness.settle_as(kind, ticket.clone(), &intruder, true);
        assert_eq!(refused.code, SettleCode::PermissionDenied);
        assert!(
            !refused.message.contains("acme"),
            "the refusal names the holder: {}",
            refused.message
        );
    }
    assert!(harness.stored(0, "q", "a", 0));
    let own_tenant = SettledBy::Tenant("acme".into());
    let acked = harness.settle_as(SettleKind::Ack, ticket, &own_tenant, true);
    assert_eq!(acked.code, SettleCode::Ok);
}

#[test]
fn a_guessed_delivery_id_names_no_delivery() {
    let mut harness = led_harness();
    harness.produce(0, "q", "a", 1, None);
    harness.subscribe_as("q", 1, owner(TENANT, 1));
    harness.take_deliveries();
    let mut guessed = harness.ticket(&id("a", 0, 1));
    guessed.nonce = guessed.nonce.wrapping_add(1);
    let holder = SettledBy::Stream(owner(TENANT, 1));
    let refused = harness.settle_as(SettleKind::Ack, guessed, &holder, true);
    assert_eq!(refused.code, SettleCode::NotFound);
    assert!(harness.stored(0, "q", "a", 0));
}

#[test]
fn each_delivery_of_a_message_gets_a_fresh_random_part() {
    let mut harness = led_harness();
    harness.produce(0, "q", "a", 1, None);
    harness.subscribe("q", 2);
    harness.take_deliveries();
    let first = harness.ticket(&id("a", 0, 1));
    harness.settle(SettleKind::Nack, &id("a", 0, 1), true);
    harness.take_deliveries();
    let second = harness.ticket(&id("a", 0, 2));
    assert_ne!(first.nonce, second.nonce);
    assert_ne!(second.nonce, 0);
}

/// Tenants of `deliveries` in order, one letter each (`a` for `acme`).
fn tenant_letters(deliveries: &[(u64, DeliveryId)]) -> String {
    deliveries
        .iter()
        .map(|(_, id)| id.producer.chars().next().unwrap())
        .collect()
}

#[test]
fn a_tenant_with_most_of_its_backlog_elsewhere_gets_its_share_here() {
    let mut harness = Harness::namespaced(1);
    harness.leadership(0, true);
    harness.produce(0, "q", "acme/p1", 100, None);
    harness.produce(0, "q", "initech/p1", 100, None);
    let consumer = harness.subscribe("q", 0);
    let reports: Vec<_> = harness
        .take_events()
        .into_iter()
        .filter_map(|(_, event)| match event {
            ConsumerEvent::Backlog(report) => Some(report),
            _ => None,
        })
        .collect();
    let tenants: Vec<(&str, u64)> = reports[0]
        .tenants
        .iter()
        .map(|tenant| (tenant.tenant.as_str(), tenant.producer_weight))
        .collect();
    assert_eq!(tenants, [("acme", 1), ("initech", 1)]);
    let now = harness.now();
    harness.book.tenant_shares(
        consumer,
        vec![TenantShare {
            tenant: "acme".into(),
            share: floret_sched::WHOLE_SHARE / 3 + 1,
        }],
        now,
    );
    harness.credit(consumer, 40, false);
    let order = tenant_letters(&harness.take_deliveries());
    assert_eq!(order.matches('a').count(), 10, "{order}");
}

#[test]
fn a_tenant_policy_weighs_the_tenant_not_a_producer() {
    let mut harness = Harness::namespaced(1);
    harness.leadership(0, true);
    harness.produce(0, "q", "acme/p1", 100, None);
    harness.produce(0, "q", "acme/p2", 100, None);
    harness.produce(0, "q", "initech/p1", 100, None);
    let weight_three = Policy {
        weight: Some(3),
        ..Policy::default()
    };
    harness.set_policy(0, "q", Some("acme/"), weight_three);
    harness.subscribe("q", 40);
    let order = tenant_letters(&harness.take_deliveries());
    assert_eq!(order.matches('a').count(), 30, "{order}");
}

#[test]
fn a_redelivery_was_counted_as_a_wait_to_first_delivery() {
    let mut harness = led_harness();
    harness.produce(0, "q", "a", 2, None);
    harness.advance(Duration::from_millis(300));
    harness.subscribe("q", 2);
    harness.take_deliveries();
    assert_eq!(
        harness.first_deliveries,
        [("q".to_owned(), 300), ("q".to_owned(), 300)],
        "each first delivery with its wait since commit"
    );
    let now = harness.now();
    harness.book.tick(super::Now {
        instant: now.instant + LEASE_TIMEOUT,
        unix_ms: now.unix_ms + LEASE_TIMEOUT.as_millis() as u64,
    });
    harness.subscribe("q", 2);
    assert_eq!(harness.take_deliveries().len(), 2, "delivered again");
    assert_eq!(
        harness.first_deliveries.len(),
        2,
        "redeliveries after lapsed leases are not first deliveries"
    );
}
