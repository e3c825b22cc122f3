//! What each operation means, applied to the overlay: enqueue (with
//! idempotency, limits and overflow), delays, removals, discards,
//! policies, forgetting idle producers (dead letters: `dead_letters.rs`). Deterministic: every
//! reply is computed from the replicated state and the op alone.

use std::ops::Bound;

use crate::keys;
use crate::policy::{Overflow, Policy};
use crate::records::{DeadLetterRecord, ProducedBatch, ProducerRecord, encode};
use crate::resting::{self, LoggedPayload, RestingPayload};
use crate::runs;
use crate::sink_spec::SetSink;
use crate::storage_error;
use crate::types::{
    DeadLetterReason, DelayedEnqueue, Discard, Enqueue, IdleProducer, MessageRef, OpReply,
    SetPolicy, StorageError,
};

use super::AppliedEvent;
use super::overlay::{PendingApply, RunBytes, run_first};

impl PendingApply<'_> {
    pub(super) fn enqueue(&mut self, enqueue: &Enqueue) -> Result<OpReply, StorageError> {
        let logged = self.logged_payloads(&enqueue.messages);
        let policy = self.policy(&enqueue.queue, &enqueue.producer);
        let record = self.producer(&enqueue.queue, &enqueue.producer)?;
        if let (Some(sequence), Some(last)) = (enqueue.producer_sequence, record.last_batch) {
            if sequence == last.producer_sequence {
                return Ok(OpReply::Enqueued {
                    first_sequence: last.first_sequence,
                    count: last.count,
                    duplicate: true,
                });
            }
            if sequence < last.producer_sequence {
                return Ok(OpReply::StaleProducerSequence {
                    last: last.producer_sequence,
                });
            }
        }
        let first_sequence = record.tail;
        let count = enqueue.messages.len() as u64;
        if crate::failpoints::fires("apply-drop-enqueue") {
            return Ok(OpReply::Enqueued {
                first_sequence,
                count,
                duplicate: false,
            });
        }
        let mut values = Vec::with_capacity(enqueue.messages.len());
        let mut accounted_lengths = Vec::with_capacity(enqueue.messages.len());
        for (message, logged) in enqueue.messages.iter().zip(logged) {
            let payload = match logged {
                Some(at) => RestingPayload::Logged(LoggedPayload {
                    segment: at.segment,
                    offset: at.offset,
                    len: message.payload.len() as u32,
                    crc: crc32fast::hash(&message.payload),
                }),
                None => RestingPayload::Inline(&message.payload),
            };
            let value = resting::encode_resting(payload, &message.headers, enqueue.enqueued_at_ms);
            accounted_lengths.push(accounted(&value)?);
            values.push(value);
        }
        let added_bytes = accounted_lengths.iter().sum();
        let overflow = policy.overflow.unwrap_or_default();
        if overflow == Overflow::Reject
            && policy.exceeded_by(record.messages + count, record.bytes + added_bytes)
        {
            return Ok(OpReply::OverLimit {
                messages: record.messages,
                bytes: record.bytes,
                batch_bytes: added_bytes,
                policy,
            });
        }
        record.bytes += added_bytes;
        record.tail += count;
        record.messages += count;
        if let Some(producer_sequence) = enqueue.producer_sequence {
            record.last_batch = Some(ProducedBatch {
                producer_sequence,
                first_sequence,
                count,
            });
        }
        let over_limit = policy.exceeded_by(record.messages, record.bytes);
        for run in runs::split(&accounted_lengths) {
            let first = first_sequence + run.start as u64;
            self.add_run(&enqueue.queue, &enqueue.producer, first, &values[run]);
        }
        self.events.push(AppliedEvent::Enqueued {
            shard: self.shard,
            queue: enqueue.queue.clone(),
            producer: enqueue.producer.clone(),
            sequences: first_sequence..first_sequence + count,
        });
        if over_limit {
            self.trim_oldest(enqueue, policy, overflow == Overflow::DeadLetterOldest)?;
        }
        Ok(OpReply::Enqueued {
            first_sequence,
            count,
            duplicate: false,
        })
    }

    /// Appends messages that wait until `deliver_at_ms`: each gets a delay
    /// key next to it.
    pub(super) fn enqueue_delayed(
        &mut self,
        delayed: &DelayedEnqueue,
    ) -> Result<OpReply, StorageError> {
        let reply = self.enqueue(&delayed.enqueue)?;
        if let OpReply::Enqueued {
            first_sequence,
            count,
            duplicate: false,
        } = reply
        {
            let (queue, producer) = (&delayed.enqueue.queue, &delayed.enqueue.producer);
            for sequence in first_sequence..first_sequence + count {
                if self.is_stored(queue, producer, sequence)? {
                    let key = keys::message(queue, producer, sequence);
                    self.changes
                        .insert(keys::delay(&key), encode(&delayed.deliver_at_ms));
                    self.delays_added.insert(key, delayed.deliver_at_ms);
                }
            }
        }
        Ok(reply)
    }

    /// Takes the producer's oldest messages out until it is within its
    /// limits again, keeping them as dead letters if `dead_letter`.
    pub(super) fn trim_oldest(
        &mut self,
        enqueue: &Enqueue,
        policy: Policy,
        dead_letter: bool,
    ) -> Result<(), StorageError> {
        let (queue, producer) = (enqueue.queue.as_str(), enqueue.producer.as_str());
        let record = self.producer(queue, producer)?.clone();
        let (mut messages, mut bytes) = (record.messages, record.bytes);
        let mut head = record.head;
        let mut sequence = record.head;
        let mut last = None;
        while policy.exceeded_by(messages, bytes) {
            let Some((run_key, start)) = self.run_from(queue, producer, sequence)? else {
                break;
            };
            let first = keys::message_sequence(&run_key).expect("run keys end with a sequence");
            let len = self.runs[&run_key].run.len();
            for index in start..len {
                if !policy.exceeded_by(messages, bytes) {
                    break;
                }
                let Some(removed) = self.remove_from_run(&run_key, index, head)? else {
                    continue;
                };
                let sequence = first + index as u64;
                head = removed.head;
                messages -= 1;
                bytes -= removed.accounted_bytes;
                last = Some(sequence);
                self.forget_delay(&keys::message(queue, producer, sequence));
                if dead_letter {
                    let value = self.touched_message(&run_key, index)?;
                    self.keep_dead_letter(
                        queue,
                        DeadLetterRecord {
                            producer: producer.to_owned(),
                            sequence,
                            reason: DeadLetterReason::Overflow,
                            attempts: 0,
                            dead_lettered_at_ms: enqueue.enqueued_at_ms,
                            message: self.plain(&value)?,
                        },
                    )?;
                }
            }
            sequence = first + len as u64;
        }
        let Some(last) = last else {
            return Ok(());
        };
        let record = self.producer(queue, producer)?;
        record.messages = messages;
        record.bytes = bytes;
        record.head = head.max(last + 1);
        self.events.push(AppliedEvent::Dropped {
            shard: self.shard,
            queue: queue.to_owned(),
            producer: producer.to_owned(),
            below: last + 1,
        });
        Ok(())
    }

    /// Deletes a stored message, adjusting its producer's counters; None if
    /// it was not stored.
    pub(super) fn take(&mut self, message: &MessageRef) -> Result<Option<Taken<'_>>, StorageError> {
        let (queue, producer) = (message.queue.as_str(), message.producer.as_str());
        let head = self.producer(queue, producer)?.head;
        if message.sequence < head {
            return Ok(None);
        }
        let Some((run_key, index)) = self.run_holding(queue, producer, message.sequence)? else {
            return Ok(None);
        };
        let head = self.head_across_removed_runs(queue, producer, head, &run_key)?;
        let Some(removed) = self.remove_from_run(&run_key, index, head)? else {
            return Ok(None);
        };
        let bytes = removed.accounted_bytes;
        self.forget_delay(&keys::message(queue, producer, message.sequence));
        let record = self.producer(queue, producer)?;
        let (Some(messages), Some(remaining_bytes)) = (
            record.messages.checked_sub(1),
            record.bytes.checked_sub(bytes),
        ) else {
            return Err(storage_error::read_state_machine(std::io::Error::other(
                format!(
                    "the record of producer {producer:?} of queue {queue:?} counts fewer \
                     messages or bytes than it holds (sequence {})",
                    message.sequence
                ),
            )));
        };
        record.messages = messages;
        record.bytes = remaining_bytes;
        record.head = removed.head;
        Ok(Some(Taken {
            run_key,
            index,
            producer: record,
        }))
    }

    /// The producer's head, moved up to the start of the run at `run_key`
    /// when every message between them is removed: the runs there are
    /// deleted, or (in this apply) have all their messages removed. Without
    /// it, a head left behind a run that overtaking acks removed would make
    /// every later ack of the producer mark a bit instead of moving the
    /// head. A run removed in this apply counts as deleted, so the outcome
    /// does not depend on how many entries openraft hands one apply call.
    fn head_across_removed_runs(
        &mut self,
        queue: &str,
        producer: &str,
        head: u64,
        run_key: &[u8],
    ) -> Result<u64, StorageError> {
        let first = run_first(run_key);
        let mut from = head;
        while from < first {
            let Some((nearest, _)) = self.run_from(queue, producer, from)? else {
                return Ok(head);
            };
            if nearest == run_key {
                break;
            }
            let touched = &self.runs[&nearest];
            if !touched.removed.all() {
                return Ok(head);
            }
            from = run_first(&nearest) + touched.run.len() as u64;
        }
        Ok(head.max(first))
    }

    pub(super) fn remove(&mut self, messages: &[MessageRef]) -> Result<OpReply, StorageError> {
        let mut count = 0;
        for message in messages {
            if let Some(taken) = self.take(message)? {
                taken.producer.acked += 1;
                count += 1;
            }
        }
        Ok(OpReply::Removed { count })
    }

    pub(super) fn discard(&mut self, discard: &Discard) -> Result<OpReply, StorageError> {
        let mut count = 0;
        for discarded in &discard.messages {
            let Some(Taken { run_key, index, .. }) = self.take(&discarded.message)? else {
                continue;
            };
            count += 1;
            if discarded.dead_letter {
                let value = self.touched_message(&run_key, index)?;
                self.keep_dead_letter(
                    &discarded.message.queue,
                    DeadLetterRecord {
                        producer: discarded.message.producer.clone(),
                        sequence: discarded.message.sequence,
                        reason: discarded.reason,
                        attempts: discarded.attempts,
                        dead_lettered_at_ms: discard.at_ms,
                        message: self.plain(&value)?,
                    },
                )?;
            }
        }
        Ok(OpReply::Removed { count })
    }

    pub(super) fn set_policy(&mut self, change: &SetPolicy) -> OpReply {
        let producer = change.producer.as_deref();
        let stored = if change.replace {
            change.policy
        } else {
            change
                .policy
                .over(self.stored_policy(&change.queue, producer))
        };
        let key = match producer {
            Some(producer) => keys::producer_policy(&change.queue, producer),
            None => keys::queue_policy(&change.queue),
        };
        if stored.is_empty() {
            self.changes.remove(key);
        } else {
            self.changes.insert(key, encode(&stored));
        }
        self.policies_set
            .push((change.queue.clone(), change.producer.clone(), stored));
        self.events.push(AppliedEvent::PolicyChanged {
            shard: self.shard,
            queue: change.queue.clone(),
            producer: change.producer.clone(),
        });
        OpReply::PolicySet { policy: stored }
    }

    pub(super) fn set_sink(&mut self, change: &SetSink) -> Result<OpReply, StorageError> {
        let key = keys::sink(&change.queue);
        let had_one = self.get(&key)?.is_some();
        match &change.sink {
            Some(sink) => self.changes.insert(key, encode(sink)),
            None => self.changes.remove(key),
        }
        Ok(OpReply::SinkSet {
            sink: change.sink.clone(),
            had_one,
        })
    }

    /// Deletes the counters of producers still idle as the leader saw them:
    /// nothing stored, no override, the same tail.
    pub(super) fn forget_idle(&mut self, idle: &[IdleProducer]) -> Result<OpReply, StorageError> {
        let mut count = 0;
        for candidate in idle {
            let overridden = !self
                .stored_policy(&candidate.queue, Some(&candidate.producer))
                .is_empty();
            let record = self.producer(&candidate.queue, &candidate.producer)?;
            if overridden || record.messages != 0 || record.tail != candidate.tail {
                continue;
            }
            let key = keys::producer(&candidate.queue, &candidate.producer);
            self.producers.remove(&key);
            self.changes.remove(key);
            self.forget_runs(keys::message_prefix(&candidate.queue, &candidate.producer))?;
            self.events.push(AppliedEvent::Forgotten {
                shard: self.shard,
                queue: candidate.queue.clone(),
                producer: candidate.producer.clone(),
            });
            count += 1;
        }
        Ok(OpReply::Removed { count })
    }

    /// Drops every run of a forgotten producer from this apply. Its
    /// messages are all removed, so its stored runs and marks are deleted
    /// now; a run the producer starts again at the same sequence in this
    /// apply is a new one and overwrites that deletion at commit.
    pub(super) fn forget_runs(&mut self, prefix: Vec<u8>) -> Result<(), StorageError> {
        let run_keys: Vec<Vec<u8>> = self
            .runs
            .range::<[u8], _>((Bound::Included(prefix.as_slice()), Bound::Unbounded))
            .map(|(run_key, _)| run_key)
            .take_while(|run_key| run_key.starts_with(&prefix))
            .cloned()
            .collect();
        for run_key in run_keys {
            let touched = self.runs.remove(&run_key).expect("listed above");
            if let RunBytes::Stored(_) = touched.run.as_bytes() {
                self.unpin(&touched.run)?;
                if touched.marks_stored {
                    self.changes.remove(keys::removed(&run_key));
                }
                self.changes.remove(run_key);
            }
        }
        self.reader.run_hints().forget_producer(&prefix);
        self.forgotten.insert(prefix);
        Ok(())
    }

    /// A message at rest in the plain form dead letters keep, payload read back from the log.
    fn plain(&self, value: &[u8]) -> Result<Vec<u8>, StorageError> {
        resting::plain(value, self.log()).map_err(storage_error::read_state_machine)
    }
}

/// A message [`PendingApply::take`] deleted: where it lay, to read it back
/// with [`PendingApply::touched_message`], and its producer's record.
pub(super) struct Taken<'a> {
    run_key: Vec<u8>,
    index: usize,
    producer: &'a mut ProducerRecord,
}

/// The bytes a message at rest counts against its producer's limits.
pub(super) fn accounted(value: &[u8]) -> Result<u64, StorageError> {
    resting::accounted_len(value).map_err(storage_error::read_state_machine)
}
