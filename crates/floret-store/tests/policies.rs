//! Policies applied by the state machine: limits and their overflow actions,
//! dead letters, delayed messages, backlog totals, and policies surviving a
//! reopen and a snapshot.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use floret_store::policy::{Overflow, Policy};
use floret_store::records::ProducerRecord;
use floret_store::{
    AppliedEvent, Command, CommandReply, Database, DeadLetterReason, DeadLetterSelection,
    DelayedEnqueue, Discard, Discarded, Enqueue, GroupTotals, IdleProducer, MessageRef, NewMessage,
    Op, OpReply, SetPolicy, StateMachine, TypeConfig,
};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

const QUEUE: &str = "q";

fn entry(index: u64, ops: Vec<Op>) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Command { ops }),
    }
}

fn enqueue(producer: &str, payloads: &[&str]) -> Op {
    Op::Enqueue(Enqueue {
        queue: QUEUE.into(),
        producer: producer.into(),
        producer_sequence: None,
        enqueued_at_ms: 1_000,
        messages: payloads
            .iter()
            .map(|p| NewMessage {
                payload: p.as_bytes().to_vec(),
                headers: BTreeMap::new(),
            })
            .collect(),
    })
}

fn set_policy(producer: Option<&str>, policy: Policy) -> Op {
    Op::SetPolicy(SetPolicy {
        queue: QUEUE.into(),
        producer: producer.map(str::to_owned),
        policy,
        replace: false,
    })
}

fn limit(max_messages: u64, overflow: Overflow) -> Policy {
    Policy {
        max_messages: Some(max_messages),
        overflow: Some(overflow),
        ..Policy::default()
    }
}

/// A state machine on a fresh data dir, recording what it reports.
struct Fixture {
    _dir: tempfile::TempDir,
    _database: Database,
    state_machine: StateMachine,
    events: Arc<Mutex<Vec<AppliedEvent>>>,
    next_index: u64,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let database = Database::open(dir.path()).unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let recorder = events.clone();
        let state_machine = database
            .state_machine(
                0,
                Some(Arc::new(move |event| recorder.lock().unwrap().push(event))),
            )
            .unwrap();
        Self {
            _dir: dir,
            _database: database,
            state_machine,
            events,
            next_index: 1,
        }
    }

    async fn apply(&mut self, ops: Vec<Op>) -> CommandReply {
        let index = self.next_index;
        self.next_index += 1;
        self.state_machine
            .apply(vec![entry(index, ops)])
            .await
            .unwrap()
            .remove(0)
    }

    /// The producer's stored record; it must have one.
    fn record(&self, producer: &str) -> ProducerRecord {
        self.state_machine
            .reader()
            .producer(QUEUE, producer)
            .unwrap()
            .unwrap_or_else(|| panic!("{producer} has no record"))
    }

    fn payloads(&self, producer: &str) -> Vec<String> {
        let reader = self.state_machine.reader();
        let record = self.record(producer);
        (0..record.tail)
            .filter_map(|sequence| reader.message(QUEUE, producer, sequence).unwrap())
            .map(|message| String::from_utf8(message.payload).unwrap())
            .collect()
    }
}

#[tokio::test]
async fn producer_at_max_messages_with_reject_stores_nothing_while_others_produce() {
    let mut fixture = Fixture::new();
    fixture
        .apply(vec![set_policy(None, limit(2, Overflow::Reject))])
        .await;
    fixture.apply(vec![enqueue("flood", &["a", "b"])]).await;
    let reply = fixture
        .apply(vec![enqueue("flood", &["c"]), enqueue("quiet", &["q"])])
        .await;
    assert!(
        matches!(
            reply.replies[0],
            OpReply::OverLimit {
                messages: 2,
                policy: Policy {
                    max_messages: Some(2),
                    ..
                },
                ..
            }
        ),
        "{:?}",
        reply.replies[0]
    );
    assert!(matches!(reply.replies[1], OpReply::Enqueued { .. }));
    assert_eq!(fixture.payloads("flood"), ["a", "b"]);
    assert_eq!(fixture.payloads("quiet"), ["q"]);
}

