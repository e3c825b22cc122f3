//! Hand-made histories, valid and invalid, for the checker.

use super::*;
use crate::history::{Event, MessageId, Outcome, Payload, Record, producer_name};

/// Builds a history one event at a time, one millisecond apart.
#[derive(Default)]
struct History {
    records: Vec<Record>,
}

fn id(producer: u32, counter: u64) -> MessageId {
    MessageId { producer, counter }
}

impl History {
    fn push(&mut self, event: Event) -> &mut Self {
        let at_us = self.records.len() as u64 * 1_000;
        self.records.push(Record { at_us, event });
        self
    }

    fn sent(&mut self, id: MessageId, outcome: Outcome) -> &mut Self {
        self.push(Event::Invoked(id));
        self.push(Event::Completed { id, outcome })
    }

    fn acked(&mut self, id: MessageId, sequence: u64) -> &mut Self {
        self.sent(id, Outcome::Acknowledged { sequence })
    }

    fn delivered(&mut self, consumer: u32, id: MessageId, sequence: u64) -> &mut Self {
        self.push(Event::Delivered {
            consumer,
            session: 0,
            producer_id: producer_name(id.producer),
            sequence,
            attempt: 1,
            payload: Payload::Intact(id),
        })
    }

    fn check(&self) -> Report {
        check(&self.records)
    }
}

fn unknown() -> Outcome {
    Outcome::Unknown {
        error: "UNAVAILABLE".into(),
    }
}

#[test]
fn a_clean_history_is_valid_and_counted() {
    let mut h = History::default();
    h.acked(id(0, 1), 0).acked(id(0, 2), 1).acked(id(1, 1), 0);
    h.delivered(0, id(0, 1), 0)
        .delivered(1, id(1, 1), 0)
        .delivered(0, id(0, 2), 1);
    let report = h.check();
    assert!(report.is_valid(), "{:?}", report.violations());
    assert_eq!(
        (report.attempted, report.acknowledged, report.delivered),
        (3, 3, 3)
    );
    assert_eq!(report.duplicated, 0);
}

#[test]
fn an_acknowledged_message_never_delivered_is_lost() {
    let mut h = History::default();
    h.acked(id(0, 1), 0).acked(id(0, 2), 1);
    h.delivered(0, id(0, 1), 0);
    let report = h.check();
    assert_eq!(report.lost, vec![id(0, 2)]);
    assert!(!report.is_valid());
    assert!(report.violations()[0].starts_with("1 lost"));
}

#[test]
fn unknown_outcomes_may_go_either_way_and_count_as_recovered_when_delivered() {
    let mut h = History::default();
    h.sent(id(0, 1), unknown()).sent(id(0, 2), unknown());
    h.delivered(0, id(0, 2), 0);
    let report = h.check();
    assert!(report.is_valid(), "{:?}", report.violations());
    assert_eq!((report.unknown, report.recovered), (2, 1));
}

#[test]
fn a_message_never_sent_or_refused_for_sure_is_unexpected() {
    let mut h = History::default();
    h.sent(
        id(0, 1),
        Outcome::Failed {
            error: "INVALID_ARGUMENT".into(),
        },
    );
    h.delivered(0, id(0, 1), 0).delivered(0, id(3, 9), 0);
    let report = h.check();
    assert_eq!(report.unexpected.len(), 2, "{:?}", report.unexpected);
    assert!(!report.is_valid());
}

#[test]
fn damaged_payloads_and_a_sequence_with_two_messages_are_corrupted() {
    let mut h = History::default();
    h.acked(id(0, 1), 0).acked(id(0, 2), 1);
    h.push(Event::Delivered {
        consumer: 0,
        session: 0,
        producer_id: producer_name(0),
        sequence: 0,
        attempt: 1,
        payload: Payload::Corrupt("checksum mismatch".into()),
    });
    h.delivered(0, id(0, 1), 0).delivered(1, id(0, 2), 0);
    h.delivered(0, id(1, 5), 3);
    let report = h.check();
    assert_eq!(report.corrupted.len(), 3, "{:?}", report.corrupted);
}

