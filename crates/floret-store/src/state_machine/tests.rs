//! Payloads written once: what the state machine stores for an entry the
//! node's own log holds, and what it hands out. Sinks stored and carried
//! by snapshots.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use openraft::Entry;
use openraft::storage::{RaftLogReader, RaftSnapshotBuilder, RaftStateMachine};

use super::test_support::{
    SHARD, append_and_apply, build_snapshot, enqueue_messages, install_snapshot_of, log_id,
    message, ops, payload,
};
use crate::records::{StoredMessage, decode};
use crate::types::{DeadLetterReason, Discard, Discarded, MessageRef, NewMessage, Op, TypeConfig};
use crate::wal::SegmentRuns;
use crate::{Database, SetSink, SinkSpec, SinkTarget, keys};

fn enqueue(index: u64, producer: &str, payloads: &[Vec<u8>]) -> Entry<TypeConfig> {
    let messages = payloads
        .iter()
        .map(|payload| NewMessage {
            payload: payload.clone(),
            headers: BTreeMap::from([("h".to_owned(), "1".to_owned())]),
        })
        .collect();
    enqueue_messages(index, producer, messages)
}

/// Whether any stored value of the shard contains `bytes`.
fn tree_holds(database: &Database, bytes: &[u8]) -> bool {
    let state_machine = database.state_machine(SHARD, None).unwrap();
    state_machine.reader().tree().iter().any(|item| {
        item.unwrap()
            .1
            .windows(bytes.len())
            .any(|window| window == bytes)
    })
}

#[tokio::test]
async fn durable_entry_payload_is_not_copied_into_sled() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    append_and_apply(&database, enqueue(1, "a", &[payload(1), payload(2)]), true).await;
    assert!(!tree_holds(&database, &payload(1)));
    let reader = database.state_machine(SHARD, None).unwrap().reader();
    let read = reader.message("q", "a", 1).unwrap().unwrap();
    assert_eq!(read.payload, payload(2));
    assert_eq!(read.headers["h"], "1");
    assert_eq!(database.wal().pins_of(SHARD).values().sum::<u64>(), 1);
}

#[tokio::test]
async fn entry_not_yet_durable_in_this_log_is_stored_inline() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    append_and_apply(&database, enqueue(1, "a", &[payload(1)]), false).await;
    assert!(tree_holds(&database, &payload(1)));
    assert_eq!(database.wal().pins_of(SHARD), SegmentRuns::new());
    let reader = database.state_machine(SHARD, None).unwrap().reader();
    assert_eq!(
        reader.message("q", "a", 0).unwrap().unwrap().payload,
        payload(1)
    );
}

#[tokio::test]
async fn both_forms_count_the_same_bytes_against_limits() {
    let logged_dir = tempfile::tempdir().unwrap();
    let inline_dir = tempfile::tempdir().unwrap();
    let logged = Database::open(logged_dir.path()).unwrap();
    let inline = Database::open(inline_dir.path()).unwrap();
    append_and_apply(&logged, enqueue(1, "a", &[payload(1), payload(2)]), true).await;
    append_and_apply(&inline, enqueue(1, "a", &[payload(1), payload(2)]), false).await;
    let record = |database: &Database| {
        let reader = database.state_machine(SHARD, None).unwrap().reader();
        reader.producer("q", "a").unwrap().unwrap()
    };
    assert_eq!(record(&logged), record(&inline));
    let digest = |database: &Database| {
        let reader = database.state_machine(SHARD, None).unwrap().reader();
        reader.digest().unwrap()
    };
    assert_eq!(
        digest(&logged),
        digest(&inline),
        "replicas that stored different forms hold the same state"
    );
}

/// Stores a run of one message from producer `a` (entry 1) and one of two
/// from `b` (entry 2), acks `acked` (entry 3) and syncs, so that sled holds
/// what is left.
async fn store_two_runs_and_ack(database: &Database, acked: MessageRef) {
    append_and_apply(database, enqueue(1, "a", &[payload(1)]), true).await;
    append_and_apply(database, enqueue(2, "b", &[payload(2), payload(3)]), true).await;
    append_and_apply(database, ops(3, vec![Op::Remove(vec![acked])]), true).await;
    database.sync().await.unwrap();
}

