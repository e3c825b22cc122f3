//! One queue's sink pump on one node: a consumer of this node's own
//! dispatcher (so it gets the messages of the shards this node leads, in
//! the same fair order, under the same policies as consumer streams), which
//! batches what it gets (`batcher.rs`), and sends each batch to the sink
//! (`sender.rs`, which settles every message by the sink's answer).
//!
//! With a rate cap, the pump spends its part of the cap (`rate_split.rs`,
//! recomputed every [`super::WEIGHT_POLL`] from every node's backlogged
//! weight; a part grows only after two polls, it shrinks at once), or the
//! share of it `aimd.rs` leaves while the sink pushes back (or answers
//! slowly), from a token
//! bucket, cuts its batches to what the bucket holds,
//! and takes from the dispatcher only one batch more than it may have at
//! the sink, so the messages it holds are the next ones in fair order, not
//! a hoard.
//!
//! It has one batch at the sink at a time; with `max_in_flight`, its part
//! of that cluster-wide cap (`in_flight_split.rs`, from the same polls, and
//! the smallest of the last three parts too); with a rate cap and no
//! `max_in_flight`, as many as its part of the rate needs over the sink's
//! average answer time (`rate_split::batches_for_rate`). The next batch
//! forms meanwhile. A batch leaves the sink's count once the sink answered:
//! its settling commits in the background (at most
//! [`SETTLING_BATCHES_AT_MOST`] batches at once), so a raft round trip does
//! not stand between two batches.
//!
//! IMPLEMENTATION CAVEATS
//! - Batches at the sink at once may arrive in another order than they were
//!   sent, and so may one producer's messages in them.
//! - A message handed back after a sink outage counts an attempt, so a
//!   queue with `max_attempts` dead-letters messages during a long outage.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use floret_cluster::Shards;
use floret_store::SinkSpec;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, watch};

use super::aimd::{Aimd, AnswerTimes};
use super::batcher::Batcher;
use super::in_flight_split::node_batches;
use super::rate_split::{TokenBucket, batches_for_rate, node_rate};
use super::sender::{BatchSender, InFlight, Settling};
use super::target::Target;
use super::weights::{self, LocalSinkWeights, PumpDemand};
use crate::deliver::{
    ConsumerEvent, Delivered, DispatcherHandle, SettledBy, StreamKey, StreamOwner,
};
use crate::settle::Settler;

/// What every pump of a node shares.
#[derive(Clone)]
pub struct PumpParts {
    /// This node's dispatcher.
    pub dispatcher: DispatcherHandle,
    /// Settles what the sink answered.
    pub settler: Settler,
    /// How long a delivery stays leased: a batch is held at most half of it.
    pub lease_timeout: Duration,
    /// The cluster, for the other nodes' weights.
    pub shards: Arc<Shards>,
    /// This node's pumps' weights, which the other nodes ask for.
    pub weights: LocalSinkWeights,
}

/// Batches whose settling may be under way at once: the next batch goes to
/// the sink while the last ones' removals commit, but a pump whose sink is
/// faster than raft waits rather than holding ever more leases.
const SETTLING_BATCHES_AT_MOST: usize = 4;

/// Weight of the latest batch in a pump's average answer time.
const ANSWER_TIME_WEIGHT: f64 = 0.2;

/// The messages a pump holds, which its credits bound: taken from the
/// dispatcher and not yet answered by the sink, or asked for again and not
/// yet handed back. (Those settling are bounded by
/// [`SETTLING_BATCHES_AT_MOST`] instead.)
#[derive(Default)]
struct Held {
    /// In the batcher, or waiting for tokens.
    waiting: usize,
    /// At the sink.
    in_flight: usize,
    /// Asked for again, waiting for their back-off to hand them back.
    handing_back: usize,
}

impl Held {
    fn total(&self) -> usize {
        self.waiting + self.in_flight + self.handing_back
    }
}

