//! The dispatcher task: the runtime around the [`DispatchBook`]. It reads
//! the clock, feeds the book the commands of [`DispatcherHandle`] in order,
//! lets it report backlogs after every turn, wakes it at its next deadline, sends deliveries down consumer channels,
//! proposes the discards the book decided, and counts metrics. Every
//! decision is the book's.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use floret_sched::SchedulerConfig;
use floret_store::policy::{Policy, PolicyTable};
use floret_store::records::StoredMessage;
use floret_store::{Discard, Op, ShardId, ShardReader};
use tokio::sync::mpsc;

use super::book::{
    ConsumerChannel, ConsumerClosed, DispatchBook, Now, ReadError, ShardContents, ShardDiscard,
    StoredBacklog, Tenancy,
};
use super::{ConsumerEvent, DispatcherCommand, DispatcherHandle};
use crate::produce::proposer::Proposers;

/// Commands handled in one go before the loop checks its lease timer again.
const COMMANDS_PER_TURN: usize = 256;

type Book = DispatchBook<ShardReaders, mpsc::UnboundedSender<ConsumerEvent>>;

/// Commands waiting for the dispatcher task, before it is spawned.
pub(crate) struct DispatcherInbox(mpsc::UnboundedReceiver<DispatcherCommand>);

/// The dispatcher's handle and inbox: the handle works (commands queue up)
/// before the task exists, so state machines can report from their first apply.
pub(crate) fn channel() -> (DispatcherHandle, DispatcherInbox) {
    let (commands, receiver) = mpsc::unbounded_channel();
    (DispatcherHandle { commands }, DispatcherInbox(receiver))
}

/// Starts the dispatcher task over the shards' readers (indexed by shard
/// id; None for a shard this node holds no replica of).
pub(crate) fn spawn(
    (handle, inbox): (DispatcherHandle, DispatcherInbox),
    readers: Vec<Option<ShardReader>>,
    proposers: Proposers,
    scheduler_config: SchedulerConfig,
    tenancy: Tenancy,
    max_credits: u32,
) {
    let dispatcher = Dispatcher {
        book: DispatchBook::new(ShardReaders(readers), scheduler_config, max_credits)
            .with_tenancy(tenancy),
        dwell_histograms: HashMap::new(),
        proposers,
        handle,
    };
    tokio::spawn(dispatcher.run(inbox.0));
}

struct Dispatcher {
    book: Book,
    /// Each queue's histogram of waits to a first delivery.
    dwell_histograms: HashMap<Arc<str>, metrics::Histogram>,
    /// Proposers of the shards this node holds, to discard messages.
    proposers: Proposers,
    /// This task's own handle, for what its spawned proposals report.
    handle: DispatcherHandle,
}

impl Dispatcher {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<DispatcherCommand>) {
        loop {
            let deadline = self.book.next_deadline(now());
            let turn = tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { break };
                    let turn = now();
                    self.handle(command, turn);
                    for _ in 1..COMMANDS_PER_TURN {
                        match commands.try_recv() {
                            Ok(command) => self.handle(command, turn),
                            Err(_) => break,
                        }
                    }
                    turn
                }
                () = sleep_until(deadline), if deadline.is_some() => {
                    let turn = now();
                    self.book.tick(turn);
                    turn
                }
            };
            self.book.report_backlogs(turn);
            self.carry_out_outbox();
        }
        tracing::debug!("dispatcher stopped");
    }

    /// Feeds one command to the book; `now` is read once per turn of
    /// commands (a turn takes well under a millisecond).
    fn handle(&mut self, command: DispatcherCommand, now: Now) {
        let book = &mut self.book;
        match command {
            DispatcherCommand::Applied(event) => book.applied(event, now),
            DispatcherCommand::Leadership { shard, leader } => book.leadership(shard, leader, now),
            DispatcherCommand::Subscribe {
                queue,
                credits,
                events,
                for_peer,
                owner,
                reply,
            } => {
                let id = book.subscribe(&queue, credits, events, for_peer, owner, now);
                let _caller_gone = reply.send(id);
            }
            DispatcherCommand::Credit {
                consumer,
                credits,
                replace,
            } => book.credit(consumer, credits, replace, now),
            DispatcherCommand::TenantShares { consumer, shares } => {
                book.tenant_shares(consumer, shares, now)
            }
            DispatcherCommand::Settle {
                kind,
                ids,
                by,
                reply,
            } => {
                let _caller_gone = reply.send(book.settle(kind, ids, &by, now));
            }
            DispatcherCommand::RemovalCommitted { ids, acked } => {
                book.removal_committed(&ids, acked, now)
            }
            DispatcherCommand::ConsumerGone { consumer } => book.consumer_gone(consumer, now),
            DispatcherCommand::Activity {
                with_producers,
                reply,
            } => {
                let _caller_gone = reply.send(book.activity(with_producers, now));
            }
        }
    }

    /// Counts what the book did and proposes the discards it decided.
    fn carry_out_outbox(&mut self) {
        let outbox = self.book.take_outbox();
        for (queue, dwell_ms) in outbox.first_deliveries {
            self.dwell_histogram(queue)
                .record(dwell_ms as f64 / 1_000.0);
        }
        if outbox.lease_expiries > 0 {
            metrics::counter!("floret_lease_expiries_total").increment(outbox.lease_expiries);
        }
        for discard in outbox.discards {
            self.discard(discard);
        }
    }

    /// `queue`'s histogram of waits to a first delivery, registered once.
    fn dwell_histogram(&mut self, queue: Arc<str>) -> &metrics::Histogram {
        self.dwell_histograms.entry(queue).or_insert_with_key(
            |queue| metrics::histogram!("floret_dwell_seconds", "queue" => queue.to_string()),
        )
    }

    /// Commits the discard of messages whose leases the book holds; the
    /// leases end once it commits. If it does not, they lapse and the
    /// messages come up (and are discarded) again.
    fn discard(&self, discard: ShardDiscard) {
        let ShardDiscard {
            shard,
            ids,
            messages,
        } = discard;
        let Some(proposer) = self.proposers.get(shard).cloned() else {
            return;
        };
        for discarded in &messages {
            let queue = &discarded.message.queue;
            crate::telemetry::count_for_queue("floret_discarded_total", queue, 1);
            if discarded.dead_letter {
                crate::telemetry::count_for_queue("floret_dead_lettered_messages_total", queue, 1);
            }
        }
        let handle = self.handle.clone();
        tokio::spawn(async move {
            let op = Op::Discard(Discard {
                at_ms: now().unix_ms as i64,
                messages,
            });
            match proposer.propose(op).await {
                Ok(_) => handle.removal_committed(ids, false),
                Err(error) => tracing::warn!(
                    shard,
                    %error,
                    "could not discard expired or exhausted messages; they come back when their leases lapse"
                ),
            }
        });
    }
}

