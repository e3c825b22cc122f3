//! No decoder of bytes from outside the process panics: stored records,
//! runs and their removal marks, keys, snapshot images, payloads at rest
//! and raft log segments, fed arbitrary bytes, answer with a value or an
//! error. 10,000 cases per property in `cargo test`; a long run sets
//! `PROPTEST_CASES=1000000`.

use std::path::Path;
use std::sync::LazyLock;

use proptest::prelude::*;

use crate::keys;
use crate::records::{self, AppliedState, DeadLetterRecord, ProducedBatch, ProducerRecord};
use crate::resting;
use crate::runs::{Removed, Run};
use crate::snapshot::TreeImage;
use crate::wal::Wal;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(10_000);
    ProptestConfig::with_cases(cases)
}

/// Bytes as the attacker or a damaged disk would send them: mostly short,
/// sometimes long, often starting like a real value.
fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::collection::vec(any::<u8>(), 0..2048),
        proptest::collection::vec(
            prop_oneof![Just(0u8), Just(1), Just(0xff), Just(0x80)],
            0..256
        ),
    ]
}

/// A raft log with one segment holding `contents` after a real start.
fn wal_with_segment(dir: &Path, contents: &[u8]) {
    {
        let wal = Wal::open(dir).expect("a fresh log");
        wal.sync().expect("synced");
    }
    let segment = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "log"))
        .expect("a segment file");
    let mut written = std::fs::read(&segment).unwrap();
    written.extend_from_slice(contents);
    std::fs::write(&segment, written).unwrap();
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn stored_record_decoders_never_panic(value in bytes()) {
        let _ = records::decode::<ProducerRecord>("producer", &value);
        let _ = records::decode::<ProducedBatch>("batch", &value);
        let _ = records::decode::<DeadLetterRecord>("dead letter", &value);
        let _ = records::decode::<AppliedState>("applied state", &value);
        let _ = resting::accounted_len(&value);
    }

    #[test]
    fn run_and_removal_mark_decoders_never_panic(run in bytes(), marks in bytes()) {
        if let Ok(parsed) = Run::parse(run.as_slice()) {
            for index in 0..=parsed.len().min(64) {
                let _ = parsed.message(index);
                let _ = parsed.message_within(index);
            }
            let _ = resting::run_segment(&parsed);
            if let Ok(removed) = Removed::stored(Some(&marks), parsed.len()) {
                for index in 0..parsed.len().min(64) {
                    let _ = removed.contains(index);
                }
                let _ = removed.all();
            }
        }
    }

    #[test]
    fn key_parsers_never_panic(key in bytes()) {
        let _ = keys::parse_policy(&key);
        let _ = keys::parse_producer(&key);
        let _ = keys::message_sequence(&key);
    }

    #[test]
    fn snapshot_image_decoder_never_panics(image in bytes()) {
        if let Ok(image) = TreeImage::from_bytes(&image) {
            let _ = image.validate();
        }
    }

    #[test]
    fn snapshot_image_validation_never_panics(
        pairs in proptest::collection::vec((bytes(), bytes()), 0..8),
    ) {
        let _ = TreeImage { pairs }.validate();
    }
}

/// One raft log for every case that only reads from it.
static SHARED_LOG: LazyLock<(tempfile::TempDir, Wal)> = LazyLock::new(|| {
    let dir = tempfile::tempdir().unwrap();
    let log = Wal::open(dir.path()).unwrap();
    (dir, log)
});

proptest! {
    #![proptest_config(config())]

    #[test]
    fn payloads_at_rest_never_panic_when_resolved(value in bytes()) {
        let log = &SHARED_LOG.1;
        let _ = resting::resolve(&value, log);
        let _ = resting::inlined(&value, log);
        let _ = resting::plain(&value, log);
        let _ = resting::inlined_run(&value, log);
    }

    #[test]
    fn raft_log_recovery_never_panics(tail in bytes()) {
        let dir = tempfile::tempdir().unwrap();
        wal_with_segment(dir.path(), &tail);
        let _ = Wal::open(dir.path());
    }
}
