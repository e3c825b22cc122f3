//! Settling deliveries end to end: the dispatcher returns the lease of a
//! nack at once, and checks the lease of an ack; acked messages are then
//! removed through raft, one `Remove` per shard (the proposer folds
//! concurrent acks into shared entries), and only once that commits does the
//! lease end and the ack get OK, so an acked message is never delivered
//! again. If the removal cannot commit, the ack is answered UNAVAILABLE and
//! the lease is left to lapse, so the message comes back.

use std::collections::BTreeMap;

use floret_store::{MessageRef, Op, ShardId};
use tonic::Code;

use crate::delivery_id::DeliveryId;
use crate::dispatcher::{DispatcherHandle, DispatcherStopped, SettleKind, SettleOutcome};
use crate::proposer::ShardProposer;

/// Acks and nacks for the services.
#[derive(Clone)]
pub struct Settler {
    dispatcher: DispatcherHandle,
    proposers: Vec<ShardProposer>,
}

impl Settler {
    /// Settles through `dispatcher`, removing acked messages with `proposers` (indexed by shard).
    pub fn new(dispatcher: DispatcherHandle, proposers: Vec<ShardProposer>) -> Self {
        Self {
            dispatcher,
            proposers,
        }
    }

    /// One outcome per id, in order; malformed ids are INVALID_ARGUMENT.
    pub async fn settle(
        &self,
        kind: SettleKind,
        ids: Vec<String>,
    ) -> Result<Vec<SettleOutcome>, DispatcherStopped> {
        let parsed = ids
            .into_iter()
            .map(|id| id.parse::<DeliveryId>().map_err(|_| id))
            .collect();
        let mut outcomes = self.dispatcher.settle(kind, parsed).await?;
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
        let committed = futures::future::join_all(removals.into_iter().map(
            |(shard, (messages, indexes))| async move {
                (
                    indexes,
                    self.proposers[shard as usize]
                        .propose(Op::Remove(messages))
                        .await,
                )
            },
        ))
        .await;
        let mut durable = Vec::new();
        for (indexes, result) in committed {
            match result {
                Ok(_) => durable.extend(indexes.into_iter().filter_map(|i| acked[i].take())),
                Err(error) => {
                    for index in indexes {
                        outcomes[index].code = Code::Unavailable;
                        outcomes[index].message = format!(
                            "the ack was not made durable ({error}); the message will be delivered again"
                        );
                    }
                }
            }
        }
        if !durable.is_empty() {
            self.dispatcher.ack_committed(durable);
        }
        Ok(outcomes)
    }
}
