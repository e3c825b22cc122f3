//! The Admin calls on policies and dead letters.
//!
//! A queue's defaults are committed in every shard (each enforces them on its
//! own producers), a producer's override in its shard only; policies are read
//! from a replica this node holds, or from the node that leads the shard.
//! Dead letters live in their producer's shard: listing gathers them from
//! every shard's leader, replay and delete commit in the shards their ids
//! name (`<shard>:<id>`).
//!
//! IMPLEMENTATION CAVEATS
//! - A queue-wide change that some shards could not commit is reported as
//!   UNAVAILABLE; the shards that did commit keep it (setting it again is harmless).
//! - Reading a policy from a follower replica may lag a change by a heartbeat.
//! - Listing fails (UNAVAILABLE) when a node this one believes leads a shard
//!   does not answer; a dead node that leads nothing any more is skipped.

use std::collections::BTreeMap;

use floret_proto::v1;
use floret_store::records::{DeadLetterRecord, StoredMessage, decode};
use floret_store::{DeadLetterSelection, Op, OpReply, SetPolicy, ShardId};
use tonic::{Response, Status};

use super::AdminService;
use crate::error::RequestError;
use crate::policy::{self, PolicyOwner};
use crate::request;
use crate::request::InvalidRequest;
use crate::service::now_unix_ms;

/// Dead letters listed when a request does not say how many.
const DEFAULT_DEAD_LETTER_LIMIT: usize = 100;
/// Most dead letters one list returns.
const MAX_DEAD_LETTER_LIMIT: usize = 10_000;

impl AdminService {
    pub(super) async fn set_policy_in_shards(
        &self,
        request: v1::SetPolicyRequest,
    ) -> Result<Response<v1::SetPolicyResponse>, Status> {
        let queue = request::queue_name(&request.queue)?;
        let owner = PolicyOwner::of(&request.producer_id, &request.tenant)?;
        let policy = policy::from_wire(request.policy)?;
        if matches!(owner, PolicyOwner::Tenant(_)) {
            if !self.tenants {
                return Err(Status::failed_precondition(
                    "tenant policies need token keys: without them every producer belongs to one anonymous tenant, so a tenant's weight would change nothing",
                ));
            }
            policy::check_tenant_policy(&policy)?;
        }
        let placement = self.shards.placement();
        let shards: Vec<ShardId> = match &owner {
            PolicyOwner::Producer(producer) => vec![placement.shard_of(&queue, producer)],
            PolicyOwner::Queue | PolicyOwner::Tenant(_) => (0..placement.shard_count()).collect(),
        };
        let change = SetPolicy {
            queue,
            producer: owner.stored_as(),
            policy,
            replace: request.replace,
        };
        let results = futures::future::join_all(shards.iter().map(|&shard| {
            let op = Op::SetPolicy(change.clone());
            async move { (shard, self.router.commit(shard, op).await) }
        }))
        .await;
        let mut stored = None;
        let mut failed = Vec::new();
        for (shard, result) in results {
            match result {
                Ok(OpReply::PolicySet { policy }) => stored = Some(policy),
                Ok(other) => failed.push(format!("shard {shard} answered {other:?}")),
                Err(error) => failed.push(format!("shard {shard}: {error}")),
            }
        }
        if let Some(first) = failed.first() {
            return Err(Status::from(RequestError::unavailable(format!(
                "the policy was committed in {} of {} shards (first failure: {first}); set it again, which is harmless",
                shards.len() - failed.len(),
                shards.len()
            ))));
        }
        Ok(Response::new(v1::SetPolicyResponse {
            stored: stored.map(policy::to_wire),
        }))
    }

    pub(super) async fn get_policy_from_a_replica(
        &self,
        request: v1::GetPolicyRequest,
    ) -> Result<Response<v1::GetPolicyResponse>, Status> {
        let queue = request::queue_name(&request.queue)?;
        let owner = PolicyOwner::of(&request.producer_id, &request.tenant)?;
        let shard = self.policy_shard(&queue, &owner);
        if self.shards.group(shard).is_none() {
            return self
                .get_policy_from(self.shards.route(shard), request)
                .await;
        }
        self.policy_from_own_replica(&queue, &owner, shard)
            .map(Response::new)
    }

