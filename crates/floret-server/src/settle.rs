//! Settling deliveries end to end, wherever the consumer is connected.
//!
//! A delivery's lease lives in the dispatcher of the node that leads its
//! shard (the delivery id names the shard). Ids of shards this node leads
//! are settled here; the others are sent to their leader's `Peer.Settle`,
//! which settles them the same way there, and the outcomes are put back in
//! the caller's order.
//!
//! Settling on the leader: the dispatcher returns the lease of a nack at
//! once, and checks the lease of an ack (or of a nack to the dead letters);
//! acked messages are then removed (dead-lettered ones moved aside)
//! through raft, one `Remove` per shard (the proposer folds concurrent acks
//! into shared entries), and only once that commits does the lease end and
//! the ack get OK, so an acked message is never delivered again. If the
//! removal cannot commit, the ack is answered UNAVAILABLE and the lease is
//! left to lapse, so the message comes back.
//!
//! IMPLEMENTATION CAVEATS
//! - The leader is this node's view of the shard's raft group; right after a
//!   leadership change an ack may reach the old leader and get
//!   FAILED_PRECONDITION (the lease is gone there; the message is delivered again).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use floret_cluster::Shards;
use floret_proto::peer::v1::PeerSettleRequest;
use floret_store::{DeadLetterReason, Discard, Discarded, MessageRef, NodeId, Op, ShardId};
use tokio::sync::OwnedSemaphorePermit;

use crate::deliver::{
    DispatcherHandle, DispatcherStopped, SettleCode, SettleKind, SettleOutcome, SettledBy,
};
use crate::delivery_id::{DeliveryId, DeliveryTicket};
use crate::produce::proposer::Proposers;
use crate::router::ShardRouter;
use crate::service::convert;

/// Acks and nacks for the services.
#[derive(Clone)]
pub struct Settler {
    dispatcher: DispatcherHandle,
    proposers: Proposers,
    shards: Arc<Shards>,
    router: ShardRouter,
}

impl Settler {
    /// Settles through `dispatcher` (leases of the shards this node leads),
    /// removing acked messages with `proposers`, and through the other
    /// nodes' `Peer` service for the shards they lead.
    pub fn new(
        dispatcher: DispatcherHandle,
        proposers: Proposers,
        shards: Arc<Shards>,
        router: ShardRouter,
    ) -> Self {
        Self {
            dispatcher,
            proposers,
            shards,
            router,
        }
    }

    /// One outcome per id, in order, settled on behalf of `by`; malformed
    /// ids are INVALID_ARGUMENT, deliveries `by` was not given
    /// PERMISSION_DENIED (audited here, where the caller is).
    pub async fn settle(
        &self,
        kind: SettleKind,
        ids: Vec<String>,
        by: &SettledBy,
    ) -> Result<Vec<SettleOutcome>, DispatcherStopped> {
        self.settle_holding(kind, ids, by, None).await
    }

    /// Like [`Settler::settle`], holding `places` (a stream's places in its
    /// bound on ids being settled, one per id) until the ids are answered:
    /// the ids of each node release theirs as soon as that node answers, so
    /// acks waiting on an unreachable leader hold only their own places.
    pub async fn settle_holding(
        &self,
        kind: SettleKind,
        ids: Vec<String>,
        by: &SettledBy,
        places: Option<OwnedSemaphorePermit>,
    ) -> Result<Vec<SettleOutcome>, DispatcherStopped> {
        let node_id = self.shards.node_id();
        let mut by_node: BTreeMap<NodeId, (Vec<String>, Vec<usize>)> = BTreeMap::new();
        let total = ids.len();
        let shard_count = self.shards.placement().shard_count();
        for (index, text) in ids.into_iter().enumerate() {
            let node = match text.parse::<DeliveryTicket>() {
                Ok(ticket)
                    if ticket.id.shard < shard_count && !self.shards.leads(ticket.id.shard) =>
                {
                    self.shards.route(ticket.id.shard)
                }
                _ => node_id,
            };
            let (texts, indexes) = by_node.entry(node).or_default();
            texts.push(text);
            indexes.push(index);
        }
        let mut outcomes: Vec<Option<SettleOutcome>> = vec![None; total];
        let places = share_places(places, by_node.values().map(|(texts, _)| texts.len()));
        let settled = futures::future::join_all(by_node.into_iter().zip(places).map(
            |((node, (texts, indexes)), places)| async move {
                let result = if node == node_id {
                    self.settle_here(kind, texts, by).await
                } else {
                    Ok(self.settle_on(node, kind, texts, by).await)
                };
                drop(places);
                (indexes, result)
            },
        ))
        .await;
        for (indexes, result) in settled {
            for (index, outcome) in indexes.into_iter().zip(result?) {
                outcomes[index] = Some(outcome);
            }
        }
        let outcomes: Vec<SettleOutcome> = outcomes
            .into_iter()
            .map(|outcome| outcome.expect("every id got an outcome"))
            .collect();
        audit_refusals(&outcomes, by);
        Ok(outcomes)
    }

