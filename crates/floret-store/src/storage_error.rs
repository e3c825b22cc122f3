//! Short constructors for the openraft storage errors the store returns.

use std::error::Error;

use openraft::StorageIOError;
use openraft::storage::SnapshotSignature;

use crate::types::{NodeId, StorageError};

macro_rules! storage_errors {
    ($($name:ident),* $(,)?) => {
        $(
            pub(crate) fn $name<E: Error + 'static>(error: E) -> StorageError {
                StorageIOError::<NodeId>::$name(&error).into()
            }
        )*
    };
}

storage_errors!(
    read_logs,
    write_logs,
    write_vote,
    read_state_machine,
    write_state_machine
);

pub(crate) fn read_snapshot<E: Error + 'static>(
    signature: Option<SnapshotSignature<NodeId>>,
    error: &E,
) -> StorageError {
    StorageIOError::<NodeId>::read_snapshot(signature, error).into()
}

pub(crate) fn write_snapshot<E: Error + 'static>(
    signature: Option<SnapshotSignature<NodeId>>,
    error: &E,
) -> StorageError {
    StorageIOError::<NodeId>::write_snapshot(signature, error).into()
}
