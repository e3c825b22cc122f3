use openraft::CommittedLeaderId;

use super::*;

fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn append(wal: &Wal, shard: ShardId, indexes: std::ops::Range<u64>) {
    let entries = indexes
        .map(|i| {
            let entry = EncodedEntry {
                meta: vec![i as u8; 100],
                payloads: Vec::new(),
            };
            (log_id(i), entry)
        })
        .collect();
    wal.append(shard, entries).unwrap();
}

/// The entries' encodings without payloads.
fn metas(entries: Vec<EncodedEntry>) -> Vec<Vec<u8>> {
    entries.into_iter().map(|entry| entry.meta).collect()
}

/// Cuts `bytes` off the end of `segment`, as a torn write leaves it.
fn cut_off_the_last_bytes(segment: &Path, bytes: u64) {
    let len = fs::metadata(segment).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(segment)
        .unwrap()
        .set_len(len - bytes)
        .unwrap();
}

fn segments(dir: &Path) -> usize {
    fs::read_dir(dir).unwrap().count()
}

#[test]
fn torn_write_at_the_end_is_cut_off_and_earlier_entries_survive() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open(dir.path()).unwrap();
        append(&wal, 0, 1..4);
    }
    let segment = segment_path(dir.path(), 1);
    cut_off_the_last_bytes(&segment, 10);

    let wal = Wal::open(dir.path()).unwrap();
    assert_eq!(wal.log_state(0), (None, Some(log_id(2))));
    append(&wal, 0, 3..4);
    drop(wal);
    let wal = Wal::open(dir.path()).unwrap();
    assert_eq!(
        metas(wal.read(0, 1..).unwrap()),
        vec![vec![1; 100], vec![2; 100], vec![3; 100]]
    );
}

#[test]
fn bit_flip_in_a_sealed_segment_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open_with_segment_bytes(dir.path(), 300).unwrap();
        append(&wal, 0, 1..10);
    }
    let sealed = segment_path(dir.path(), 1);
    let mut bytes = fs::read(&sealed).unwrap();
    bytes[20] ^= 0x40;
    fs::write(&sealed, bytes).unwrap();
    let error = Wal::open_with_segment_bytes(dir.path(), 300)
        .err()
        .expect("corruption must be refused");
    assert!(error.to_string().contains("is corrupt"), "{error}");
}

#[test]
fn purged_segments_are_deleted_and_metadata_survives_in_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let vote = Vote::new_committed(3, 1);
    {
        let wal = Wal::open_with_segment_bytes(dir.path(), 300).unwrap();
        wal.save_vote(0, &vote).unwrap();
        wal.save_committed(0, Some(log_id(5))).unwrap();
        for index in 1..20 {
            append(&wal, 0, index..index + 1);
        }
        append(&wal, 1, 1..3);
        assert!(segments(dir.path()) > 5);
        wal.purge(0, log_id(18)).unwrap();
        wal.purge(1, log_id(2)).unwrap();
        assert!(
            segments(dir.path()) <= 3,
            "{} segments left",
            segments(dir.path())
        );
    }
    let wal = Wal::open_with_segment_bytes(dir.path(), 300).unwrap();
    assert_eq!(wal.vote(0), Some(vote));
    assert_eq!(wal.committed(0), Some(log_id(5)));
    assert_eq!(wal.log_state(0), (Some(log_id(18)), Some(log_id(19))));
    assert_eq!(wal.log_state(1), (Some(log_id(2)), Some(log_id(2))));
    assert_eq!(metas(wal.read(0, ..).unwrap()), vec![vec![19; 100]]);
}

#[test]
fn entries_hidden_by_a_purge_not_yet_done_come_back_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open_with_segment_bytes(dir.path(), 300).unwrap();
        for index in 1..10 {
            append(&wal, 0, index..index + 1);
        }
        wal.sync().unwrap();
        let segments_before = segments(dir.path());
        wal.hide_purged(0, log_id(6));
        assert_eq!(wal.log_state(0), (Some(log_id(6)), Some(log_id(9))));
        assert_eq!(
            metas(wal.read(0, ..).unwrap()),
            vec![vec![7; 100], vec![8; 100], vec![9; 100]]
        );
        wal.hide_purged(0, log_id(12));
        assert_eq!(wal.log_state(0), (Some(log_id(12)), Some(log_id(12))));
        assert_eq!(wal.read(0, ..).unwrap().len(), 0);
        assert_eq!(segments(dir.path()), segments_before, "nothing deleted");
    }
    let wal = Wal::open_with_segment_bytes(dir.path(), 300).unwrap();
    assert_eq!(wal.log_state(0), (None, Some(log_id(9))));
    assert_eq!(wal.read(0, ..).unwrap().len(), 9);
}

#[test]
fn bit_flip_before_the_last_frame_of_the_active_segment_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open(dir.path()).unwrap();
        append(&wal, 0, 1..4);
    }
    let active = segment_path(dir.path(), 1);
    let mut bytes = fs::read(&active).unwrap();
    bytes[20] ^= 0x40;
    fs::write(&active, bytes).unwrap();
    let error = Wal::open(dir.path())
        .err()
        .expect("synced entries after the damage must not be dropped");
    assert!(error.to_string().contains("is corrupt"), "{error}");
}

