//! The data dir's claims: what a first start records is what every later
//! start must ask for.

use super::{Database, OpenError};

#[tokio::test]
async fn a_data_dir_refuses_a_shard_count_or_placement_it_was_not_founded_with() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::open(dir.path()).unwrap();
    database.claim_shard_count(6).expect("first claim");
    database.claim_shard_count(6).expect("the same count again");
    match database.claim_shard_count(8) {
        Err(OpenError::ShardCountMismatch {
            found, requested, ..
        }) => assert_eq!((found, requested), (6, 8)),
        other => panic!("a changed shard count must be refused: {other:?}"),
    }
    database.claim_placement("1,2,3 r3").expect("first claim");
    database
        .claim_placement("1,2,3 r3")
        .expect("the same again");
    match database.claim_placement("1,2,4 r3") {
        Err(OpenError::PlacementMismatch {
            found, requested, ..
        }) => assert_eq!(
            (found.as_str(), requested.as_str()),
            ("1,2,3 r3", "1,2,4 r3")
        ),
        other => panic!("a changed placement must be refused: {other:?}"),
    }
}

/// A crash between the durable mark and the end of a retirement leaves a
/// state machine without the log that built it (or the reverse); opening
/// the data dir finishes the retirement before any shard is read.
#[tokio::test]
async fn a_retirement_a_crash_interrupted_is_finished_when_the_data_dir_opens() {
    let dir = tempfile::tempdir().unwrap();
    {
        let database = Database::open(dir.path()).unwrap();
        let applied = crate::records::encode(&crate::records::AppliedState::default());
        database
            .db
            .open_tree("shard-4.sm")
            .unwrap()
            .insert(crate::keys::APPLIED, applied)
            .unwrap();
        database
            .wal()
            .save_vote(4, &openraft::Vote::new_committed(3, 2))
            .unwrap();
        database
            .db
            .insert(super::shard_storage::retiring_key(4), &[])
            .unwrap();
        database.sync().await.unwrap();
        database.close();
    }
    let database = Database::open(dir.path()).unwrap();
    assert_eq!(database.wal().vote(4), None);
    assert!(database.db.open_tree("shard-4.sm").unwrap().is_empty());
    assert!(
        database
            .db
            .get(super::shard_storage::retiring_key(4))
            .unwrap()
            .is_none()
    );
}
