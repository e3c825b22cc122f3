//! The bookkeeping of `floret bench moves`, pure: the shards and members
//! each status poll shows ([`Poll`]), and what one change of members cost,
//! followed over the polls given with their time ([`ChangeTracker`]).
//!
//! IMPLEMENTATION CAVEATS
//! - A shard's move is timed between polls: one shorter than the poll
//!   interval shows as one interval.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use floret_client::ClusterStatusResponse;

/// One shard as a status poll showed it (its leader's report).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardSeen {
    pub leader: u64,
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
    pub placed: BTreeSet<u64>,
    pub stored_bytes: u64,
}

impl ShardSeen {
    /// Whether the shard is moving: its voters are not where the placement
    /// puts it, or it has learners.
    fn moving(&self) -> bool {
        self.voters != self.placed || !self.learners.is_empty()
    }
}

/// The shards and the members (those not leaving, and the epoch) of one
/// status poll.
#[derive(Debug, Clone, Default)]
pub struct Poll {
    pub shards: BTreeMap<u32, ShardSeen>,
    pub members: Vec<u64>,
    pub leaving: usize,
    pub epoch: Option<u64>,
}

impl Poll {
    pub fn of(status: &ClusterStatusResponse) -> Self {
        let set = |nodes: &[u64]| nodes.iter().copied().collect::<BTreeSet<u64>>();
        let membership = status.membership.clone().unwrap_or_default();
        Self {
            shards: status
                .shards
                .iter()
                .map(|shard| {
                    let seen = ShardSeen {
                        leader: shard.leader_id,
                        voters: set(&shard.voters),
                        learners: set(&shard.learners),
                        placed: set(&shard.placed),
                        stored_bytes: shard.backlog_bytes,
                    };
                    (shard.shard_id, seen)
                })
                .collect(),
            members: membership
                .members
                .iter()
                .filter(|member| !member.leaving)
                .map(|member| member.node_id)
                .collect(),
            leaving: membership.members.iter().filter(|m| m.leaving).count(),
            epoch: membership.epoch,
        }
    }

    /// Every shard led, where the placement puts it, and nobody leaving.
    fn settled(&self) -> bool {
        !self.shards.is_empty()
            && self.leaving == 0
            && self
                .shards
                .values()
                .all(|shard| shard.leader != 0 && !shard.moving())
    }
}

/// Follows one change of members over status polls, given their time.
#[derive(Debug)]
pub struct ChangeTracker {
    before: Poll,
    latest: Poll,
    /// When each shard was first seen moving (or changed without being
    /// seen moving: the poll before).
    moving_since: BTreeMap<u32, Duration>,
    /// Each shard's move: when it was first seen moving, and settled.
    moves: BTreeMap<u32, (Duration, Duration)>,
    last_poll: Duration,
}

/// What one change cost.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ChangeFigures {
    pub members_before: Vec<u64>,
    pub members_after: Vec<u64>,
    pub shards: usize,
    pub shards_moved: usize,
    /// Replicas copied to a new node, of the replicas after the change.
    pub replicas_copied_share: f64,
    /// Stored bytes copied to new nodes, of the stored bytes of every
    /// replica after the change.
    pub bytes_copied_share: f64,
    pub bytes_copied: u64,
    /// The least share any placement could copy: the joining nodes' share
    /// of the members after, or the leaving nodes' of those before.
    pub ideal_share: f64,
    /// Each moved shard's move, in seconds, shortest first.
    pub shard_move_seconds: Vec<f64>,
}

impl ChangeTracker {
    /// Starts following a change from the poll taken at `at`, just before it.
    pub fn new(at: Duration, before: Poll) -> Self {
        Self {
            latest: before.clone(),
            before,
            moving_since: BTreeMap::new(),
            moves: BTreeMap::new(),
            last_poll: at,
        }
    }

    /// Takes the poll taken at `at`. Returns whether the change has
    /// settled: the members changed, and every shard is led where the
    /// placement puts it.
    pub fn observe(&mut self, at: Duration, poll: Poll) -> bool {
        for (&shard, seen) in &poll.shards {
            let changed = self
                .latest
                .shards
                .get(&shard)
                .is_some_and(|earlier| earlier.voters != seen.voters);
            if seen.moving() || changed {
                let since = if seen.moving() { at } else { self.last_poll };
                self.moving_since.entry(shard).or_insert(since);
            }
            if !seen.moving()
                && let Some(since) = self.moving_since.remove(&shard)
            {
                self.moves.insert(shard, (since, at));
            }
        }
        self.last_poll = at;
        self.latest = poll;
        self.latest.epoch != self.before.epoch && self.latest.settled()
    }