#[test]
fn a_payload_under_another_producers_id_is_corrupted() {
    let mut h = History::default();
    h.acked(id(0, 1), 0);
    h.push(Event::Delivered {
        consumer: 0,
        session: 0,
        producer_id: producer_name(1),
        sequence: 0,
        attempt: 1,
        payload: Payload::Intact(id(0, 1)),
    });
    let report = h.check();
    assert_eq!(report.corrupted.len(), 1);
    assert_eq!(report.lost, vec![id(0, 1)]);
}

#[test]
fn redeliveries_are_allowed_and_counted_as_duplicates() {
    let mut h = History::default();
    h.acked(id(0, 1), 0);
    h.delivered(0, id(0, 1), 0).delivered(1, id(0, 1), 0);
    h.push(Event::Settled { id: id(0, 1) });
    h.delivered(2, id(0, 1), 0);
    let report = h.check();
    assert!(report.is_valid());
    assert_eq!((report.duplicated, report.delivered_after_ack), (2, 1));
}

#[test]
fn a_later_acknowledged_attempt_with_a_lower_sequence_is_an_order_violation() {
    let mut h = History::default();
    h.acked(id(0, 1), 5).acked(id(0, 2), 4);
    h.delivered(0, id(0, 2), 4).delivered(1, id(0, 1), 5);
    let report = h.check();
    assert_eq!(report.order_violations.len(), 1, "{report:?}");
}

#[test]
fn deliveries_arriving_out_of_order_are_not_order_violations() {
    let mut h = History::default();
    h.acked(id(0, 1), 0).acked(id(0, 2), 1);
    h.delivered(0, id(0, 1), 0)
        .delivered(0, id(0, 2), 1)
        .delivered(0, id(0, 1), 0);
    h.acked(id(0, 3), 2).acked(id(0, 4), 3);
    h.delivered(1, id(0, 4), 3).delivered(0, id(0, 3), 2);
    let report = h.check();
    assert!(report.is_valid(), "{:?}", report.violations());
}

#[test]
fn unknown_attempts_may_land_out_of_order() {
    let mut h = History::default();
    h.sent(id(0, 1), unknown()).acked(id(0, 2), 0);
    h.delivered(0, id(0, 2), 0).delivered(1, id(0, 1), 1);
    let report = h.check();
    assert!(report.is_valid(), "{:?}", report.violations());
}

/// Two producers backlogged for `seconds`, delivered `a` and `b` per
/// second, then drained at once half a second later.
fn two_backlogged_producers(a: u64, b: u64, seconds: u64) -> Vec<Record> {
    let mut records = Vec::new();
    let total = (a + b) * seconds + 10;
    for producer in 0..2 {
        for counter in 0..total {
            let at_us = counter;
            let id = id(producer, counter);
            records.push(Record {
                at_us,
                event: Event::Invoked(id),
            });
            records.push(Record {
                at_us,
                event: Event::Completed {
                    id,
                    outcome: Outcome::Acknowledged { sequence: counter },
                },
            });
        }
    }
    for second in 0..seconds {
        for (producer, rate) in [(0, a), (1, b)] {
            for i in 0..rate {
                let counter = second * rate + i;
                records.push(Record {
                    at_us: second * 1_000_000 + 1_000 + i * (900_000 / rate),
                    event: Event::Delivered {
                        consumer: 0,
                        session: producer as u64,
                        producer_id: producer_name(producer),
                        sequence: counter,
                        attempt: 1,
                        payload: Payload::Intact(id(producer, counter)),
                    },
                });
            }
        }
    }
    let drained_at = seconds * 1_000_000 + 500_000;
    for (producer, rate) in [(0, a), (1, b)] {
        for counter in rate * seconds..total {
            records.push(Record {
                at_us: drained_at,
                event: Event::Delivered {
                    consumer: 0,
                    session: producer as u64,
                    producer_id: producer_name(producer),
                    sequence: counter,
                    attempt: 1,
                    payload: Payload::Intact(id(producer, counter)),
                },
            });
        }
    }
    records.sort_by_key(|r| r.at_us);
    records
}