/// Pumps `queue` into `sink` until `stop` turns true (or its sender goes):
/// the batch at the sink is finished and settled first.
pub async fn run(queue: String, sink: SinkSpec, parts: PumpParts, mut stop: watch::Receiver<bool>) {
    let timeout = Duration::from_millis(u64::from(sink.timeout_ms));
    let target = match Target::new(&sink.target, timeout) {
        Ok(target) => target,
        Err(error) => {
            tracing::error!(%queue, %error, "the sink cannot be dialled; not pumping");
            return;
        }
    };
    let owner = StreamOwner {
        tenant: Arc::from(""),
        stream: StreamKey::random(),
    };
    let (events, mut deliveries) = mpsc::unbounded_channel();
    let (handed_back, mut handed_back_counts) = mpsc::unbounded_channel();
    let (parts_known, mut part_changes) = watch::channel(None::<NodeParts>);
    let parts_poll = (sink.rate > 0 || sink.max_in_flight > 0).then(|| {
        tokio::spawn(follow_parts(
            queue.clone(),
            sink.clone(),
            parts.clone(),
            parts_known,
        ))
    });
    let mut bucket = (sink.rate > 0).then(|| {
        let even = f64::from(sink.rate) / parts.shards.peers().node_ids().len().max(1) as f64;
        TokenBucket::new(even, std::time::Instant::now())
    });
    let batch_limit = |bucket: &Option<TokenBucket>| {
        let limit = sink.batch_max as usize;
        bucket
            .as_ref()
            .map_or(limit, |b| limit.min(b.batch_limit()))
    };
    let mut in_flight_part = 1;
    let mut answer_time: Option<Duration> = None;
    let allowed_batches = |bucket: &Option<TokenBucket>,
                           in_flight_part: usize,
                           answer_time: Option<Duration>| {
        match (bucket, answer_time) {
            (Some(bucket), Some(answer_time)) if sink.max_in_flight == 0 => batches_for_rate(
                bucket.rate(),
                batch_limit(&Some(bucket.clone())),
                answer_time,
            ),
            _ => in_flight_part,
        }
    };
    let mut unused_credits = 2 * batch_limit(&bucket);
    let Ok(consumer) = parts
        .dispatcher
        .subscribe(
            queue.clone(),
            unused_credits as u32,
            events,
            false,
            owner.clone(),
        )
        .await
    else {
        return;
    };
    tracing::info!(%queue, target = ?sink.target, batch_max = sink.batch_max, linger_ms = sink.linger_ms, rate = sink.rate, "pumping the queue into its sink");
    let sender = BatchSender {
        queue: queue.clone(),
        target,
        parts: parts.clone(),
        by: SettledBy::Stream(owner),
        handed_back,
    };
    let mut batcher = Batcher::new(
        batch_limit(&bucket),
        sink.batch_max_bytes,
        Duration::from_millis(u64::from(sink.linger_ms)),
    );
    let mut held = Held::default();
    let mut aimd = Aimd::new(std::time::Instant::now());
    let mut answer_times = AnswerTimes::new(std::time::Instant::now());
    let mut rate_part: Option<f64> = None;
    let mut in_flight: FuturesUnordered<InFlight> = FuturesUnordered::new();
    let mut settling: FuturesUnordered<Settling> = FuturesUnordered::new();
    let in_flight_gauge =
        metrics::gauge!("floret_sink_batches_in_flight", "queue" => queue.clone());
    let mut next: Option<Vec<Delivered>> = None;
    let mut tokens_at: Option<std::time::Instant> = None;
    loop {
        let batches_allowed = allowed_batches(&bucket, in_flight_part, answer_time);
        let may_send =
            in_flight.len() < batches_allowed && settling.len() < SETTLING_BATCHES_AT_MOST;
        let wake = if !may_send {
            None
        } else if next.is_some() {
            tokens_at
        } else {
            batcher.deadline()
        };
        tokio::select! {
            event = deliveries.recv() => match event {
                Some(ConsumerEvent::Delivery(delivered)) => {
                    unused_credits = unused_credits.saturating_sub(1);
                    held.waiting += 1;
                    let bytes = delivered.message.payload.len() as u64;
                    batcher.push(*delivered, bytes, std::time::Instant::now());
                }
                Some(ConsumerEvent::Backlog(report)) => {
                    parts.weights.set_weight(&queue, report.weight);
                }
                Some(ConsumerEvent::Settled(_)) => {}
                None => break,
            },
            Some(ended) = in_flight.next(), if !in_flight.is_empty() => {
                in_flight_gauge.set(in_flight.len() as f64);
                held.in_flight -= ended.sent;
                held.handing_back += ended.asked_again;
                settling.push(ended.settle);
                let now = std::time::Instant::now();
                let mut slow = false;
                if let Some(answered_in) = ended.answered_in {
                    answer_time = Some(answer_time.map_or(answered_in, |average| {
                        average.mul_f64(1.0 - ANSWER_TIME_WEIGHT) + answered_in.mul_f64(ANSWER_TIME_WEIGHT)
                    }));
                    slow = answer_times.answered(answered_in, now);
                    if slow {
                        tracing::debug!(%queue, ?answered_in, "the sink answered slowly; using less of this node's part");
                    }
                }
                if ended.pushed_back || slow {
                    aimd.pushed_back(now);
                } else {
                    aimd.took(now);
                }
                if let (Some(bucket), Some(part)) = (bucket.as_mut(), rate_part) {
                    bucket.set_rate(part * aimd.share(), now);
                    batcher.set_batch_max(batch_limit(&Some(bucket.clone())));
                }
            }
            Some(()) = settling.next(), if !settling.is_empty() => {}
            Some(count) = handed_back_counts.recv() => {
                held.handing_back = held.handing_back.saturating_sub(count);
            }
            Ok(()) = part_changes.changed() => {
                let node_parts = *part_changes.borrow();
                rate_part = node_parts.and_then(|p| p.rate);
                in_flight_part = node_parts.map_or(1, |p| p.batches);
                if let (Some(bucket), Some(part)) = (bucket.as_mut(), rate_part) {
                    bucket.set_rate(part * aimd.share(), std::time::Instant::now());
                    batcher.set_batch_max(batch_limit(&Some(bucket.clone())));
                }
            }
            () = sleep_until(wake), if wake.is_some() => {}
            _ = stop.changed() => break,
        }
        let batches_allowed = allowed_batches(&bucket, in_flight_part, answer_time);
        while in_flight.len() < batches_allowed && settling.len() < SETTLING_BATCHES_AT_MOST {
            let now = std::time::Instant::now();
            if next.is_none() {
                next = batcher.take(now);
            }
            let Some(batch) = next.take() else {
                break;
            };
            match bucket.as_mut().map_or(Ok(()), |b| b.take(batch.len(), now)) {
                Ok(()) => {
                    tokens_at = None;
                    held.waiting -= batch.len();
                    held.in_flight += batch.len();
                    parts.weights.sent(&queue, batch.len());
                    in_flight.push(Box::pin(sender.clone().send(batch)));
                    in_flight_gauge.set(in_flight.len() as f64);
                }
                Err(ready) => {
                    parts.weights.rate_held_back(&queue);
                    tokens_at = Some(ready);
                    next = Some(batch);
                    break;
                }
            }
        }
        if in_flight.len() >= batches_allowed && held.waiting >= batch_limit(&bucket) {
            parts.weights.batches_held_back(&queue);
        }
        let wanted = ((batches_allowed + 1) * batch_limit(&bucket)).saturating_sub(held.total());
        if wanted != unused_credits {
            let granted = if wanted > unused_credits {
                parts
                    .dispatcher
                    .credit(consumer, (wanted - unused_credits) as u32)
            } else {
                parts.dispatcher.set_credits(consumer, wanted as u32)
            };
            if granted.is_err() {
                break;
            }
            unused_credits = wanted;
        }
    }
    while let Some(ended) = in_flight.next().await {
        settling.push(ended.settle);
    }
    in_flight_gauge.set(0.0);
    while settling.next().await.is_some() {}
    if let Some(parts_poll) = parts_poll {
        parts_poll.abort();
    }
    parts.weights.forget(&queue);
    parts.dispatcher.consumer_gone(consumer);
    tracing::info!(%queue, "stopped pumping the queue into its sink");
}