#[tokio::test]
async fn batch_larger_than_the_limit_is_rejected_whole() {
    let mut fixture = Fixture::new();
    fixture
        .apply(vec![set_policy(None, limit(2, Overflow::Reject))])
        .await;
    let reply = fixture.apply(vec![enqueue("p", &["a", "b", "c"])]).await;
    assert!(matches!(reply.replies[0], OpReply::OverLimit { .. }));
    assert!(
        fixture
            .state_machine
            .reader()
            .message(QUEUE, "p", 0)
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn drop_oldest_keeps_exactly_the_newest_max_messages() {
    let mut fixture = Fixture::new();
    fixture
        .apply(vec![set_policy(Some("p"), limit(3, Overflow::DropOldest))])
        .await;
    fixture.apply(vec![enqueue("p", &["0", "1"])]).await;
    fixture
        .apply(vec![enqueue("p", &["2", "3"]), enqueue("p", &["4", "5"])])
        .await;
    assert_eq!(fixture.payloads("p"), ["3", "4", "5"]);
    let record = fixture.record("p");
    assert_eq!((record.messages, record.head, record.tail), (3, 3, 6));
    let dropped: Vec<u64> = fixture
        .events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|event| match event {
            AppliedEvent::Dropped { below, .. } => Some(*below),
            _ => None,
        })
        .collect();
    assert_eq!(dropped, [1, 3]);
}

#[tokio::test]
async fn max_bytes_with_drop_oldest_counts_stored_bytes() {
    let mut fixture = Fixture::new();
    let one = fixture.apply(vec![enqueue("probe", &["x"])]).await;
    assert!(matches!(one.replies[0], OpReply::Enqueued { .. }));
    let message_bytes = fixture.record("probe").bytes;
    let policy = Policy {
        max_bytes: Some(2 * message_bytes),
        overflow: Some(Overflow::DropOldest),
        ..Policy::default()
    };
    fixture.apply(vec![set_policy(Some("p"), policy)]).await;
    fixture
        .apply(vec![enqueue("p", &["a", "b", "c", "d"])])
        .await;
    assert_eq!(fixture.payloads("p"), ["c", "d"]);
}

#[tokio::test]
async fn dead_letter_oldest_keeps_the_newest_and_replay_puts_the_rest_back() {
    let mut fixture = Fixture::new();
    fixture
        .apply(vec![set_policy(None, limit(2, Overflow::DeadLetterOldest))])
        .await;
    fixture
        .apply(vec![enqueue("p", &["0", "1", "2", "3"])])
        .await;
    assert_eq!(fixture.payloads("p"), ["2", "3"]);
    let reader = fixture.state_machine.reader();
    let dead = reader.dead_letters(QUEUE, 0, 10).unwrap();
    let summary: Vec<_> = dead
        .iter()
        .map(|(id, d)| (*id, d.producer.as_str(), d.sequence, d.reason))
        .collect();
    assert_eq!(
        summary,
        [
            (0, "p", 0, DeadLetterReason::Overflow),
            (1, "p", 1, DeadLetterReason::Overflow)
        ]
    );
    fixture
        .apply(vec![set_policy(
            Some("p"),
            Policy {
                max_messages: Some(10),
                ..Policy::default()
            },
        )])
        .await;
    let reply = fixture
        .apply(vec![Op::ReplayDeadLetters(DeadLetterSelection {
            queue: QUEUE.into(),
            ids: vec![0, 1, 9],
            at_ms: 2_000,
        })])
        .await;
    assert_eq!(reply.replies, [OpReply::Replayed { count: 2 }]);
    assert_eq!(fixture.payloads("p"), ["2", "3", "0", "1"]);
    assert!(reader.dead_letters(QUEUE, 0, 10).unwrap().is_empty());
    let replayed = reader.message(QUEUE, "p", 4).unwrap().unwrap();
    assert_eq!(replayed.enqueued_at_ms, 2_000);
}

#[tokio::test]
async fn discarded_message_is_dead_lettered_or_dropped_as_asked() {
    let mut fixture = Fixture::new();
    fixture.apply(vec![enqueue("p", &["keep", "drop"])]).await;
    let discarded = |sequence, dead_letter| Discarded {
        message: MessageRef {
            queue: QUEUE.into(),
            producer: "p".into(),
            sequence,
        },
        reason: DeadLetterReason::MaxAttempts,
        attempts: 5,
        dead_letter,
    };
    let reply = fixture
        .apply(vec![Op::Discard(Discard {
            at_ms: 3_000,
            messages: vec![discarded(0, true), discarded(1, false), discarded(1, true)],
        })])
        .await;
    assert_eq!(reply.replies, [OpReply::Removed { count: 2 }]);
    let reader = fixture.state_machine.reader();
    let dead = reader.dead_letters(QUEUE, 0, 10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].1.sequence, dead[0].1.attempts), (0, 5));
    assert!(fixture.payloads("p").is_empty());
    let reply = fixture
        .apply(vec![Op::DeleteDeadLetters(DeadLetterSelection {
            queue: QUEUE.into(),
            ids: vec![0],
            at_ms: 4_000,
        })])
        .await;
    assert_eq!(reply.replies, [OpReply::Removed { count: 1 }]);
    assert!(reader.dead_letters(QUEUE, 0, 10).unwrap().is_empty());
}