#[tokio::test]
async fn removed_run_unpins_its_segment_and_counts_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let database = Database::open(dir.path()).unwrap();
        store_two_runs_and_ack(&database, message("a", 0)).await;
        assert_eq!(database.wal().pins_of(SHARD).values().sum::<u64>(), 1);
        database.close();
    }
    let database = Database::open(dir.path()).unwrap();
    assert_eq!(database.wal().pins_of(SHARD).values().sum::<u64>(), 1);
    append_and_apply(
        &database,
        ops(4, vec![Op::Remove(vec![message("b", 0), message("b", 1)])]),
        true,
    )
    .await;
    assert_eq!(database.wal().pins_of(SHARD), SegmentRuns::new());
    let state_machine = database.state_machine(SHARD, None).unwrap();
    let stored = state_machine
        .reader()
        .tree()
        .get(keys::PAYLOAD_PINS)
        .unwrap()
        .unwrap();
    assert_eq!(
        decode::<SegmentRuns>("pins", &stored).unwrap(),
        SegmentRuns::new()
    );
}

#[tokio::test]
async fn run_removed_whole_leaves_no_deletion_of_marks_it_never_had() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    store_two_runs_and_ack(&database, message("b", 1)).await;
    append_and_apply(
        &database,
        ops(4, vec![Op::Remove(vec![message("a", 0), message("b", 0)])]),
        true,
    )
    .await;
    let state_machine = database.state_machine(SHARD, None).unwrap();
    let deleted: Vec<u8> = state_machine
        .reader()
        .tree()
        .unwritten_keys()
        .into_iter()
        .filter(|(_, set)| !set)
        .map(|(key, _)| key[0])
        .collect();
    assert_eq!(
        deleted,
        vec![keys::MESSAGE_TAG, keys::MESSAGE_TAG, keys::REMOVED_TAG],
        "both runs go, and only b, acked past its head, had removal marks to delete"
    );
}

#[tokio::test]
async fn dead_letter_of_a_logged_message_keeps_its_payload() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    append_and_apply(&database, enqueue(1, "a", &[payload(1)]), true).await;
    let discard = Op::Discard(Discard {
        at_ms: 1_700_000_000_001,
        messages: vec![Discarded {
            message: message("a", 0),
            reason: DeadLetterReason::Rejected,
            attempts: 1,
            dead_letter: true,
        }],
    });
    append_and_apply(&database, ops(2, vec![discard]), true).await;
    let reader = database.state_machine(SHARD, None).unwrap().reader();
    let (_, dead) = reader.dead_letters("q", 0, 10).unwrap().remove(0);
    let kept: StoredMessage = decode("message", &dead.message).unwrap();
    assert_eq!(kept.payload, payload(1));
    assert_eq!(database.wal().pins_of(SHARD), SegmentRuns::new());
}

#[tokio::test]
async fn snapshot_carries_payloads_to_a_replica_without_this_log() {
    let source_dir = tempfile::tempdir().unwrap();
    let target_dir = tempfile::tempdir().unwrap();
    let source = Database::open(source_dir.path()).unwrap();
    append_and_apply(&source, enqueue(1, "a", &[payload(1), payload(2)]), true).await;
    let target = Database::open(target_dir.path()).unwrap();
    let reader = install_snapshot_of(&source, &target).await;
    assert_eq!(
        reader.message("q", "a", 0).unwrap().unwrap().payload,
        payload(1)
    );
    assert_eq!(
        reader.message("q", "a", 1).unwrap().unwrap().payload,
        payload(2)
    );
    assert_eq!(
        reader.digest().unwrap(),
        source
            .state_machine(SHARD, None)
            .unwrap()
            .reader()
            .digest()
            .unwrap()
    );
    assert_eq!(target.wal().pins_of(SHARD), SegmentRuns::new());
}

