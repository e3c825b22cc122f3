//! Pushing queues into the sinks set on them (`Admin.SetSink`): on every
//! node, one pump per queue with a sink (`pump.rs`), fed by this node's
//! dispatcher, so each node pushes the messages of the shards it leads and a
//! failover moves them with the leadership.
//!
//! The supervisor here reads the sinks from a replica this node holds
//! (every shard stores every sink) every [`RECHECK`], starts a pump for a
//! new sink, restarts one whose sink changed, and stops one whose sink was
//! removed, letting its batch at the sink finish.
//!
//! - `spec.rs`: a sink as the API sends it, checked, with defaults.
//! - `batcher.rs`, `backoff.rs`, `rate_split.rs`, `in_flight_split.rs`,
//!   `aimd.rs`: pure batching, retry waits, the rate cap's split between
//!   nodes and its token bucket, the split of the cap on batches in flight,
//!   and the share of the rate used while the sink pushes back.
//! - `weights.rs`: the backlogged weights the split goes by.
//! - `sender.rs`: sending one batch and settling its messages.
//! - `target.rs`, `webhook.rs`, `amqp.rs`: the gRPC, HTTP and AMQP sink
//!   clients.
//!
//! IMPLEMENTATION CAVEATS
//! - A sink change reaches the pumps within [`RECHECK`] plus the time the
//!   replica read takes to apply it.

mod aimd;
mod amqp;
mod backoff;
mod batcher;
mod in_flight_split;
mod pump;
mod rate_split;
mod sender;
pub mod spec;
mod target;
mod webhook;
mod weights;

use std::collections::BTreeMap;
use std::time::Duration;

use floret_cluster::Shards;
use floret_store::SinkSpec;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use pump::PumpParts;
pub use weights::LocalSinkWeights;

/// How often a pump with a rate cap asks the other nodes for their weights.
pub const WEIGHT_POLL: Duration = Duration::from_millis(250);

/// How often the supervisor reads the sinks again.
pub const RECHECK: Duration = Duration::from_secs(1);

/// A pump that runs.
struct RunningPump {
    sink: SinkSpec,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Starts the node's sink supervisor; it stops its pumps and ends once
/// `stopped` turns true.
pub fn spawn(parts: PumpParts, mut stopped: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut pumps: BTreeMap<String, RunningPump> = BTreeMap::new();
        let mut recheck = tokio::time::interval(RECHECK);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = recheck.tick() => {}
                _ = stopped.changed() => break,
            }
            if *stopped.borrow() {
                break;
            }
            match stored_sinks(&parts.shards) {
                Ok(wanted) => follow(&mut pumps, wanted, &parts),
                Err(error) => tracing::warn!(%error, "cannot read the queues' sinks"),
            }
        }
        for pump in pumps.values() {
            pump.stop.send_replace(true);
        }
        for (_, pump) in pumps {
            let _ended = pump.task.await;
        }
    })
}

/// Stops the pumps whose sink changed or went, and starts the missing ones.
fn follow(
    pumps: &mut BTreeMap<String, RunningPump>,
    wanted: BTreeMap<String, SinkSpec>,
    parts: &PumpParts,
) {
    pumps.retain(|queue, pump| {
        let keep = wanted.get(queue) == Some(&pump.sink) && !pump.task.is_finished();
        if !keep {
            pump.stop.send_replace(true);
        }
        keep
    });
    for (queue, sink) in wanted {
        if pumps.contains_key(&queue) {
            continue;
        }
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(pump::run(
            queue.clone(),
            sink.clone(),
            parts.clone(),
            stopped,
        ));
        pumps.insert(queue, RunningPump { sink, stop, task });
    }
}

/// The sinks as a replica this node holds stores them: one it leads if
/// there is one (it has applied everything committed), else any.
fn stored_sinks(shards: &Shards) -> Result<BTreeMap<String, SinkSpec>, String> {
    let mut groups = shards.groups().peekable();
    let Some(first) = groups.peek().map(|group| group.id) else {
        return Ok(BTreeMap::new());
    };
    let shard = shards
        .groups()
        .map(|group| group.id)
        .find(|&id| shards.leads(id))
        .unwrap_or(first);
    let Some(group) = shards.group(shard) else {
        return Ok(BTreeMap::new());
    };
    let sinks = group
        .reader
        .sinks()
        .map_err(|error| format!("shard {shard}: {error}"))?;
    Ok(sinks.into_iter().collect())
}
