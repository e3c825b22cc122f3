//! Tells the dispatcher whenever this node gains or loses a shard's
//! leadership, following the shard's group when a fresh one replaces it.
//!
//! A gain counts once the new leader has applied an entry of its own term
//! ([`dispatching_term`]): raft commits that term's first entry only
//! after everything committed before it, so from then on every ack
//! committed under an earlier leader is applied, and the dispatcher's
//! rebuild does not deliver an acked message again. It is read off the
//! group's metrics and costs no round trip. The watcher used to ask
//! openraft to confirm the leadership instead (`ensure_linearizable`): that
//! needs a majority to answer a heartbeat within one heartbeat interval,
//! which a loaded cluster missed again and again, and the shard went
//! undelivered for seconds after every election while each retry sent
//! more heartbeats into it. A leader that lost its term and won a later
//! one between two looks is reported as a loss and a gain: another leader
//! may have delivered and acked in between.

use floret_cluster::Shards;
use floret_store::NodeId;
use openraft::{BasicNode, RaftMetrics};
use tokio::task::JoinHandle;

use crate::deliver::DispatcherHandle;

/// Tells the dispatcher whenever this node gains or loses the leadership of
/// `shard`, a gain only once [`dispatching_term`] says so.
pub fn watch_leadership(
    shards: &Shards,
    shard: u32,
    dispatcher: DispatcherHandle,
) -> JoinHandle<()> {
    let node_id = shards.node_id();
    let mut groups = shards
        .group_changes(shard)
        .expect("leadership is watched for the cluster's shards");
    tokio::spawn(async move {
        let mut leading_term = None;
        loop {
            let raft = groups.borrow_and_update().raft.clone();
            let mut metrics = raft.metrics();
            loop {
                let now = dispatching_term(&metrics.borrow_and_update(), node_id);
                if now != leading_term {
                    if leading_term.is_some() {
                        dispatcher.leadership(shard, false);
                    }
                    if now.is_some() {
                        dispatcher.leadership(shard, true);
                    }
                    leading_term = now;
                }
                if metrics.changed().await.is_err() {
                    break;
                }
            }
            // The group stopped: the node stops, or a retired replica's
            // group is being replaced by a fresh one.
            if leading_term.take().is_some() {
                dispatcher.leadership(shard, false);
            }
            if groups.changed().await.is_err() {
                break;
            }
        }
    })
}

/// The term in which `me` leads the group and dispatches it: once it has
/// applied an entry of that term, and with it everything committed before
/// the term began. None while it follows, or leads without that entry
/// applied yet.
pub fn dispatching_term(metrics: &RaftMetrics<NodeId, BasicNode>, me: NodeId) -> Option<u64> {
    let term = metrics.current_term;
    let applied_in_term = metrics
        .last_applied
        .is_some_and(|applied| applied.leader_id.get_term() == term);
    (metrics.current_leader == Some(me) && applied_in_term).then_some(term)
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, LogId};

    use super::*;

    fn metrics(
        leader: Option<NodeId>,
        term: u64,
        applied: Option<(u64, u64)>,
    ) -> RaftMetrics<NodeId, BasicNode> {
        let mut metrics = RaftMetrics::new_initial(1);
        metrics.current_leader = leader;
        metrics.current_term = term;
        metrics.last_applied =
            applied.map(|(term, index)| LogId::new(CommittedLeaderId::new(term, 1), index));
        metrics
    }

    #[test]
    fn a_new_leader_waits_until_the_acks_of_the_term_before_are_applied() {
        let elected = metrics(Some(1), 5, Some((4, 900)));
        assert_eq!(
            dispatching_term(&elected, 1),
            None,
            "term 4's acks may be unapplied"
        );
        let first_entry_applied = metrics(Some(1), 5, Some((5, 1_000)));
        assert_eq!(dispatching_term(&first_entry_applied, 1), Some(5));
    }

    #[test]
    fn a_follower_or_a_replica_without_a_leader_never_dispatches() {
        for follower in [
            metrics(Some(2), 5, Some((5, 1_000))),
            metrics(None, 5, Some((5, 1_000))),
            metrics(Some(1), 5, None),
        ] {
            assert_eq!(dispatching_term(&follower, 1), None);
        }
    }

    #[test]
    fn a_leader_deposed_in_a_later_term_stops_dispatching() {
        let deposed = metrics(Some(3), 6, Some((5, 1_000)));
        assert_eq!(dispatching_term(&deposed, 1), None);
        let elected_again = metrics(Some(1), 7, Some((5, 1_000)));
        assert_eq!(
            dispatching_term(&elected_again, 1),
            None,
            "term 6 may have acked"
        );
        let caught_up = metrics(Some(1), 7, Some((7, 1_200)));
        assert_eq!(
            dispatching_term(&caught_up, 1),
            Some(7),
            "a term of its own again: the watcher reports a loss and a gain"
        );
    }
}