#[tokio::test]
async fn snapshot_taken_mid_write_replays_the_senders_redo_record_on_the_replica() {
    let source_dir = tempfile::tempdir().unwrap();
    let target_dir = tempfile::tempdir().unwrap();
    let source = Database::open(source_dir.path()).unwrap();
    append_and_apply(&source, enqueue(1, "a", &[payload(1)]), true).await;
    let mut state_machine = source.state_machine(SHARD, None).unwrap();
    let mut write_in_progress = crate::change_set::ChangeSet::default();
    write_in_progress.insert(crate::keys::REDO.to_vec(), b"a redo record".to_vec());
    state_machine
        .reader()
        .tree()
        .apply(write_in_progress)
        .unwrap();
    let snapshot = build_snapshot(&mut state_machine).await;
    let image = crate::snapshot::TreeImage::from_bytes(snapshot.snapshot.get_ref()).unwrap();
    assert!(
        image
            .pairs
            .iter()
            .all(|(key, _)| !crate::keys::is_node_local(key)),
        "the image carries this node's own keys"
    );

    let mut older_image = image;
    older_image
        .pairs
        .push((crate::keys::REDO.to_vec(), b"an older sender's".to_vec()));
    older_image.pairs.sort();
    let target = Database::open(target_dir.path()).unwrap();
    let mut installer = target.state_machine(SHARD, None).unwrap();
    installer
        .install_snapshot(
            &snapshot.meta,
            Box::new(std::io::Cursor::new(older_image.to_bytes())),
        )
        .await
        .expect("an image with the sender's redo record is installed without it");
    assert_eq!(
        installer.reader().tree().get(crate::keys::REDO).unwrap(),
        None
    );
}

/// Applies the log's entries `indexes` again, as openraft does after a restart.
async fn apply_again(database: &Database, indexes: std::ops::RangeInclusive<u64>) {
    let entries = database
        .log_store(SHARD)
        .try_get_log_entries(indexes)
        .await
        .unwrap();
    let mut state_machine = database.state_machine(SHARD, None).unwrap();
    state_machine.apply(entries).await.unwrap();
}

#[tokio::test]
async fn applies_a_crash_kept_from_sled_are_applied_again_once() {
    let dir = tempfile::tempdir().unwrap();
    let expected = {
        let database = Database::open(dir.path()).unwrap();
        append_and_apply(&database, enqueue(1, "a", &[payload(1)]), true).await;
        append_and_apply(&database, enqueue(2, "a", &[payload(2)]), true).await;
        let reader = database.state_machine(SHARD, None).unwrap().reader();
        reader.digest().unwrap()
    };
    let database = Database::open(dir.path()).unwrap();
    let mut state_machine = database.state_machine(SHARD, None).unwrap();
    let (applied, _) = state_machine.applied_state().await.unwrap();
    assert_eq!(applied, None, "nothing was written out to sled");
    apply_again(&database, 1..=2).await;
    let reader = database.state_machine(SHARD, None).unwrap().reader();
    assert_eq!(reader.digest().unwrap(), expected);
    assert_eq!(reader.producer("q", "a").unwrap().unwrap().messages, 2);
}

#[tokio::test]
async fn node_whose_tree_lost_applies_its_snapshot_holds_starts_behind_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, snapshot_at) = {
        let database = Database::open(dir.path()).unwrap();
        append_and_apply(&database, enqueue(1, "a", &[payload(1)]), true).await;
        append_and_apply(&database, enqueue(2, "a", &[payload(2)]), true).await;
        let mut state_machine = database.state_machine(SHARD, None).unwrap();
        let snapshot = build_snapshot(&mut state_machine).await;
        let digest = state_machine.reader().digest().unwrap();
        (digest, snapshot.meta.last_log_id)
    };
    assert_eq!(snapshot_at, Some(log_id(2)));
    let database = Database::open(dir.path()).unwrap();
    let mut state_machine = database.state_machine(SHARD, None).unwrap();
    let (applied, _) = state_machine.applied_state().await.unwrap();
    assert_eq!(
        applied, snapshot_at,
        "the tree lost the applies its snapshot holds, and openraft would start behind the snapshot"
    );
    let reader = state_machine.reader();
    assert_eq!(reader.digest().unwrap(), expected);
    assert_eq!(reader.producer("q", "a").unwrap().unwrap().messages, 2);
}