#[test]
fn length_damaged_past_any_frame_size_is_corruption_not_a_torn_write() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open(dir.path()).unwrap();
        append(&wal, 0, 1..4);
        wal.sync().unwrap();
    }
    let active = segment_path(dir.path(), 1);
    let mut bytes = fs::read(&active).unwrap();
    bytes[3] ^= 0x04;
    fs::write(&active, bytes).unwrap();
    let error = Wal::open(dir.path())
        .err()
        .expect("a frame claiming 64 MiB more must not be cut as torn");
    assert!(error.to_string().contains("is corrupt"), "{error}");
}

#[test]
fn truncated_entries_stay_gone_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open(dir.path()).unwrap();
        append(&wal, 0, 1..6);
        wal.truncate(0, 4).unwrap();
    }
    let wal = Wal::open(dir.path()).unwrap();
    assert_eq!(wal.log_state(0), (None, Some(log_id(3))));
}

fn with_payloads(meta: u8, payloads: &[&[u8]]) -> EncodedEntry {
    EncodedEntry {
        meta: vec![meta; 10],
        payloads: payloads.iter().map(|p| p.to_vec()).collect(),
    }
}

#[test]
fn payloads_read_back_in_place_only_once_synced() {
    let dir = tempfile::tempdir().unwrap();
    let entry = with_payloads(1, &[b"abc", b"", b"defgh"]);
    let section = {
        let wal = Wal::open(dir.path()).unwrap();
        wal.append(0, vec![(log_id(1), entry.clone())]).unwrap();
        assert_eq!(
            wal.payload_section(0, log_id(1)),
            None,
            "a payload not yet synced may vanish in a crash: nothing may point at it"
        );
        wal.sync().unwrap();
        let section = wal.payload_section(0, log_id(1)).unwrap();
        assert_eq!(
            wal.read_payload(section.segment, section.offset, 3)
                .unwrap(),
            b"abc"
        );
        assert_eq!(
            wal.read_payload(section.segment, section.offset + 3, 5)
                .unwrap(),
            b"defgh"
        );
        assert_eq!(wal.read(0, ..).unwrap(), vec![entry.clone()]);
        let other_term = LogId::new(CommittedLeaderId::new(2, 1), 1);
        assert_eq!(wal.payload_section(0, other_term), None);
        section
    };
    let wal = Wal::open(dir.path()).unwrap();
    assert_eq!(wal.payload_section(0, log_id(1)), Some(section));
    assert_eq!(wal.read(0, ..).unwrap(), vec![entry]);
}

/// Appends entry 1 of `shard` carrying `payload`, synced; where the payload lies.
fn logged(wal: &Wal, shard: ShardId, payload: &[u8]) -> PayloadSection {
    wal.append(shard, vec![(log_id(1), with_payloads(1, &[payload]))])
        .unwrap();
    wal.sync().unwrap();
    wal.payload_section(shard, log_id(1)).unwrap()
}

/// Counts one run of `shard` in `section`'s segment, as a completed
/// state-machine sync would.
fn pin_durably(wal: &Wal, shard: ShardId, section: PayloadSection) {
    wal.set_pins(shard, SegmentRuns::from([(section.segment, 1)]));
    let capture = wal.capture_pins();
    wal.pins_synced(capture);
}

#[test]
fn segment_that_stored_messages_point_into_outlives_its_purge() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open_with_segment_bytes(dir.path(), 300).unwrap();
    let payload = [7u8; 200];
    let section = logged(&wal, 0, &payload);
    pin_durably(&wal, 0, section);
    for index in 2..6 {
        append(&wal, 0, index..index + 1);
    }
    wal.sync().unwrap();
    wal.purge(0, log_id(5)).unwrap();
    assert_eq!(
        wal.read_payload(section.segment, section.offset, 200)
            .unwrap(),
        payload
    );
    wal.set_pins(0, SegmentRuns::new());
    let capture = wal.capture_pins();
    append(&wal, 0, 6..7);
    assert!(
        wal.read_payload(section.segment, section.offset, 200)
            .is_ok(),
        "no purge since the run went"
    );
    wal.purge(0, log_id(6)).unwrap();
    assert!(
        wal.read_payload(section.segment, section.offset, 200)
            .is_ok(),
        "no sync has yet written the state machines without the run"
    );
    wal.pins_synced(capture);
    append(&wal, 0, 7..8);
    wal.purge(0, log_id(7)).unwrap();
    let gone = wal
        .read_payload(section.segment, section.offset, 200)
        .unwrap_err();
    assert_eq!(gone.kind(), io::ErrorKind::NotFound);
}

