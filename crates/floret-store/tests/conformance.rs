//! openraft's own storage conformance suite, run against the WAL log store and the sled state machine.

use floret_store::{Database, LogStore, StateMachine, StorageError, TypeConfig};
use openraft::StorageIOError;
use openraft::testing::{StoreBuilder, Suite};
use tempfile::TempDir;

struct SledStoreBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, (TempDir, Database)> for SledStoreBuilder {
    async fn build(&self) -> Result<((TempDir, Database), LogStore, StateMachine), StorageError> {
        let failed = |e: &dyn std::fmt::Display| {
            StorageError::from(StorageIOError::write_logs(&std::io::Error::other(
                e.to_string(),
            )))
        };
        let dir = TempDir::new().map_err(|e| failed(&e))?;
        let database = Database::open(dir.path()).map_err(|e| failed(&e))?;
        let log = database.log_store(0);
        let state_machine = database.state_machine(0, None).map_err(|e| failed(&e))?;
        Ok(((dir, database), log, state_machine))
    }
}

#[test]
fn wal_and_sled_store_pass_openraft_storage_suite() {
    if let Err(error) = Suite::test_all(SledStoreBuilder) {
        panic!("storage suite failed: {error}");
    }
}