#[tokio::test]
async fn sync_writes_applied_changes_to_sled_before_the_log_is_purged() {
    let dir = tempfile::tempdir().unwrap();
    {
        let database = Database::open(dir.path()).unwrap();
        append_and_apply(&database, enqueue(1, "a", &[payload(1)]), true).await;
        append_and_apply(
            &database,
            ops(2, vec![Op::Remove(vec![message("a", 0)])]),
            true,
        )
        .await;
        append_and_apply(&database, enqueue(3, "b", &[payload(3)]), true).await;
        database.sync().await.unwrap();
    }
    let database = Database::open(dir.path()).unwrap();
    let mut state_machine = database.state_machine(SHARD, None).unwrap();
    let (applied, _) = state_machine.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(3)));
    let reader = state_machine.reader();
    assert_eq!(reader.message("q", "a", 0).unwrap(), None);
    assert_eq!(
        reader.message("q", "b", 0).unwrap().unwrap().payload,
        payload(3)
    );
    assert_eq!(database.wal().pins_of(SHARD).values().sum::<u64>(), 1);
}

fn grpc_sink(address: &str) -> SinkSpec {
    SinkSpec {
        target: SinkTarget::Grpc {
            address: address.into(),
        },
        batch_max: 100,
        batch_max_bytes: 1 << 20,
        linger_ms: 5,
        timeout_ms: 10_000,
        rate: 0,
        max_in_flight: 0,
    }
}

fn set_sink(index: u64, sink: Option<SinkSpec>) -> Entry<TypeConfig> {
    ops(
        index,
        vec![Op::SetSink(SetSink {
            queue: "q".into(),
            sink,
        })],
    )
}

#[tokio::test]
async fn sink_set_travels_in_a_snapshot_and_removal_forgets_it() {
    let source_dir = tempfile::tempdir().unwrap();
    let target_dir = tempfile::tempdir().unwrap();
    let source = Database::open(source_dir.path()).unwrap();
    append_and_apply(&source, set_sink(1, Some(grpc_sink("http://a:1"))), true).await;
    append_and_apply(&source, set_sink(2, Some(grpc_sink("http://b:2"))), true).await;
    let reader = source.state_machine(SHARD, None).unwrap().reader();
    assert_eq!(
        reader.sinks().unwrap(),
        vec![("q".to_owned(), grpc_sink("http://b:2"))]
    );
    let mut builder = source
        .state_machine(SHARD, None)
        .unwrap()
        .get_snapshot_builder()
        .await;
    let snapshot = builder.build_snapshot().await.unwrap();
    let target = Database::open(target_dir.path()).unwrap();
    let mut installer = target.state_machine(SHARD, None).unwrap();
    installer
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    assert_eq!(installer.reader().sinks().unwrap(), reader.sinks().unwrap());
    append_and_apply(&source, set_sink(3, None), true).await;
    assert_eq!(reader.sinks().unwrap(), vec![]);
}

/// An apply that ran on a runtime worker held up every task queued behind
/// it: under the drain of a large backlog, applies of 25-250 ms delayed
/// the raft cores' heartbeats past their timeout and followers called
/// elections.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn long_apply_leaves_the_runtime_to_other_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    let entries: Vec<_> = (1..=200)
        .map(|index| enqueue(index, &format!("p{index}"), &vec![payload(1); 50]))
        .collect();
    let turns = Arc::new(AtomicU64::new(0));
    let other_task = tokio::spawn({
        let turns = turns.clone();
        async move {
            loop {
                turns.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }
    });
    let mut state_machine = database.state_machine(SHARD, None).unwrap();
    let applying = tokio::spawn(async move {
        let turns_before = turns.load(Ordering::Relaxed);
        let replies = state_machine.apply(entries).await.unwrap();
        (replies.len(), turns.load(Ordering::Relaxed) - turns_before)
    });
    let (replies, turns_during_the_apply) = applying.await.unwrap();
    other_task.abort();
    assert_eq!(replies, 200);
    assert!(
        turns_during_the_apply > 0,
        "no other task ran on the runtime's one worker while the apply ran"
    );
}