    /// Settles ids of shards this node leads (the leases are here) on
    /// behalf of `by`; dead letters are recorded as nacked by a consumer.
    pub async fn settle_here(
        &self,
        kind: SettleKind,
        ids: Vec<String>,
        by: &SettledBy,
    ) -> Result<Vec<SettleOutcome>, DispatcherStopped> {
        self.settle_here_for(kind, ids, by, DeadLetterReason::Rejected)
            .await
    }

    /// Like [`Settler::settle_here`], dead letters recorded with `reason`.
    pub async fn settle_here_for(
        &self,
        kind: SettleKind,
        ids: Vec<String>,
        by: &SettledBy,
        reason: DeadLetterReason,
    ) -> Result<Vec<SettleOutcome>, DispatcherStopped> {
        let parsed = ids
            .into_iter()
            .map(|id| id.parse::<DeliveryTicket>().map_err(|_| id))
            .collect();
        let received = Instant::now();
        let mut outcomes = self.dispatcher.settle(kind, parsed, by.clone()).await?;
        if kind == SettleKind::Nack {
            count_nacks(&outcomes);
        }
        let mut removals: BTreeMap<ShardId, (Vec<_>, Vec<usize>)> = BTreeMap::new();
        let mut acked: Vec<Option<DeliveryId>> = vec![None; outcomes.len()];
        for (index, outcome) in outcomes.iter_mut().enumerate() {
            if let Some(id) = outcome.removal.take() {
                let (messages, indexes) = removals.entry(id.shard).or_default();
                messages.push(MessageRef {
                    queue: id.queue.clone(),
                    producer: id.producer.clone(),
                    sequence: id.sequence,
                });
                indexes.push(index);
                acked[index] = Some(id);
            }
        }
        let settled_ids = &acked;
        let committed = futures::future::join_all(removals.into_iter().map(
            |(shard, (messages, indexes))| async move {
                let op = match kind {
                    SettleKind::DeadLetter => Op::Discard(Discard {
                        at_ms: crate::service::now_unix_ms(),
                        messages: messages
                            .into_iter()
                            .zip(&indexes)
                            .map(|(message, &index)| Discarded {
                                message,
                                reason,
                                attempts: settled_ids[index].as_ref().map_or(0, |id| id.attempt),
                                dead_letter: true,
                            })
                            .collect(),
                    }),
                    _ => Op::Remove(messages),
                };
                let result = match self.proposers.get(shard) {
                    Some(proposer) => proposer.propose(op).await.map(|_| ()),
                    None => Err(crate::produce::proposer::ProposeError::NotLeader {
                        shard,
                        leader: None,
                    }),
                };
                (indexes, result)
            },
        ))
        .await;
        let mut removed = Vec::new();
        for (indexes, result) in committed {
            match result {
                Ok(()) => {
                    if kind == SettleKind::Ack {
                        metrics::histogram!("floret_ack_seconds")
                            .record(received.elapsed().as_secs_f64());
                    }
                    removed.extend(indexes.into_iter().filter_map(|i| acked[i].take()));
                }
                Err(error) => {
                    for index in indexes {
                        outcomes[index].code = SettleCode::Unavailable;
                        outcomes[index].message = format!(
                            "the settle was not made durable ({error}); the message will be delivered again"
                        );
                    }
                }
            }
        }
        if kind == SettleKind::DeadLetter {
            for id in &removed {
                crate::telemetry::count_for_queue(
                    "floret_dead_lettered_messages_total",
                    &id.queue,
                    1,
                );
            }
        }
        if !removed.is_empty() {
            self.dispatcher
                .removal_committed(removed, kind == SettleKind::Ack);
        }
        Ok(outcomes)
    }

