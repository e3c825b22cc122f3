//! The state machine applied through openraft's trait, then reopened from its files.

use std::collections::BTreeMap;

use floret_store::{
    Command, CommandReply, Database, Enqueue, MessageRef, NewMessage, Op, OpReply, StateMachine,
    TypeConfig,
};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn enqueue(producer: &str, payloads: &[&str], producer_sequence: Option<u64>) -> Op {
    Op::Enqueue(Enqueue {
        queue: "default".into(),
        producer: producer.into(),
        producer_sequence,
        enqueued_at_ms: 1_700_000_000_000,
        messages: payloads
            .iter()
            .map(|p| NewMessage {
                payload: p.as_bytes().to_vec(),
                headers: BTreeMap::from([("k".to_owned(), "v".to_owned())]),
            })
            .collect(),
    })
}

fn entry(index: u64, ops: Vec<Op>) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Command { ops }),
    }
}

fn removal(producer: &str, sequence: u64) -> MessageRef {
    MessageRef {
        queue: "default".into(),
        producer: producer.into(),
        sequence,
    }
}

async fn apply(
    state_machine: &mut StateMachine,
    entries: Vec<Entry<TypeConfig>>,
) -> Vec<CommandReply> {
    state_machine.apply(entries).await.expect("apply")
}

#[tokio::test]
async fn applied_state_survives_reopening_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    {
        let database = Database::open(dir.path()).unwrap();
        let mut state_machine = database.state_machine(3, None).unwrap();
        let replies = apply(
            &mut state_machine,
            vec![
                entry(
                    1,
                    vec![
                        enqueue("a", &["a0", "a1", "a2"], None),
                        enqueue("b", &["b0"], None),
                    ],
                ),
                entry(
                    2,
                    vec![
                        Op::Remove(vec![removal("a", 1), removal("a", 0)]),
                        enqueue("a", &["a3"], None),
                    ],
                ),
            ],
        )
        .await;
        assert_eq!(
            replies[1].replies,
            vec![
                OpReply::Removed { count: 2 },
                OpReply::Enqueued {
                    first_sequence: 3,
                    count: 1,
                    duplicate: false
                }
            ]
        );
        database.sync().await.unwrap();
        drop(state_machine);
        database.close();
    }
    let database = Database::open(dir.path()).unwrap();
    let mut state_machine = database.state_machine(3, None).unwrap();
    let (last_applied, _) = state_machine.applied_state().await.unwrap();
    assert_eq!(last_applied, Some(log_id(2)));
    let reader = state_machine.reader();
    let a = reader.producer("default", "a").unwrap().unwrap();
    assert_eq!((a.tail, a.messages, a.acked), (4, 2, 2));
    assert_eq!(reader.message("default", "a", 1).unwrap(), None);
    assert_eq!(
        reader.message("default", "a", 2).unwrap().unwrap().payload,
        b"a2"
    );
    assert_eq!(
        reader.oldest_message("default", "a", 0).unwrap().unwrap().0,
        2
    );
    let producers: Vec<_> = reader.producers().map(|p| p.unwrap().producer).collect();
    assert_eq!(producers, vec!["a", "b"]);
}

#[tokio::test]
async fn retried_batch_with_same_producer_sequence_is_not_stored_twice() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    let mut state_machine = database.state_machine(0, None).unwrap();
    let replies = apply(
        &mut state_machine,
        vec![
            entry(1, vec![enqueue("p", &["x", "y"], Some(7))]),
            entry(
                2,
                vec![
                    enqueue("p", &["x", "y"], Some(7)),
                    enqueue("p", &["old"], Some(6)),
                ],
            ),
        ],
    )
    .await;
    assert_eq!(
        replies[1].replies,
        vec![
            OpReply::Enqueued {
                first_sequence: 0,
                count: 2,
                duplicate: true
            },
            OpReply::StaleProducerSequence { last: 7 }
        ]
    );
    let record = state_machine
        .reader()
        .producer("default", "p")
        .unwrap()
        .unwrap();
    assert_eq!((record.tail, record.messages), (2, 2));
}

#[tokio::test]
async fn removing_a_message_twice_counts_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    let mut state_machine = database.state_machine(0, None).unwrap();
    let replies = apply(
        &mut state_machine,
        vec![
            entry(1, vec![enqueue("p", &["x"], None)]),
            entry(
                2,
                vec![
                    Op::Remove(vec![removal("p", 0), removal("p", 0)]),
                    Op::Remove(vec![removal("p", 0)]),
                ],
            ),
        ],
    )
    .await;
    assert_eq!(
        replies[1].replies,
        vec![OpReply::Removed { count: 1 }, OpReply::Removed { count: 0 }]
    );
    let record = state_machine
        .reader()
        .producer("default", "p")
        .unwrap()
        .unwrap();
    assert_eq!((record.messages, record.bytes, record.acked), (0, 0, 1));
}

#[test]
fn foreign_directory_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not floret").unwrap();
    let error = Database::open(dir.path()).err().expect("must refuse");
    assert!(
        error.to_string().contains("not a floret data dir"),
        "{error}"
    );
}

#[test]
fn second_node_on_the_same_data_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Database::open(dir.path()).unwrap();
    let error = Database::open(dir.path()).err().expect("must refuse");
    assert!(error.to_string().contains("in use"), "{error}");
}