#[test]
fn equal_shares_give_a_jain_index_of_one_and_a_hog_less() {
    let (fair, windows) = check(&two_backlogged_producers(50, 50, 5))
        .fairness
        .unwrap();
    assert!((fair - 1.0).abs() < 1e-9, "{fair}");
    assert!(windows >= 4);
    let (skewed, _) = check(&two_backlogged_producers(90, 10, 5))
        .fairness
        .unwrap();
    assert!(
        (skewed - 100.0 * 100.0 / (2.0 * (8100.0 + 100.0))).abs() < 1e-9,
        "{skewed}"
    );
}

#[test]
fn unavailability_is_the_longest_ack_gap_across_a_leader_loss() {
    let mut h = History::default();
    h.acked(id(0, 1), 0);
    h.push(Event::Fault {
        what: "kill".into(),
        leader_loss: true,
    });
    for _ in 0..5 {
        h.push(Event::Invoked(id(1, 9)));
    }
    h.acked(id(0, 2), 1);
    let report = h.check();
    assert_eq!(
        report.unavailability_ms,
        vec![8],
        "completed at 1 ms and at 9 ms"
    );
}

#[test]
fn produce_stall_is_the_time_from_a_call_to_its_answer() {
    let mut h = History::default();
    h.acked(id(0, 1), 0);
    h.push(Event::Invoked(id(1, 1)));
    for _ in 0..5 {
        h.push(Event::Invoked(id(2, 1)));
    }
    h.push(Event::Completed {
        id: id(1, 1),
        outcome: Outcome::Acknowledged { sequence: 0 },
    });
    h.push(Event::Completed {
        id: id(2, 1),
        outcome: unknown(),
    });
    let report = h.check();
    assert_eq!(
        report.produce_ms,
        vec![1, 2, 6],
        "the call whose outcome is unknown counts too"
    );
    assert_eq!(
        (report.produce_p99_ms, report.produce_max_ms),
        (Some(6), Some(6))
    );
    assert_eq!(percentile(&[1, 2, 3, 4], 0.5), Some(3));
    assert_eq!(percentile(&[], 0.99), None);
}

#[test]
fn hand_back_stall_is_the_longest_ack_gap_from_a_restart_to_the_heal() {
    let mut h = History::default();
    h.acked(id(0, 1), 0);
    h.push(Event::Restarted { node: 2 });
    h.acked(id(0, 2), 1);
    for _ in 0..3 {
        h.push(Event::Invoked(id(1, 9)));
    }
    h.acked(id(0, 3), 2);
    h.push(Event::Healed);
    h.acked(id(0, 4), 3);
    for _ in 0..10 {
        h.push(Event::Invoked(id(1, 9)));
    }
    h.acked(id(0, 5), 4);
    let report = h.check();
    assert_eq!(
        report.hand_back_ms,
        vec![5],
        "acks at 4 and 9 ms; the gaps begun before the restart or after the heal do not count"
    );
}

#[test]
fn hog_while_nothing_is_broken_goes_unreported() {
    let skewed = two_backlogged_producers(90, 10, 5);
    let report = check(&skewed);
    let (_, fault_free) = report.fault_free_fairness.expect("fault-free windows");
    assert_eq!(report.unfair_windows.len(), fault_free);
    assert!(
        report
            .violations()
            .iter()
            .any(|v| v.contains("fault-free windows with Jain's index below 0.9")),
        "{:?}",
        report.violations()
    );

    let mut during_a_fault = vec![Record {
        at_us: 0,
        event: Event::Fault {
            what: "kill".into(),
            leader_loss: true,
        },
    }];
    during_a_fault.extend(skewed);
    during_a_fault.push(Record {
        at_us: 500_000,
        event: Event::Healed,
    });
    let report = check(&during_a_fault);
    assert_eq!(
        report.fault_free_fairness, None,
        "every window within the fault or its recovery"
    );
    assert!(report.unfair_windows.is_empty());
    assert!(report.fairness.is_some());
}
