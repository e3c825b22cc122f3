//! Settling deliveries end to end: the dispatcher drops (ack) or returns
//! (nack) the lease, then acked messages are removed through raft, one
//! `Remove` per shard (the proposer folds concurrent acks into shared
//! entries). An ack is answered OK only once its removal is committed, so
//! an acked message is never delivered again; if the removal cannot commit,
//! the ack is answered UNAVAILABLE and the message may come back.

use std::collections::BTreeMap;

use floret_store::{Op, ShardId};
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
        for (index, outcome) in outcomes.iter_mut().enumerate() {
            if let Some(removal) = outcome.removal.take() {
                let shard: DeliveryId = outcome
                    .delivery_id
                    .parse()
                    .expect("the dispatcher only removes parsed ids");
                let (messages, indexes) = removals.entry(shard.shard).or_default();
                messages.push(removal);
                indexes.push(index);
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
        for (indexes, result) in committed {
            if let Err(error) = result {
                for index in indexes {
                    outcomes[index].code = Code::Unavailable;
                    outcomes[index].message = format!(
                        "the ack was not made durable ({error}); the message may be delivered again"
                    );
                }
            }
        }
        Ok(outcomes)
    }
}
