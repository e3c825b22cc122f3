//! Raft timing and snapshot tunables shared by every shard, and the
//! openraft configuration made from them.

use std::time::Duration;

use openraft::SnapshotPolicy;

/// Raft timing and snapshot tunables shared by every shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftTuning {
    /// Leader heartbeat; the groups' heartbeats to one peer travel
    /// together on its append stream. It is also openraft's timeout for
    /// every append: under a flood on a loaded 2-core machine a few appends
    /// a minute take longer than 100 ms, and openraft logs them as errors
    /// and sends them again.
    pub heartbeat: Duration,
    /// Lower bound of the election timeout. A follower calls an election
    /// after the leader lease (the upper bound) plus a random timeout
    /// between the bounds: with 200-400 ms, 600-800 ms after the leader's
    /// last heartbeat or append. That holds under a flood only because
    /// nothing slow runs on the runtime's threads: a snapshot captured
    /// there once held its raft core, and the heartbeats, for a second.
    pub election_timeout_min: Duration,
    /// Upper bound of the election timeout; also the leader lease.
    pub election_timeout_max: Duration,
    /// Entries applied since the last snapshot before a new one is built.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot, so a briefly lagging
    /// replica catches up from the log instead of a whole snapshot.
    pub logs_kept_after_snapshot: u64,
    /// Bytes of a snapshot sent in one message to a replica that needs it.
    pub snapshot_chunk_bytes: u64,
}

impl Default for RaftTuning {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(200),
            election_timeout_max: Duration::from_millis(400),
            snapshot_every_entries: 20_000,
            logs_kept_after_snapshot: 1_000,
            snapshot_chunk_bytes: 1024 * 1024,
        }
    }
}

/// The openraft configuration of every shard's group.
pub(super) fn raft_config(tuning: &RaftTuning) -> Result<openraft::Config, String> {
    let election_max = tuning.election_timeout_max.as_millis() as u64;
    let config = openraft::Config {
        cluster_name: "floret".into(),
        heartbeat_interval: tuning.heartbeat.as_millis() as u64,
        election_timeout_min: tuning.election_timeout_min.as_millis() as u64,
        election_timeout_max: election_max,
        install_snapshot_timeout: election_max.max(5_000),
        snapshot_max_chunk_size: tuning.snapshot_chunk_bytes,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(tuning.snapshot_every_entries),
        max_in_snapshot_log_to_keep: tuning.logs_kept_after_snapshot,
        ..Default::default()
    };
    config.validate().map_err(|e| e.to_string())
}