impl ConsumerChannel for mpsc::UnboundedSender<ConsumerEvent> {
    fn send(&self, event: ConsumerEvent) -> Result<(), ConsumerClosed> {
        mpsc::UnboundedSender::send(self, event).map_err(|_| ConsumerClosed)
    }
}

/// The node's shard readers, indexed by shard id (None where this node holds no replica).
struct ShardReaders(Vec<Option<ShardReader>>);

impl ShardReaders {
    fn reader(&self, shard: ShardId) -> &ShardReader {
        self.0[shard as usize]
            .as_ref()
            .expect("the book reads only shards this node holds")
    }
}

impl ShardContents for ShardReaders {
    fn holds(&self, shard: ShardId) -> bool {
        self.0.get(shard as usize).is_some_and(Option::is_some)
    }

    fn shard_count(&self) -> usize {
        self.0.len()
    }

    fn message(
        &self,
        shard: ShardId,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Result<Option<StoredMessage>, ReadError> {
        Ok(self.reader(shard).message(queue, producer, sequence)?)
    }

    fn deliver_at(
        &self,
        shard: ShardId,
        queue: &str,
        producer: &str,
        sequence: u64,
    ) -> Option<i64> {
        self.reader(shard).deliver_at(queue, producer, sequence)
    }

    fn policy(&self, shard: ShardId, queue: &str, producer: &str) -> Policy {
        self.reader(shard).policy(queue, producer)
    }

    fn stored_policy(&self, shard: ShardId, queue: &str, producer: Option<&str>) -> Policy {
        self.reader(shard).stored_policy(queue, producer)
    }

    fn policies(&self, shard: ShardId) -> PolicyTable {
        self.reader(shard).policies()
    }

    fn producer_tail(
        &self,
        shard: ShardId,
        queue: &str,
        producer: &str,
    ) -> Result<Option<u64>, ReadError> {
        let record = self.reader(shard).producer(queue, producer)?;
        Ok(record.map(|record| record.tail))
    }

    fn backlogs(&self, shard: ShardId) -> Result<Vec<StoredBacklog>, ReadError> {
        let reader = self.reader(shard);
        let mut backlogs = Vec::new();
        for entry in reader.producers() {
            let entry = entry?;
            if entry.record.messages == 0 {
                continue;
            }
            match reader.oldest_message(&entry.queue, &entry.producer, entry.record.head) {
                Ok(Some((first, _))) => backlogs.push(StoredBacklog {
                    queue: entry.queue,
                    producer: entry.producer,
                    sequences: first..entry.record.tail,
                }),
                Ok(None) => {}
                Err(error) => {
                    tracing::error!(shard, %error, "cannot read a producer's oldest message");
                }
            }
        }
        Ok(backlogs)
    }

    fn producers(&self, shard: ShardId) -> Vec<(String, String)> {
        self.reader(shard)
            .producers()
            .flatten()
            .map(|entry| (entry.queue, entry.producer))
            .collect()
    }
}

/// The time on both clocks.
fn now() -> Now {
    Now {
        instant: Instant::now(),
        unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}