#[test]
fn shard_with_little_traffic_does_not_keep_every_segment() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open_with_segment_bytes(dir.path(), 300).unwrap();
        append(&wal, 1, 1..3);
        for index in 1..20 {
            append(&wal, 0, index..index + 1);
        }
        wal.sync().unwrap();
        wal.purge(0, log_id(18)).unwrap();
        assert!(
            segments(dir.path()) <= 3,
            "shard 1's two entries kept {} segments",
            segments(dir.path())
        );
        assert_eq!(
            metas(wal.read(1, ..).unwrap()),
            vec![vec![1; 100], vec![2; 100]]
        );
        append(&wal, 1, 3..4);
    }
    let wal = Wal::open_with_segment_bytes(dir.path(), 300).unwrap();
    assert_eq!(
        metas(wal.read(1, ..).unwrap()),
        vec![vec![1; 100], vec![2; 100], vec![3; 100]],
        "the copies replay in place of the originals, and later entries stay"
    );
    assert_eq!(metas(wal.read(0, ..).unwrap()), vec![vec![19; 100]]);
}

#[test]
fn segment_an_apply_reads_payloads_from_survives_its_entry_being_copied_forward() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open_with_segment_bytes(dir.path(), 300).unwrap();
    let payload = [9u8; 50];
    let section = logged(&wal, 1, &payload);
    for index in 1..20 {
        append(&wal, 0, index..index + 1);
    }
    wal.sync().unwrap();
    wal.purge(0, log_id(18)).unwrap();
    wal.sync().unwrap();
    assert_ne!(
        wal.payload_section(1, log_id(1)).unwrap().segment,
        section.segment,
        "the quiet shard's entry was copied forward"
    );
    assert_eq!(
        wal.read_payload(section.segment, section.offset, 50)
            .unwrap(),
        payload,
        "the apply that looked it up has not counted its run yet"
    );
    pin_durably(&wal, 1, section);
    append(&wal, 0, 20..21);
    wal.purge(0, log_id(19)).unwrap();
    assert!(
        wal.read_payload(section.segment, section.offset, 50)
            .is_ok()
    );
}

#[test]
fn failed_rotation_or_purge_sync_lets_the_log_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path()).unwrap();
    append(&wal, 0, 1..3);
    let failed: io::Result<()> = Err(io::Error::other("EIO"));
    let latched = wal.lock().latch("fsync of the log folder", failed);
    assert!(latched.is_err());
    let after = wal.sync().unwrap_err().to_string();
    assert!(
        after.contains("stopped") && after.contains("fsync of the log folder failed: EIO"),
        "{after}"
    );
    let entries = vec![(
        log_id(3),
        EncodedEntry {
            meta: vec![3; 10],
            payloads: Vec::new(),
        },
    )];
    assert!(
        wal.append(0, entries).is_err(),
        "an append after a failed sync"
    );
}

#[test]
fn append_that_would_leave_a_hole_in_the_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path()).unwrap();
    append(&wal, 0, 1..5);
    let entry = || EncodedEntry {
        meta: vec![0; 10],
        payloads: Vec::new(),
    };

    let error = wal.append(0, vec![(log_id(7), entry())]).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("entry 7 where the next entry is 5"),
        "{error}"
    );
    let error = wal
        .append(0, vec![(log_id(5), entry()), (log_id(7), entry())])
        .unwrap_err();
    assert!(error.to_string().contains("hole"), "{error}");
    assert_eq!(wal.log_state(0), (None, Some(log_id(4))), "nothing written");

    append(&wal, 0, 3..6);
    wal.hide_purged(0, log_id(9));
    append(&wal, 0, 10..12);
    assert_eq!(wal.log_state(0), (Some(log_id(9)), Some(log_id(11))));
    assert!(
        wal.failure().is_none(),
        "a refused append does not stop the log"
    );
}

#[test]
fn sync_after_a_small_append_leaves_no_page_for_the_next_append_to_dirty_again() {
    let dir = tempfile::tempdir().unwrap();
    let segment = segment_path(dir.path(), 1);
    {
        let wal = Wal::open(dir.path()).unwrap();
        append(&wal, 0, 1..2);
        let logged = wal.bytes_written();
        wal.sync().unwrap();
        assert_eq!(fs::metadata(&segment).unwrap().len(), 4096);
        assert_eq!(
            wal.bytes_written(),
            logged,
            "padding is not counted as written"
        );
        append(&wal, 0, 2..3);
        wal.sync().unwrap();
        assert_eq!(fs::metadata(&segment).unwrap().len(), 2 * 4096);
        wal.sync().unwrap();
        assert_eq!(
            fs::metadata(&segment).unwrap().len(),
            2 * 4096,
            "nothing to pad"
        );
    }
    cut_off_the_last_bytes(&segment, 10);

    let wal = Wal::open(dir.path()).unwrap();
    let cut = wal.cut_at_open();
    assert!(
        0 < cut && cut < 4096,
        "only the torn padding is cut, not {cut} bytes"
    );
    assert_eq!(
        metas(wal.read(0, 1..).unwrap()),
        vec![vec![1; 100], vec![2; 100]]
    );
}
