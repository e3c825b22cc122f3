//! Calling an election at once when this node is the one that can win it.
//!
//! When a leader dies, the survivor whose log lacks the leader's last
//! entry may time out first. The other refuses its vote (its log is
//! ahead) and must win itself, but openraft 0.9 delays a node's election
//! by twice the election timeout once it has seen a longer log than its
//! own, and that flag stays set until its next election: a node that lost
//! one election earlier waited 1.4-1.6 s instead of 0.6-0.8 s. One kill in
//! four or five failed over in 1.2-2.6 s.
//!
//! So a voter that refuses a candidate because its own log is ahead, and
//! has heard nothing from a leader for a leader lease, calls its own
//! election at once. Its first attempt may come at the candidate's term
//! (which the candidate, having voted for itself, refuses); it tries again
//! at the next term, [`ATTEMPTS`] times at most, and stops as soon as the
//! shard has a leader. While a leader is heard from, nothing changes.
//!
//! "Heard from a leader" is any append received for the shard, or a vote
//! granted (a leader is being elected): a node that just stepped down, or
//! just voted, does not call elections over the new leader.
//!
//! IMPLEMENTATION CAVEATS
//! - A deposed leader's appends count as a leader heard from.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floret_store::{NodeId, ShardId};
use openraft::ServerState;
use openraft::raft::{VoteRequest, VoteResponse};

use super::Shards;

/// Elections a voter calls when it takes over.
const ATTEMPTS: u32 = 3;
/// Wait between them for a leader to emerge.
const ATTEMPT_WAIT: Duration = Duration::from_millis(100);

/// Whether `response` refused `request` because the voter's log is ahead:
/// the candidate cannot win while that voter is needed.
fn refused_by_a_longer_log(request: &VoteRequest<NodeId>, response: &VoteResponse<NodeId>) -> bool {
    !response.vote_granted && response.last_log_id > request.last_log_id
}

/// When each shard last received an append, as milliseconds since the
/// node opened its shards (0: never).
pub(super) struct LeaderContact {
    opened: Instant,
    last_append_ms: AtomicU64,
    /// Whether this node is calling elections for the shard already.
    taking_over: AtomicBool,
}

impl LeaderContact {
    pub(super) fn new(opened: Instant) -> Self {
        Self {
            opened,
            last_append_ms: AtomicU64::new(0),
            taking_over: AtomicBool::new(false),
        }
    }

    fn record(&self) {
        let now = self.opened.elapsed().as_millis() as u64;
        self.last_append_ms.store(now.max(1), Ordering::Relaxed);
    }

    /// How long since the last append; None before any.
    fn silence(&self) -> Option<Duration> {
        match self.last_append_ms.load(Ordering::Relaxed) {
            0 => None,
            last => Some(
                self.opened
                    .elapsed()
                    .saturating_sub(Duration::from_millis(last)),
            ),
        }
    }
}

impl Shards {
    /// An append for `shard` arrived from its leader.
    pub fn heard_from_leader(&self, shard: ShardId) {
        if let Some(contact) = self.leader_contact.get(&shard) {
            contact.record();
        }
    }

    /// This node answered `request` for votes in `shard` with `response`:
    /// if it refused because its own log is ahead and no leader has been
    /// heard from for a lease, it calls its own election.
    pub fn after_vote(
        &self,
        shard: ShardId,
        request: &VoteRequest<NodeId>,
        response: &VoteResponse<NodeId>,
    ) {
        let (Some(contact), Some(group)) = (self.leader_contact.get(&shard), self.any_group(shard))
        else {
            return;
        };
        if response.vote_granted {
            contact.record();
            return;
        }
        if !refused_by_a_longer_log(request, response) {
            return;
        }
        let lease = self.tuning.election_timeout_max;
        let silent = contact.silence().is_none_or(|silence| silence > lease);
        let leading = group.raft.metrics().borrow().state == ServerState::Leader;
        if !silent || leading || self.refuses_vote(shard) {
            return;
        }
        if contact
            .taking_over
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let contact = Arc::clone(contact);
        let raft = group.raft.clone();
        let refused_at_term = raft.metrics().borrow().vote.leader_id.term;
        tracing::debug!(
            shard,
            "a candidate's log is behind ours and no leader is heard: calling an election"
        );
        tokio::spawn(async move {
            for _ in 0..ATTEMPTS {
                let decided = {
                    let metrics = raft.metrics();
                    let metrics = metrics.borrow();
                    metrics.vote.committed && metrics.vote.leader_id.term > refused_at_term
                };
                if decided || raft.trigger().elect().await.is_err() {
                    break;
                }
                tokio::time::sleep(ATTEMPT_WAIT).await;
            }
            contact.taking_over.store(false, Ordering::Release);
        });
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, LogId, Vote};

    use super::*;

    fn log_id(term: u64, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    fn request(last_log_id: Option<LogId<NodeId>>) -> VoteRequest<NodeId> {
        VoteRequest::new(Vote::new(5, 2), last_log_id)
    }

    fn answer(granted: bool, last_log_id: Option<LogId<NodeId>>) -> VoteResponse<NodeId> {
        VoteResponse::new(Vote::new(5, 3), last_log_id, granted)
    }

    #[test]
    fn candidate_missing_the_voters_last_entry_is_refused_by_a_longer_log() {
        assert!(refused_by_a_longer_log(
            &request(log_id(4, 10)),
            &answer(false, log_id(4, 11))
        ));
        assert!(refused_by_a_longer_log(
            &request(log_id(3, 12)),
            &answer(false, log_id(4, 11))
        ));
    }

    #[test]
    fn refusals_for_other_reasons_and_grants_are_not() {
        let refused_same_log = answer(false, log_id(4, 10));
        assert!(!refused_by_a_longer_log(
            &request(log_id(4, 10)),
            &refused_same_log
        ));
        let guarded_voter = answer(false, None);
        assert!(!refused_by_a_longer_log(
            &request(log_id(4, 10)),
            &guarded_voter
        ));
        let granted = answer(true, log_id(4, 11));
        assert!(!refused_by_a_longer_log(&request(log_id(4, 10)), &granted));
    }

    #[test]
    fn silence_counts_from_the_last_append() {
        let opened = Instant::now() - Duration::from_secs(5);
        let contact = LeaderContact::new(opened);
        assert_eq!(contact.silence(), None, "never heard");
        contact.record();
        let silence = contact.silence().unwrap();
        assert!(silence < Duration::from_secs(1), "{silence:?}");
    }
}