    /// The shard a policy is read from: the producer's, or for a queue's
    /// defaults or a tenant's policy (committed in every shard) the first
    /// shard this node holds.
    pub(super) fn policy_shard(&self, queue: &str, owner: &PolicyOwner) -> ShardId {
        match owner {
            PolicyOwner::Producer(producer) => self.shards.placement().shard_of(queue, producer),
            PolicyOwner::Queue | PolicyOwner::Tenant(_) => {
                self.shards.groups().next().map_or(0, |group| group.id)
            }
        }
    }

    /// `queue`'s policy (and its producer's or tenant's, if `owner` names
    /// one) as this node's replica of `shard` holds it.
    pub(super) fn policy_from_own_replica(
        &self,
        queue: &str,
        owner: &PolicyOwner,
        shard: ShardId,
    ) -> Result<v1::GetPolicyResponse, Status> {
        let Some(group) = self.shards.group(shard) else {
            return Err(Status::from(RequestError::unavailable(format!(
                "node {} holds no replica of shard {shard}",
                self.shards.node_id()
            ))));
        };
        let defaults = group.reader.stored_policy(queue, None);
        let (own, effective, tenant) = match owner {
            PolicyOwner::Producer(producer) => (
                group.reader.stored_policy(queue, Some(producer)),
                group.reader.policy(queue, producer),
                None,
            ),
            PolicyOwner::Tenant(_) => (
                Default::default(),
                defaults,
                Some(
                    group
                        .reader
                        .stored_policy(queue, owner.stored_as().as_deref()),
                ),
            ),
            PolicyOwner::Queue => (Default::default(), defaults, None),
        };
        Ok(v1::GetPolicyResponse {
            queue_defaults: Some(policy::to_wire(defaults)),
            producer_override: Some(policy::to_wire(own)),
            effective: Some(policy::to_wire(policy::with_defaults(effective))),
            tenant_policy: tenant.map(policy::to_wire),
        })
    }

    async fn get_policy_from(
        &self,
        node: floret_store::NodeId,
        request: v1::GetPolicyRequest,
    ) -> Result<Response<v1::GetPolicyResponse>, Status> {
        let Some(mut client) = self.shards.peers().peer_client(node) else {
            return Err(Status::from(RequestError::unavailable(format!(
                "node {node} holds the policy and is not a member"
            ))));
        };
        client.replica_policy(request).await
    }

    pub(super) async fn list_dead_letters_everywhere(
        &self,
        request: v1::ListDeadLettersRequest,
    ) -> Result<Response<v1::ListDeadLettersResponse>, Status> {
        let (queue, limit) = dead_letter_listing(&request)?;
        let mut found = self.led_dead_letters(&queue, limit)?;
        let answers = self
            .ask_peers(|mut client| {
                let queue = queue.clone();
                async move {
                    client
                        .led_dead_letters(v1::ListDeadLettersRequest {
                            queue,
                            limit: limit as u32,
                        })
                        .await
                }
            })
            .await;
        let shard_count = self.shards.placement().shard_count();
        for (node, answer) in answers {
            match answer {
                Ok(answer) => found.extend(answer.dead_letters),
                Err(why) => {
                    let led: Vec<ShardId> = (0..shard_count)
                        .filter(|&shard| self.shards.route(shard) == node)
                        .collect();
                    if !led.is_empty() {
                        return Err(Status::from(RequestError::unavailable(format!(
                            "node {node}, which leads shards {led:?}, did not answer ({why}); their dead letters would be missing, retry"
                        ))));
                    }
                }
            }
        }
        found.sort_by(|a, b| {
            (a.dead_lettered_at_unix_ms, &a.id).cmp(&(b.dead_lettered_at_unix_ms, &b.id))
        });
        found.truncate(limit);
        Ok(Response::new(v1::ListDeadLettersResponse {
            dead_letters: found,
        }))
    }

