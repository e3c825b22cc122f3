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