/// This node's parts of a sink's cluster-wide caps.
#[derive(Debug, Clone, Copy)]
struct NodeParts {
    /// Of `rate`, messages/s (None: no rate cap).
    rate: Option<f64>,
    /// Of `max_in_flight`: batches at the sink at once (1 without that cap).
    batches: usize,
}

/// Recomputes this node's parts of the sink's caps every
/// [`super::WEIGHT_POLL`] and publishes the smallest of the last
/// [`PARTS_REMEMBERED`] of each (starting from even parts), so a part grows
/// only after the other nodes have had two polls to see why and shrink
/// theirs.
async fn follow_parts(
    queue: String,
    sink: SinkSpec,
    parts: PumpParts,
    published: watch::Sender<Option<NodeParts>>,
) {
    let mut poll = tokio::time::interval(super::WEIGHT_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let peers = parts.shards.peers();
    let nodes = peers.node_ids().len().max(1);
    let rate_cap = f64::from(sink.rate);
    let even = NodeParts {
        rate: (sink.rate > 0).then_some(rate_cap / nodes as f64),
        batches: (sink.max_in_flight as usize / nodes).max(1),
    };
    let mut recent: VecDeque<NodeParts> = std::iter::repeat_n(even, PARTS_REMEMBERED).collect();
    loop {
        poll.tick().await;
        let own = parts.weights.roll(
            &queue,
            std::time::Instant::now(),
            recent.iter().filter_map(|part| part.rate).reduce(f64::min),
        );
        let others = weights::others(&parts.shards, &queue).await;
        let answers: Vec<Option<PumpDemand>> = others.iter().map(|(_, demand)| *demand).collect();
        recent.pop_front();
        recent.push_back(NodeParts {
            rate: (sink.rate > 0).then(|| node_rate(rate_cap, &own, &answers)),
            batches: if sink.max_in_flight > 0 {
                node_batches(sink.max_in_flight, peers.node_id(), &own, &others)
            } else {
                1
            },
        });
        let used = NodeParts {
            rate: recent.iter().filter_map(|p| p.rate).reduce(f64::min),
            batches: recent.iter().map(|p| p.batches).min().unwrap_or(1),
        };
        tracing::debug!(%queue, ?own, ?others, ?used, "the sink's parts of this node");
        if let Some(rate) = used.rate {
            metrics::gauge!("floret_sink_rate_part", "queue" => queue.clone()).set(rate);
        }
        metrics::gauge!("floret_sink_in_flight_part", "queue" => queue.clone())
            .set(used.batches as f64);
        if published.send(Some(used)).is_err() {
            return;
        }
    }
}

/// Parts a pump takes the smallest of.
const PARTS_REMEMBERED: usize = 3;

async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await,
        None => std::future::pending().await,
    }
}