    /// Up to `limit` dead letters of `queue` from the shards this node leads,
    /// oldest first.
    pub(super) fn led_dead_letters(
        &self,
        queue: &str,
        limit: usize,
    ) -> Result<Vec<v1::DeadLetter>, Status> {
        let mut found = Vec::new();
        for group in self.shards.groups() {
            if !self.shards.leads(group.id) {
                continue;
            }
            let records = group
                .reader
                .dead_letters(queue, 0, limit)
                .map_err(|error| {
                    Status::from(RequestError::Internal(format!(
                        "cannot read shard {}: {error}",
                        group.id
                    )))
                })?;
            for (id, record) in records {
                found.push(dead_letter(group.id, id, record)?);
            }
        }
        found.sort_by(|a, b| {
            (a.dead_lettered_at_unix_ms, &a.id).cmp(&(b.dead_lettered_at_unix_ms, &b.id))
        });
        found.truncate(limit);
        Ok(found)
    }

    /// Replays (`replay`) or deletes dead letters, shard by shard.
    pub(super) async fn change_dead_letters(
        &self,
        request: v1::DeadLetterIds,
        replay: bool,
    ) -> Result<Response<v1::DeadLettersChanged>, Status> {
        let queue = request::queue_name(&request.queue)?;
        if request.ids.is_empty() {
            return Err(Status::from(InvalidRequest::Malformed(
                "no dead-letter ids given",
            )));
        }
        let shard_count = self.shards.placement().shard_count();
        let mut by_shard: BTreeMap<ShardId, Vec<u64>> = BTreeMap::new();
        for text in &request.ids {
            let (shard, id) = parse_dead_letter_id(text)
                .filter(|(shard, _)| *shard < shard_count)
                .ok_or_else(|| Status::from(InvalidRequest::DeadLetterId { text: text.clone() }))?;
            by_shard.entry(shard).or_default().push(id);
        }
        let at_ms = now_unix_ms();
        let results = futures::future::join_all(by_shard.into_iter().map(|(shard, ids)| {
            let selection = DeadLetterSelection {
                queue: queue.clone(),
                ids,
                at_ms,
            };
            let op = if replay {
                Op::ReplayDeadLetters(selection)
            } else {
                Op::DeleteDeadLetters(selection)
            };
            self.router.commit(shard, op)
        }))
        .await;
        let mut count = 0;
        for result in results {
            match result? {
                OpReply::Replayed { count: changed } | OpReply::Removed { count: changed } => {
                    count += changed;
                }
                other => {
                    return Err(Status::from(RequestError::Internal(format!(
                        "a dead-letter change was answered with {other:?}"
                    ))));
                }
            }
        }
        Ok(Response::new(v1::DeadLettersChanged { count }))
    }
}

/// The queue and the number of dead letters a listing asks for.
pub(super) fn dead_letter_listing(
    request: &v1::ListDeadLettersRequest,
) -> Result<(String, usize), Status> {
    let queue = request::queue_name(&request.queue)?;
    let limit = match request.limit as usize {
        0 => DEFAULT_DEAD_LETTER_LIMIT,
        limit => limit.min(MAX_DEAD_LETTER_LIMIT),
    };
    Ok((queue, limit))
}

/// `<shard>:<id>` as [`dead_letter`] writes it.
fn parse_dead_letter_id(text: &str) -> Option<(ShardId, u64)> {
    let (shard, id) = text.split_once(':')?;
    Some((shard.parse().ok()?, id.parse().ok()?))
}

fn dead_letter(
    shard: ShardId,
    id: u64,
    record: DeadLetterRecord,
) -> Result<v1::DeadLetter, Status> {
    let message: StoredMessage = decode("dead-lettered message", &record.message)
        .map_err(|error| Status::from(RequestError::Internal(format!("shard {shard}: {error}"))))?;
    Ok(v1::DeadLetter {
        id: format!("{shard}:{id}"),
        producer_id: record.producer,
        sequence: record.sequence,
        reason: record.reason.as_str().to_owned(),
        attempts: record.attempts,
        dead_lettered_at_unix_ms: record.dead_lettered_at_ms,
        enqueued_at_unix_ms: message.enqueued_at_ms,
        payload: message.payload,
        headers: message.headers.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_letter_id_parses_as_written_and_nothing_else() {
        assert_eq!(parse_dead_letter_id("3:17"), Some((3, 17)));
        assert_eq!(parse_dead_letter_id("3-17"), None);
        assert_eq!(parse_dead_letter_id(":1"), None);
    }
}
