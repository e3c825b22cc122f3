//! Dead letters in the overlay: keeping one under the queue's next id,
//! and replaying or deleting those a selection names. Deterministic, like
//! every op (`ops.rs`).

use std::collections::BTreeSet;

use crate::keys;
use crate::records::{DeadLetterRecord, StoredMessage, decode, encode};
use crate::resting::{self, RestingPayload};
use crate::storage_error;
use crate::types::{DeadLetterSelection, OpReply, StorageError};

use super::AppliedEvent;
use super::ops::accounted;
use super::overlay::PendingApply;

impl PendingApply<'_> {
    pub(super) fn keep_dead_letter(
        &mut self,
        queue: &str,
        record: DeadLetterRecord,
    ) -> Result<(), StorageError> {
        let id = match self.next_dead_letter.get(queue) {
            Some(&id) => id,
            None => match self
                .tree()
                .get(keys::next_dead_letter(queue))
                .map_err(storage_error::read_state_machine)?
            {
                Some(bytes) => decode("next dead-letter id", &bytes)
                    .map_err(storage_error::read_state_machine)?,
                None => 0,
            },
        };
        self.next_dead_letter.insert(queue.to_owned(), id + 1);
        self.changes
            .insert(keys::dead_letter(queue, id), encode(&record));
        Ok(())
    }

    /// The dead letters `selection` names that exist, each once, in id
    /// order, with its key and decoded record.
    pub(super) fn selected_dead_letters(
        &self,
        selection: &DeadLetterSelection,
    ) -> Result<Vec<(Vec<u8>, DeadLetterRecord)>, StorageError> {
        let ids: BTreeSet<u64> = selection.ids.iter().copied().collect();
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            let key = keys::dead_letter(&selection.queue, id);
            if let Some(value) = self.get(&key)? {
                let record =
                    decode("dead letter", &value).map_err(storage_error::read_state_machine)?;
                found.push((key, record));
            }
        }
        Ok(found)
    }

    pub(super) fn replay_dead_letters(
        &mut self,
        selection: &DeadLetterSelection,
    ) -> Result<OpReply, StorageError> {
        let dead_letters = self.selected_dead_letters(selection)?;
        let count = dead_letters.len() as u64;
        for (key, dead) in dead_letters {
            let message: StoredMessage =
                decode("message", &dead.message).map_err(storage_error::read_state_machine)?;
            let value = resting::encode_resting(
                RestingPayload::Inline(&message.payload),
                &message.headers,
                selection.at_ms,
            );
            let bytes = accounted(&value)?;
            let record = self.producer(&selection.queue, &dead.producer)?;
            let sequence = record.tail;
            record.tail += 1;
            record.messages += 1;
            record.bytes += bytes;
            self.changes.remove(key);
            self.add_run(&selection.queue, &dead.producer, sequence, &[value]);
            self.events.push(AppliedEvent::Enqueued {
                shard: self.shard,
                queue: selection.queue.clone(),
                producer: dead.producer,
                sequences: sequence..sequence + 1,
            });
        }
        Ok(OpReply::Replayed { count })
    }

    pub(super) fn delete_dead_letters(
        &mut self,
        selection: &DeadLetterSelection,
    ) -> Result<OpReply, StorageError> {
        let dead_letters = self.selected_dead_letters(selection)?;
        let count = dead_letters.len() as u64;
        for (key, _) in dead_letters {
            self.changes.remove(key);
        }
        Ok(OpReply::Removed { count })
    }
}