#[tokio::test]
async fn policy_change_merges_unless_replaced_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let database = Database::open(dir.path()).unwrap();
        let mut state_machine = database.state_machine(0, None).unwrap();
        let weight = Policy {
            weight: Some(3),
            ..Policy::default()
        };
        let replies = state_machine
            .apply(vec![entry(
                1,
                vec![
                    set_policy(Some("p"), weight),
                    set_policy(Some("p"), limit(5, Overflow::DropOldest)),
                    set_policy(
                        None,
                        Policy {
                            priority: Some(2),
                            ..Policy::default()
                        },
                    ),
                ],
            )])
            .await
            .unwrap();
        assert_eq!(
            replies[0].replies[1],
            OpReply::PolicySet {
                policy: Policy {
                    weight: Some(3),
                    ..limit(5, Overflow::DropOldest)
                }
            }
        );
        database.sync().await.unwrap();
    }
    let database = Database::open(dir.path()).unwrap();
    let mut state_machine = database.state_machine(0, None).unwrap();
    let reader = state_machine.reader();
    let effective = reader.policy(QUEUE, "p");
    assert_eq!(
        (effective.weight, effective.max_messages, effective.priority),
        (Some(3), Some(5), Some(2))
    );
    state_machine
        .apply(vec![entry(
            2,
            vec![Op::SetPolicy(SetPolicy {
                queue: QUEUE.into(),
                producer: Some("p".into()),
                policy: Policy::default(),
                replace: true,
            })],
        )])
        .await
        .unwrap();
    assert_eq!(reader.stored_policy(QUEUE, Some("p")), Policy::default());
    assert_eq!(reader.policy(QUEUE, "p").priority, Some(2));
}

#[tokio::test]
async fn snapshot_carries_policies_to_the_replica() {
    use openraft::RaftSnapshotBuilder;

    let mut leader = Fixture::new();
    leader
        .apply(vec![set_policy(Some("p"), limit(7, Overflow::Reject))])
        .await;
    let snapshot = leader
        .state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let mut replica = Fixture::new();
    replica
        .state_machine
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    assert_eq!(
        replica
            .state_machine
            .reader()
            .policy(QUEUE, "p")
            .max_messages,
        Some(7)
    );
}

#[tokio::test]
async fn backlog_totals_follow_every_apply_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    let mut state_machine = database.state_machine(0, None).unwrap();
    let reader = state_machine.reader();
    state_machine
        .apply(vec![entry(
            1,
            vec![enqueue("a", &["x", "y"]), enqueue("b", &["z"])],
        )])
        .await
        .unwrap();
    let totals = reader.totals();
    assert_eq!((totals.messages(), totals.producers()), (3, 2));
    let stored: u64 = reader.producers().map(|p| p.unwrap().record.bytes).sum();
    assert_eq!(totals.bytes(), stored);
    let removal = |producer: &str, sequence| MessageRef {
        queue: QUEUE.into(),
        producer: producer.into(),
        sequence,
    };
    state_machine
        .apply(vec![entry(
            2,
            vec![Op::Remove(vec![removal("b", 0), removal("a", 0)])],
        )])
        .await
        .unwrap();
    assert_eq!((totals.messages(), totals.producers()), (1, 1));
    let remaining = reader.producer(QUEUE, "a").unwrap().unwrap().bytes;
    assert_eq!(totals.bytes(), remaining);
    drop(state_machine);
    let reopened = database.state_machine(0, None).unwrap();
    let totals = reopened.reader();
    assert_eq!(
        (totals.totals().bytes(), totals.totals().messages()),
        (remaining, 1)
    );
}