#[tokio::test]
async fn snapshot_installed_on_an_empty_replica_reproduces_the_state() {
    use openraft::RaftSnapshotBuilder;

    let source_dir = tempfile::tempdir().unwrap();
    let source = Database::open(source_dir.path()).unwrap();
    let mut leader = source.state_machine(2, None).unwrap();
    apply(
        &mut leader,
        vec![
            entry(
                1,
                vec![
                    enqueue("a", &["a0", "a1"], Some(1)),
                    enqueue("b", &["b0"], None),
                ],
            ),
            entry(2, vec![Op::Remove(vec![removal("a", 0)])]),
        ],
    )
    .await;
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(2)));

    let replica_dir = tempfile::tempdir().unwrap();
    let replica_db = Database::open(replica_dir.path()).unwrap();
    let mut replica = replica_db.state_machine(2, None).unwrap();
    apply(
        &mut replica,
        vec![entry(1, vec![enqueue("stale", &["x"], None)])],
    )
    .await;
    replica
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();

    let (applied, _) = replica.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(2)));
    let (leader_reader, replica_reader) = (leader.reader(), replica.reader());
    let producers = |reader: &floret_store::ShardReader| {
        reader.producers().map(|p| p.unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(producers(&replica_reader), producers(&leader_reader));
    assert_eq!(replica_reader.message("default", "stale", 0).unwrap(), None);
    assert_eq!(
        replica_reader
            .message("default", "a", 1)
            .unwrap()
            .unwrap()
            .payload,
        b"a1"
    );
    let current = replica
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("installed snapshot is current");
    assert_eq!(current.meta, snapshot.meta);
}

/// A small deterministic generator, so a failing case replays exactly.
struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// Messages are stored in runs (one per produce call, split past 32 KiB)
/// and removed by marks: whatever order acks come in, in whichever entry,
/// every message not yet removed reads back whole, removed ones read as
/// gone, the counters agree, and once everything is acked no run or mark
/// is left behind.
#[tokio::test]
async fn acks_in_any_order_leave_every_other_message_of_its_run_readable() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    let mut state_machine = database.state_machine(0, None).unwrap();
    let reader = state_machine.reader();
    let producers = ["p0", "p1", "p2"];
    let mut random = Xorshift(0x9e37_79b9_7f4a_7c15);
    let mut model: BTreeMap<(&str, u64), String> = BTreeMap::new();
    let mut tails = BTreeMap::from(producers.map(|p| (p, 0u64)));
    for index in 1..=60 {
        let mut ops = Vec::new();
        for _ in 0..random.below(3) {
            let producer = producers[random.below(3) as usize];
            let count = 1 + random.below(250);
            let payloads: Vec<String> = (0..count)
                .map(|n| {
                    format!(
                        "{producer}-{index}-{n}-{}",
                        "x".repeat(random.below(400) as usize)
                    )
                })
                .collect();
            let tail = tails.get_mut(producer).unwrap();
            for payload in &payloads {
                model.insert((producer, *tail), payload.clone());
                *tail += 1;
            }
            let payloads: Vec<&str> = payloads.iter().map(String::as_str).collect();
            ops.push(enqueue(producer, &payloads, None));
        }
        let mut removals = Vec::new();
        for _ in 0..random.below(120) {
            let producer = producers[random.below(3) as usize];
            let sequence = random.below(tails[producer] + 5);
            model.remove(&(producer, sequence));
            removals.push(removal(producer, sequence));
        }
        ops.push(Op::Remove(removals));
        apply(&mut state_machine, vec![entry(index, ops)]).await;
        for producer in producers {
            for sequence in 0..tails[producer] + 2 {
                let stored = reader.message("default", producer, sequence).unwrap();
                assert_eq!(
                    stored.map(|m| String::from_utf8(m.payload).unwrap()),
                    model.get(&(producer, sequence)).cloned(),
                    "{producer} {sequence} after entry {index}"
                );
            }
            let from = random.below(tails[producer] + 1);
            let oldest = reader.oldest_message("default", producer, from).unwrap();
            let expected = model
                .range((producer, from)..(producer, u64::MAX))
                .next()
                .map(|(&(_, sequence), payload)| (sequence, payload.clone()));
            assert_eq!(
                oldest.map(|(sequence, m)| (sequence, String::from_utf8(m.payload).unwrap())),
                expected,
                "oldest of {producer} from {from} after entry {index}"
            );
            let stored = model.keys().filter(|(p, _)| *p == producer).count() as u64;
            let record = reader.producer("default", producer).unwrap();
            assert_eq!(record.map_or(0, |r| r.messages), stored);
        }
    }
    let everything = model
        .keys()
        .map(|&(producer, sequence)| removal(producer, sequence))
        .collect();
    apply(
        &mut state_machine,
        vec![entry(61, vec![Op::Remove(everything)])],
    )
    .await;
    let (_, keys) = reader.digest().unwrap();
    assert_eq!(
        keys, 4,
        "applied state and 3 producer records: no run or mark left"
    );
    assert_eq!(reader.totals().messages(), 0);
    assert_eq!(reader.totals().bytes(), 0);
}