    /// The figures of the change, from the first poll to the latest.
    pub fn figures(&self) -> ChangeFigures {
        let mut copies = 0usize;
        let mut replicas_after = 0usize;
        let mut bytes_copied = 0u64;
        let mut bytes_after = 0u64;
        let mut moved = 0usize;
        for (shard, after) in &self.latest.shards {
            let before = self.before.shards.get(shard).cloned().unwrap_or_default();
            let stored = before.stored_bytes.max(after.stored_bytes);
            let new: usize = after.voters.difference(&before.voters).count();
            copies += new;
            bytes_copied += new as u64 * stored;
            replicas_after += after.voters.len();
            bytes_after += after.voters.len() as u64 * stored;
            if after.voters != before.voters {
                moved += 1;
            }
        }
        let (members_before, members_after) = (&self.before.members, &self.latest.members);
        let share = |part: usize, of: usize| part as f64 / of.max(1) as f64;
        let mut shard_move_seconds: Vec<f64> = self
            .moves
            .values()
            .map(|(since, until)| (*until - *since).as_secs_f64())
            .collect();
        shard_move_seconds.sort_by(f64::total_cmp);
        ChangeFigures {
            members_before: members_before.clone(),
            members_after: members_after.clone(),
            shards: self.latest.shards.len(),
            shards_moved: moved,
            replicas_copied_share: share(copies, replicas_after),
            bytes_copied_share: bytes_copied as f64 / bytes_after.max(1) as f64,
            bytes_copied,
            ideal_share: floret_cluster::least_share_copied(members_before, members_after),
            shard_move_seconds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(voters: &[u64], learners: &[u64], placed: &[u64], bytes: u64) -> ShardSeen {
        ShardSeen {
            leader: voters[0],
            voters: voters.iter().copied().collect(),
            learners: learners.iter().copied().collect(),
            placed: placed.iter().copied().collect(),
            stored_bytes: bytes,
        }
    }

    fn poll(epoch: u64, members: &[u64], shards: Vec<ShardSeen>) -> Poll {
        Poll {
            shards: (0..).zip(shards).collect(),
            members: members.to_vec(),
            leaving: 0,
            epoch: Some(epoch),
        }
    }

    fn at(seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds)
    }

    #[test]
    fn a_node_joining_copies_the_moved_shards_bytes_and_each_move_is_timed_from_its_first_sight() {
        let three = [1, 2, 3];
        let four = [1, 2, 3, 4];
        let mut tracker = ChangeTracker::new(
            at(0.0),
            poll(
                5,
                &three,
                vec![
                    shard(&[1, 2, 3], &[], &[1, 2, 3], 1_000),
                    shard(&[2, 3, 1], &[], &[2, 3, 1], 3_000),
                ],
            ),
        );
        let moving = poll(
            7,
            &four,
            vec![
                shard(&[1, 2, 3], &[4], &[1, 2, 4], 1_000),
                shard(&[2, 3, 1], &[], &[2, 3, 1], 3_000),
            ],
        );
        assert!(!tracker.observe(at(0.2), moving.clone()));
        assert!(!tracker.observe(at(0.4), moving));
        let settled = poll(
            7,
            &four,
            vec![
                shard(&[1, 2, 4], &[], &[1, 2, 4], 1_200),
                shard(&[2, 3, 1], &[], &[2, 3, 1], 3_100),
            ],
        );
        assert!(tracker.observe(at(1.4), settled));
        let figures = tracker.figures();
        assert_eq!(figures.shards_moved, 1);
        assert_eq!(figures.shard_move_seconds, [1.2]);
        assert!((figures.replicas_copied_share - 1.0 / 6.0).abs() < 1e-9);
        assert_eq!(figures.bytes_copied, 1_200);
        assert!((figures.bytes_copied_share - 1_200.0 / (3.0 * 4_300.0)).abs() < 1e-9);
        assert!((figures.ideal_share - 0.25).abs() < 1e-9);
    }

    #[test]
    fn a_change_not_yet_in_the_members_is_not_settled_though_every_shard_is() {
        let before = poll(5, &[1, 2, 3], vec![shard(&[1, 2, 3], &[], &[1, 2, 3], 0)]);
        let mut tracker = ChangeTracker::new(at(0.0), before.clone());
        assert!(!tracker.observe(at(0.2), before));
        let mut leaving = poll(6, &[1, 3], vec![shard(&[1, 2, 3], &[], &[1, 2, 3], 0)]);
        leaving.leaving = 1;
        assert!(!tracker.observe(at(0.4), leaving));
    }

    #[test]
    fn a_move_finished_between_two_polls_counts_from_the_poll_before() {
        let mut tracker = ChangeTracker::new(
            at(0.0),
            poll(
                5,
                &[1, 2, 3, 4],
                vec![shard(&[1, 2, 3], &[], &[1, 2, 3], 10)],
            ),
        );
        assert!(tracker.observe(
            at(0.2),
            poll(8, &[1, 2, 4], vec![shard(&[1, 2, 4], &[], &[1, 2, 4], 10)])
        ));
        let figures = tracker.figures();
        assert_eq!(figures.shards_moved, 1);
        assert_eq!(figures.shard_move_seconds, [0.2]);
        assert!((figures.ideal_share - 0.25).abs() < 1e-9);
    }
}