#[tokio::test]
async fn group_totals_follow_applies_and_a_reopen_so_tenant_limits_see_the_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    let mut state_machine = database.state_machine(0, None).unwrap();
    let reader = state_machine.reader();
    state_machine
        .apply(vec![entry(
            1,
            vec![
                enqueue("acme/a", &["x", "y"]),
                enqueue("acme/b", &["z"]),
                enqueue("globex/a", &["w"]),
                enqueue("plain", &["v"]),
            ],
        )])
        .await
        .unwrap();
    let acme = reader.totals().group(QUEUE, "acme");
    assert_eq!((acme.messages, acme.producers), (3, 2));
    let acme_bytes: u64 = ["acme/a", "acme/b"]
        .iter()
        .map(|p| reader.producer(QUEUE, p).unwrap().unwrap().bytes)
        .sum();
    assert_eq!(acme.bytes, acme_bytes);
    assert_eq!(reader.totals().group(QUEUE, "globex").messages, 1);
    assert_eq!(
        reader.totals().group(QUEUE, "").messages,
        1,
        "an id without a group is in the empty group"
    );
    assert_eq!(
        reader.totals().group("other", "acme"),
        GroupTotals::default()
    );
    let removal = |producer: &str, sequence| MessageRef {
        queue: QUEUE.into(),
        producer: producer.into(),
        sequence,
    };
    state_machine
        .apply(vec![entry(
            2,
            vec![Op::Remove(vec![
                removal("acme/b", 0),
                removal("acme/a", 0),
                removal("globex/a", 0),
            ])],
        )])
        .await
        .unwrap();
    let acme = reader.totals().group(QUEUE, "acme");
    assert_eq!((acme.messages, acme.producers), (1, 1));
    let mut groups = Vec::new();
    reader.totals().for_each_group(|queue, group, totals| {
        groups.push((queue.to_owned(), group.to_owned(), totals.messages))
    });
    groups.sort();
    assert_eq!(
        groups,
        [
            (QUEUE.to_owned(), String::new(), 1),
            (QUEUE.to_owned(), "acme".to_owned(), 1)
        ],
        "a group that holds nothing any more is gone"
    );
    drop(state_machine);
    let reopened = database.state_machine(0, None).unwrap();
    assert_eq!(reopened.reader().totals().group(QUEUE, "acme"), acme);
}

#[tokio::test]
async fn delivery_time_is_kept_until_its_message_is_removed_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    let delayed = |payloads: &[&str]| {
        let Op::Enqueue(enqueue) = enqueue("p", payloads) else {
            unreachable!()
        };
        Op::EnqueueDelayed(DelayedEnqueue {
            enqueue,
            deliver_at_ms: 9_000,
        })
    };
    {
        let mut state_machine = database.state_machine(0, None).unwrap();
        state_machine
            .apply(vec![entry(
                1,
                vec![delayed(&["d0", "d1"]), enqueue("p", &["now"])],
            )])
            .await
            .unwrap();
        let reader = state_machine.reader();
        assert_eq!(reader.deliver_at(QUEUE, "p", 0), Some(9_000));
        assert_eq!(reader.deliver_at(QUEUE, "p", 2), None);
        state_machine
            .apply(vec![entry(
                2,
                vec![Op::Remove(vec![MessageRef {
                    queue: QUEUE.into(),
                    producer: "p".into(),
                    sequence: 0,
                }])],
            )])
            .await
            .unwrap();
        assert_eq!(reader.deliver_at(QUEUE, "p", 0), None);
        let (_, keys_before) = reader.digest().unwrap();
        assert_eq!(
            keys_before, 5,
            "applied, producer, 2 runs (one per produce), 1 delay: the ack at the head left no removal marks"
        );
    }
    let reopened = database.state_machine(0, None).unwrap();
    assert_eq!(reopened.reader().deliver_at(QUEUE, "p", 1), Some(9_000));
}