    /// Settles ids on `node`, the leader of their shard; a node that cannot
    /// be reached answers UNAVAILABLE for each (the lease then lapses there
    /// or died with it, and the message is delivered again).
    async fn settle_on(
        &self,
        node: NodeId,
        kind: SettleKind,
        ids: Vec<String>,
        by: &SettledBy,
    ) -> Vec<SettleOutcome> {
        let request = PeerSettleRequest {
            ack: kind == SettleKind::Ack,
            delivery_ids: ids.clone(),
            dead_letter: kind == SettleKind::DeadLetter,
            settled_by: Some(convert::settled_by_to_wire(by)),
        };
        let answer = self.router.settle_on(node, request).await;
        match answer {
            Ok(answer) if answer.outcomes.len() == ids.len() => answer
                .outcomes
                .into_iter()
                .map(|outcome| SettleOutcome {
                    delivery_id: outcome.delivery_id,
                    code: convert::settle_code_from_wire(outcome.code),
                    message: outcome.message,
                    removal: None,
                })
                .collect(),
            Ok(_) => unreachable_outcomes(ids, node, "answered with the wrong number of outcomes"),
            Err(error) => unreachable_outcomes(ids, node, error.why()),
        }
    }
}

/// Splits `places` into one share per group of ids, of the group's size,
/// in order, while places last (a stream's bound caps the places one
/// settle holds, so a settle of more ids than that has fewer places than
/// ids). Places beyond the ids are released at once.
fn share_places(
    mut places: Option<OwnedSemaphorePermit>,
    group_sizes: impl Iterator<Item = usize>,
) -> Vec<Option<OwnedSemaphorePermit>> {
    group_sizes
        .map(|size| {
            places
                .as_mut()
                .and_then(|places| places.split(size.min(places.num_permits())))
        })
        .collect()
}

/// Counts the nacks the dispatcher took, per queue.
fn count_nacks(outcomes: &[SettleOutcome]) {
    for outcome in outcomes.iter().filter(|o| o.code == SettleCode::Ok) {
        if let Ok(ticket) = outcome.delivery_id.parse::<DeliveryTicket>() {
            crate::telemetry::count_for_queue("floret_nacked_messages_total", &ticket.id.queue, 1);
        }
    }
}

/// Logs and counts the deliveries `by` tried to settle without having been
/// given them.
fn audit_refusals(outcomes: &[SettleOutcome], by: &SettledBy) {
    let refused = outcomes
        .iter()
        .filter(|outcome| outcome.code == SettleCode::PermissionDenied)
        .count();
    if refused == 0 {
        return;
    }
    let (tenant, on) = match by {
        SettledBy::Stream(owner) => (&owner.tenant, "its consume stream"),
        SettledBy::Tenant(tenant) => (tenant, "Ack"),
    };
    tracing::warn!(target: "audit", tenant = %tenant, refused, through = on, "settle refused: deliveries made to another stream or tenant");
    crate::auth::count_refusal("delivery");
}

fn unreachable_outcomes(ids: Vec<String>, node: NodeId, why: &str) -> Vec<SettleOutcome> {
    ids.into_iter()
        .map(|delivery_id| SettleOutcome {
            delivery_id,
            code: SettleCode::Unavailable,
            message: format!(
                "the shard's leader (node {node}) could not settle it: {why}; an unacked message is delivered again"
            ),
            removal: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::Semaphore;

    use super::*;

    fn sizes(shares: &[Option<OwnedSemaphorePermit>]) -> Vec<usize> {
        shares
            .iter()
            .map(|share| share.as_ref().map_or(0, OwnedSemaphorePermit::num_permits))
            .collect()
    }

    #[test]
    fn ack_waiting_on_an_unreachable_leader_held_the_places_of_ids_already_answered() {
        let bound = Arc::new(Semaphore::new(10));
        let places = bound.clone().try_acquire_many_owned(6).unwrap();
        let mut shares = share_places(Some(places), [3, 3].into_iter());
        assert_eq!(sizes(&shares), [3, 3]);
        shares.remove(0);
        assert_eq!(
            bound.available_permits(),
            7,
            "the ids this node answered still held their places"
        );
    }

    #[test]
    fn places_are_shared_in_order_while_they_last_and_the_rest_released() {
        let bound = Arc::new(Semaphore::new(20));
        let capped = bound.clone().try_acquire_many_owned(5).unwrap();
        assert_eq!(
            sizes(&share_places(Some(capped), [3, 4, 2].into_iter())),
            [3, 2, 0]
        );
        let more_than_ids = bound.clone().try_acquire_many_owned(10).unwrap();
        let shares = share_places(Some(more_than_ids), [3, 2].into_iter());
        assert_eq!(sizes(&shares), [3, 2]);
        assert_eq!(bound.available_permits(), 15);
        assert_eq!(sizes(&share_places(None, [1, 2].into_iter())), [0, 0]);
    }
}
