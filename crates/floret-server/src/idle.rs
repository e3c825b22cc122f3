//! Forgets the durable counters of producers that stayed idle: no stored
//! message and no policy override for `producers.forget_idle_after_ms`.
//!
//! An idle producer already costs no memory (the scheduler frees its slot,
//! the fairness window and rate buckets drop it); this removes its producer
//! record from the shard, through raft so every replica does the same. The
//! leader of each shard sweeps its producer records every half idle time;
//! a producer seen idle with the same tail for the whole idle time is
//! proposed for forgetting, and the state machine forgets it only if it is
//! still idle with that tail.
//!
//! IMPLEMENTATION CAVEATS
//! - A sweep reads every producer record of the shards this node leads;
//!   with millions of producers and a short idle time that is a lot of reads.
//! - Between sweeps the leader remembers the producers it saw idle (a tail
//!   and a time each).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use floret_cluster::Shards;
use floret_store::{IdleProducer, Op, ShardId, ShardReader};
use tokio::task::JoinHandle;

use crate::produce::proposer::Proposers;

/// Producers forgotten per raft entry.
const FORGET_PER_ENTRY: usize = 1_000;
/// Shortest pause between sweeps.
const MIN_SWEEP_INTERVAL: Duration = Duration::from_millis(50);

/// A producer first seen idle at `since` with `tail`.
struct SeenIdle {
    tail: u64,
    since: Instant,
}

/// Starts the sweeper of the shards this node leads.
pub fn spawn(shards: Arc<Shards>, proposers: Proposers, idle_after: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let interval = (idle_after / 2).max(MIN_SWEEP_INTERVAL);
        let mut seen: HashMap<(ShardId, String, String), SeenIdle> = HashMap::new();
        loop {
            tokio::time::sleep(interval).await;
            let led: Vec<(ShardId, ShardReader)> = shards
                .groups()
                .filter(|group| shards.leads(group.id))
                .map(|group| (group.id, group.reader.clone()))
                .collect();
            let led_ids: HashSet<ShardId> = led.iter().map(|(id, _)| *id).collect();
            seen.retain(|(shard, _, _), _| led_ids.contains(shard));
            for (shard, reader) in led {
                let idle = match tokio::task::spawn_blocking(move || idle_producers(&reader)).await
                {
                    Ok(Ok(idle)) => idle,
                    Ok(Err(error)) => {
                        tracing::warn!(shard, %error, "cannot read producers to sweep idle ones");
                        continue;
                    }
                    Err(error) => {
                        tracing::warn!(shard, %error, "idle sweep task failed");
                        continue;
                    }
                };
                let due = sweep(&mut seen, shard, idle, idle_after, Instant::now());
                forget(&proposers, shard, due, &mut seen).await;
            }
        }
    })
}

/// Producers of the shard with nothing stored and no override: (queue, producer, tail).
fn idle_producers(reader: &ShardReader) -> Result<Vec<(String, String, u64)>, String> {
    let mut idle = Vec::new();
    for entry in reader.producers() {
        let entry = entry.map_err(|error| error.to_string())?;
        if entry.record.messages == 0
            && reader
                .stored_policy(&entry.queue, Some(&entry.producer))
                .is_empty()
        {
            idle.push((entry.queue, entry.producer, entry.record.tail));
        }
    }
    Ok(idle)
}

/// Updates what was seen idle in `shard` with this sweep; returns the
/// producers idle with the same tail for `idle_after` or more.
fn sweep(
    seen: &mut HashMap<(ShardId, String, String), SeenIdle>,
    shard: ShardId,
    idle: Vec<(String, String, u64)>,
    idle_after: Duration,
    now: Instant,
) -> Vec<IdleProducer> {
    let mut still_idle = HashSet::new();
    let mut due = Vec::new();
    for (queue, producer, tail) in idle {
        let key = (shard, queue, producer);
        let entry = seen
            .entry(key.clone())
            .or_insert(SeenIdle { tail, since: now });
        if entry.tail != tail {
            *entry = SeenIdle { tail, since: now };
        } else if now.duration_since(entry.since) >= idle_after {
            due.push(IdleProducer {
                queue: key.1.clone(),
                producer: key.2.clone(),
                tail,
            });
        }
        still_idle.insert(key);
    }
    seen.retain(|key, _| key.0 != shard || still_idle.contains(key));
    due
}

/// Proposes forgetting `due` producers of `shard`, in entries of bounded size.
async fn forget(
    proposers: &Proposers,
    shard: ShardId,
    due: Vec<IdleProducer>,
    seen: &mut HashMap<(ShardId, String, String), SeenIdle>,
) {
    let Some(proposer) = proposers.get(shard) else {
        return;
    };
    for chunk in due.chunks(FORGET_PER_ENTRY) {
        match proposer.propose(Op::ForgetIdle(chunk.to_vec())).await {
            Ok(_) => {
                metrics::counter!("floret_idle_producers_forgotten_total")
                    .increment(chunk.len() as u64);
                for producer in chunk {
                    seen.remove(&(shard, producer.queue.clone(), producer.producer.clone()));
                }
            }
            Err(error) => {
                tracing::debug!(shard, %error, "could not forget idle producers; next sweep retries");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producer_is_due_only_after_a_whole_idle_time_with_the_same_tail() {
        let mut seen = HashMap::new();
        let idle_after = Duration::from_secs(10);
        let start = Instant::now();
        let idle = |tail| vec![("q".to_owned(), "p".to_owned(), tail)];
        assert!(sweep(&mut seen, 0, idle(5), idle_after, start).is_empty());
        let later = start + Duration::from_secs(6);
        assert!(sweep(&mut seen, 0, idle(6), idle_after, later).is_empty());
        assert!(sweep(&mut seen, 0, idle(6), idle_after, start + idle_after).is_empty());
        let due = sweep(&mut seen, 0, idle(6), idle_after, later + idle_after);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].tail, 6);
    }

    #[test]
    fn producer_busy_again_is_no_longer_remembered() {
        let mut seen = HashMap::new();
        let now = Instant::now();
        sweep(
            &mut seen,
            0,
            vec![("q".into(), "p".into(), 1)],
            Duration::ZERO,
            now,
        );
        sweep(
            &mut seen,
            1,
            vec![("q".into(), "x".into(), 1)],
            Duration::ZERO,
            now,
        );
        sweep(&mut seen, 0, Vec::new(), Duration::ZERO, now);
        assert_eq!(seen.len(), 1, "only the other shard's producer is left");
    }
}