#[tokio::test]
async fn dropping_a_delayed_message_for_a_limit_drops_its_delivery_time() {
    let mut fixture = Fixture::new();
    fixture
        .apply(vec![set_policy(Some("p"), limit(1, Overflow::DropOldest))])
        .await;
    let Op::Enqueue(first) = enqueue("p", &["late"]) else {
        unreachable!()
    };
    fixture
        .apply(vec![Op::EnqueueDelayed(DelayedEnqueue {
            enqueue: first,
            deliver_at_ms: 9_000,
        })])
        .await;
    fixture.apply(vec![enqueue("p", &["newer"])]).await;
    let reader = fixture.state_machine.reader();
    assert_eq!(reader.deliver_at(QUEUE, "p", 0), None);
    assert_eq!(fixture.payloads("p"), ["newer"]);
    let (_, keys) = reader.digest().unwrap();
    assert_eq!(
        keys, 4,
        "applied, producer, policy, one message: no stale delay key"
    );
}

#[tokio::test]
async fn only_producers_still_idle_without_an_override_are_forgotten() {
    let mut fixture = Fixture::new();
    fixture
        .apply(vec![
            enqueue("idle", &["x"]),
            enqueue("busy", &["x"]),
            enqueue("overridden", &["x"]),
            enqueue("backlogged", &["x", "y"]),
            set_policy(
                Some("overridden"),
                Policy {
                    weight: Some(2),
                    ..Policy::default()
                },
            ),
        ])
        .await;
    let acked = |producer: &str| MessageRef {
        queue: QUEUE.into(),
        producer: producer.into(),
        sequence: 0,
    };
    fixture
        .apply(vec![Op::Remove(vec![
            acked("idle"),
            acked("busy"),
            acked("overridden"),
            acked("backlogged"),
        ])])
        .await;
    fixture.apply(vec![enqueue("busy", &["again"])]).await;
    let seen_idle = |producer: &str| IdleProducer {
        queue: QUEUE.into(),
        producer: producer.into(),
        tail: 1,
    };
    let reply = fixture
        .apply(vec![Op::ForgetIdle(vec![
            seen_idle("idle"),
            seen_idle("busy"),
            seen_idle("overridden"),
            IdleProducer {
                tail: 2,
                ..seen_idle("backlogged")
            },
        ])])
        .await;
    assert_eq!(reply.replies, [OpReply::Removed { count: 1 }]);
    let reader = fixture.state_machine.reader();
    assert_eq!(reader.producer(QUEUE, "idle").unwrap(), None);
    for kept in ["busy", "overridden", "backlogged"] {
        assert!(reader.producer(QUEUE, kept).unwrap().is_some(), "{kept}");
    }
    let reply = fixture.apply(vec![enqueue("idle", &["back"])]).await;
    assert!(matches!(
        reply.replies[0],
        OpReply::Enqueued {
            first_sequence: 0,
            ..
        }
    ));
}

#[tokio::test]
async fn limit_set_earlier_in_the_same_entry_applies_to_the_enqueue_after_it() {
    let mut fixture = Fixture::new();
    let reply = fixture
        .apply(vec![
            set_policy(Some("p"), limit(1, Overflow::Reject)),
            enqueue("p", &["a", "b"]),
        ])
        .await;
    assert!(
        matches!(reply.replies[1], OpReply::OverLimit { .. }),
        "{:?}",
        reply.replies
    );
    assert_eq!(
        fixture
            .state_machine
            .reader()
            .policy(QUEUE, "p")
            .max_messages,
        Some(1)
    );
}

#[tokio::test]
async fn forgetting_an_idle_producer_tells_the_dispatcher() {
    let mut fixture = Fixture::new();
    fixture.apply(vec![enqueue("p", &["x"])]).await;
    fixture
        .apply(vec![Op::Remove(vec![MessageRef {
            queue: QUEUE.into(),
            producer: "p".into(),
            sequence: 0,
        }])])
        .await;
    fixture
        .apply(vec![Op::ForgetIdle(vec![IdleProducer {
            queue: QUEUE.into(),
            producer: "p".into(),
            tail: 1,
        }])])
        .await;
    assert!(
        fixture.events.lock().unwrap().iter().any(
            |event| matches!(event, AppliedEvent::Forgotten { producer, .. } if producer == "p")
        )
    );
}

