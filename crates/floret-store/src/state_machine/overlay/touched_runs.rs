//! The runs one `apply` call touches: a produce's new runs, and stored
//! runs brought into the overlay to find, read or remove a message, with
//! their removed messages as the apply leaves them so far (the producer's
//! head and the removal marks, `runs/removed.rs`). Reads see the apply's
//! runs before the tree's; `mod.rs` writes them at commit.

use std::ops::Bound;

use super::PendingApply;
use crate::keys;
use crate::runs::{self, Removal, Removed, Run, StoredRun};
use crate::storage_error;
use crate::types::StorageError;

/// A run's bytes: as read from the tree, or written by this apply.
pub(in crate::state_machine) enum RunBytes {
    Stored(sled::IVec),
    New(Vec<u8>),
}

impl AsRef<[u8]> for RunBytes {
    fn as_ref(&self) -> &[u8] {
        match self {
            RunBytes::Stored(bytes) => bytes,
            RunBytes::New(bytes) => bytes,
        }
    }
}

/// A run as one apply leaves it so far.
pub(in crate::state_machine) struct TouchedRun {
    pub(in crate::state_machine) run: Run<RunBytes>,
    pub(in crate::state_machine) removed: Removed,
    /// Whether its removal marks changed in this apply.
    pub(in crate::state_machine) marks_changed: bool,
    /// Whether the tree held removal marks for it when this apply began, so
    /// removing the whole run must delete them too (a run removed in one go
    /// never had any, and a deletion of nothing would still be written).
    pub(in crate::state_machine) marks_stored: bool,
}