/// One apply that acks a producer's last message, forgets it, and sees it
/// produce again: the old run's marks sit on disk at the key the new run
/// starts at.
async fn forgotten_and_back_in_one_apply(fixture: &mut Fixture, new_ops: Vec<Op>) {
    fixture.apply(vec![enqueue("p", &["old-0", "old-1"])]).await;
    let acked = |sequence| MessageRef {
        queue: QUEUE.into(),
        producer: "p".into(),
        sequence,
    };
    fixture.apply(vec![Op::Remove(vec![acked(0)])]).await;
    let mut ops = vec![
        Op::Remove(vec![acked(1)]),
        Op::ForgetIdle(vec![IdleProducer {
            queue: QUEUE.into(),
            producer: "p".into(),
            tail: 2,
        }]),
    ];
    ops.extend(new_ops);
    let reply = fixture.apply(ops).await;
    assert_eq!(reply.replies[1], OpReply::Removed { count: 1 });
}

#[tokio::test]
async fn producer_forgotten_and_back_in_one_apply_keeps_its_new_messages_live() {
    let mut fixture = Fixture::new();
    forgotten_and_back_in_one_apply(
        &mut fixture,
        vec![enqueue("p", &["new-0", "new-1", "new-2"])],
    )
    .await;
    assert_eq!(fixture.payloads("p"), ["new-0", "new-1", "new-2"]);
    let record = fixture.record("p");
    assert_eq!((record.messages, record.tail), (3, 3));
}

#[tokio::test]
async fn producer_forgotten_and_back_and_acked_in_one_apply_leaves_no_run_behind() {
    let mut fixture = Fixture::new();
    forgotten_and_back_in_one_apply(
        &mut fixture,
        vec![
            enqueue("p", &["new-0"]),
            Op::Remove(vec![MessageRef {
                queue: QUEUE.into(),
                producer: "p".into(),
                sequence: 0,
            }]),
        ],
    )
    .await;
    let reader = fixture.state_machine.reader();
    assert_eq!(reader.message(QUEUE, "p", 0).unwrap(), None);
    assert_eq!(reader.producer(QUEUE, "p").unwrap().unwrap().messages, 0);
    let (_, keys) = reader.digest().unwrap();
    assert_eq!(
        keys, 2,
        "applied state and the producer record: no run or mark left"
    );
}

#[tokio::test]
async fn dead_letter_named_twice_in_one_replay_is_replayed_once() {
    let mut fixture = Fixture::new();
    fixture
        .apply(vec![set_policy(
            Some("p"),
            limit(1, Overflow::DeadLetterOldest),
        )])
        .await;
    fixture.apply(vec![enqueue("p", &["old", "new"])]).await;
    fixture
        .apply(vec![set_policy(Some("p"), limit(10, Overflow::Reject))])
        .await;
    let reply = fixture
        .apply(vec![Op::ReplayDeadLetters(DeadLetterSelection {
            queue: QUEUE.into(),
            ids: vec![0, 0],
            at_ms: 2_000,
        })])
        .await;
    assert_eq!(reply.replies, [OpReply::Replayed { count: 1 }]);
    assert_eq!(fixture.payloads("p"), ["new", "old"]);
}

#[tokio::test]
async fn dropping_oldest_skips_acked_messages_and_crosses_into_the_next_run() {
    let mut fixture = Fixture::new();
    fixture
        .apply(vec![set_policy(Some("p"), limit(4, Overflow::DropOldest))])
        .await;
    fixture.apply(vec![enqueue("p", &["a", "b", "c"])]).await;
    fixture
        .apply(vec![Op::Remove(vec![MessageRef {
            queue: QUEUE.into(),
            producer: "p".into(),
            sequence: 1,
        }])])
        .await;
    fixture.apply(vec![enqueue("p", &["d", "e", "f"])]).await;
    assert_eq!(fixture.payloads("p"), ["c", "d", "e", "f"]);
    fixture.apply(vec![enqueue("p", &["g", "h"])]).await;
    assert_eq!(fixture.payloads("p"), ["e", "f", "g", "h"]);
    let reader = fixture.state_machine.reader();
    let (_, keys) = reader.digest().unwrap();
    assert_eq!(
        keys, 5,
        "applied, producer, policy and two runs: the emptied first run is gone, and drops at the head left no removal marks"
    );
    assert_eq!(reader.totals().messages(), 4);
}