impl PendingApply<'_> {
    /// Adds a run of `messages` (stored encodings) starting at `first`.
    pub(in crate::state_machine) fn add_run(
        &mut self,
        queue: &str,
        producer: &str,
        first: u64,
        messages: &[Vec<u8>],
    ) {
        let run = Run::parse(RunBytes::New(runs::encode(messages)))
            .expect("a run just encoded is well formed");
        let removed = Removed::none(run.len());
        self.runs.insert(
            keys::message(queue, producer, first),
            TouchedRun {
                run,
                removed,
                marks_changed: false,
                marks_stored: false,
            },
        );
    }

    /// Brings a stored run of the producer into `runs`, unless this apply
    /// touched it already, and holds it in its producer's hint unless it
    /// came from there; returns its key.
    fn touch(
        &mut self,
        queue: &str,
        producer: &str,
        stored: StoredRun,
    ) -> Result<Vec<u8>, StorageError> {
        let StoredRun { key, run, marks } = stored;
        if !self.runs.contains_key(&key) {
            let head = self.producer_head(queue, producer)?;
            let marks = match marks {
                Some(held) => held,
                None => {
                    let marks = self
                        .tree()
                        .get(keys::removed(&key))
                        .map_err(storage_error::read_state_machine)?;
                    self.reader.run_hints().hold(&key, &run, marks.clone());
                    marks
                }
            };
            let mut removed = Removed::stored(marks.as_deref(), run.len())
                .map_err(storage_error::read_state_machine)?;
            removed.head_at(run_first(&key), head);
            let run = run.rewrapped(RunBytes::Stored);
            self.runs.insert(
                key.clone(),
                TouchedRun {
                    run,
                    removed,
                    marks_changed: false,
                    marks_stored: marks.is_some(),
                },
            );
        }
        Ok(key)
    }

    /// The run that holds `sequence` of the producer as this apply leaves
    /// it so far, with the message's index in it; None if no run does.
    pub(in crate::state_machine) fn run_holding(
        &mut self,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Result<Option<(Vec<u8>, usize)>, StorageError> {
        let prefix = keys::message_prefix(queue, producer);
        let key = keys::message(queue, producer, sequence);
        let holds = |run_key: &[u8], run: &TouchedRun| {
            let index = (sequence - run_first(run_key)) as usize;
            (index < run.run.len()).then_some(index)
        };
        let touched = self
            .runs
            .range::<[u8], _>((
                Bound::Included(prefix.as_slice()),
                Bound::Included(key.as_slice()),
            ))
            .next_back();
        if let Some((run_key, run)) = touched
            && let Some(index) = holds(run_key, run)
        {
            return Ok(Some((run_key.clone(), index)));
        }
        let touched = touched.map(|(run_key, _)| run_key.clone());
        let stored = if self.forgotten.contains(&prefix) {
            None
        } else {
            runs::last_at_or_before(self.tree(), self.reader.run_hints(), &prefix, sequence)
                .map_err(storage_error::read_state_machine)?
        };
        let run_key = match (touched, stored) {
            (Some(touched), Some(stored)) if stored.key > touched => {
                self.touch(queue, producer, stored)?
            }
            (Some(touched), _) => touched,
            (None, Some(stored)) => self.touch(queue, producer, stored)?,
            (None, None) => return Ok(None),
        };
        Ok(holds(&run_key, &self.runs[&run_key]).map(|index| (run_key, index)))
    }

    /// The run that holds `sequence` of the producer, or else its first run
    /// after it, with the index to start from; None if there is neither.
    pub(in crate::state_machine) fn run_from(
        &mut self,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Result<Option<(Vec<u8>, usize)>, StorageError> {
        if let Some(holding) = self.run_holding(queue, producer, sequence)? {
            return Ok(Some(holding));
        }
        let prefix = keys::message_prefix(queue, producer);
        let key = keys::message(queue, producer, sequence);
        let touched = self
            .runs
            .range::<[u8], _>((Bound::Included(key.as_slice()), Bound::Unbounded))
            .next()
            .map(|(run_key, _)| run_key)
            .filter(|run_key| run_key.starts_with(&prefix))
            .cloned();
        let stored = if self.forgotten.contains(&prefix) {
            None
        } else {
            runs::first_from(self.tree(), &key, &prefix)
                .map_err(storage_error::read_state_machine)?
                .map(|(key, run)| StoredRun {
                    key: key.to_vec(),
                    run,
                    marks: None,
                })
        };
        let run_key = match (touched, stored) {
            (Some(touched), Some(stored)) if stored.key < touched => {
                self.touch(queue, producer, stored)?
            }
            (Some(touched), _) => touched,
            (None, Some(stored)) => self.touch(queue, producer, stored)?,
            (None, None) => return Ok(None),
        };
        Ok(Some((run_key, 0)))
    }

    /// Removes message `index` of a touched run of the producer whose head
    /// is at `head`: the bytes it counted against its producer's limits and
    /// the head after it, or None if it was removed already.
    pub(in crate::state_machine) fn remove_from_run(
        &mut self,
        run_key: &[u8],
        index: usize,
        head: u64,
    ) -> Result<Option<RemovedMessage>, StorageError> {
        let first = run_first(run_key);
        let touched = self.runs.get_mut(run_key).expect("the run was touched");
        touched.removed.head_at(first, head);
        match touched.removed.insert(index) {
            Removal::Already => return Ok(None),
            Removal::Marked => touched.marks_changed = true,
            Removal::MovedHead => {}
        }
        let accounted_bytes = touched
            .run
            .accounted_len(index)
            .map_err(storage_error::read_state_machine)?;
        let head = touched
            .removed
            .head_index()
            .map_or(head, |index| head.max(first + index as u64));
        Ok(Some(RemovedMessage {
            accounted_bytes,
            head,
        }))
    }

    /// The stored encoding of message `index` of a touched run, removed or not.
    pub(in crate::state_machine) fn touched_message(
        &self,
        run_key: &[u8],
        index: usize,
    ) -> Result<Vec<u8>, StorageError> {
        self.runs[run_key]
            .run
            .message_within(index)
            .map(|message| message.into_owned())
            .map_err(storage_error::read_state_machine)
    }

    /// Whether `sequence` of the producer is stored as this apply leaves it so far.
    pub(in crate::state_machine) fn is_stored(
        &mut self,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Result<bool, StorageError> {
        let Some((run_key, index)) = self.run_holding(queue, producer, sequence)? else {
            return Ok(false);
        };
        let head = self.producer_head(queue, producer)?;
        let touched = self.runs.get_mut(&run_key).expect("the run was touched");
        touched.removed.head_at(run_first(&run_key), head);
        Ok(!touched.removed.contains(index))
    }
}

/// A message [`PendingApply::remove_from_run`] removed.
pub(in crate::state_machine) struct RemovedMessage {
    /// The bytes it counted against its producer's limits.
    pub(in crate::state_machine) accounted_bytes: u64,
    /// The producer's head after it.
    pub(in crate::state_machine) head: u64,
}

/// The first sequence of the run stored at `run_key`.
pub(in crate::state_machine) fn run_first(run_key: &[u8]) -> u64 {
    keys::message_sequence(run_key).expect("run keys end with a sequence")
}
