//! Producer policies as the node uses them: checked and converted from the
//! wire, and mapped onto the scheduler. The policies themselves are
//! replicated state ([`floret_store::policy`]); the `produce_rate` token
//! buckets are the produce path's (`produce/rate.rs`).

use floret_proto::v1;
use floret_sched::ProducerPolicy;
use floret_store::policy::{Expiry, Overflow, Policy};

use crate::auth::{TENANT_SEPARATOR, TenantName};
use crate::request::{self, InvalidRequest};

/// Whose policy a request names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyOwner {
    /// The queue's defaults, stored in every shard.
    Queue,
    /// One producer's override, stored in its shard.
    Producer(String),
    /// A tenant's policy in the queue (its weight among the queue's
    /// tenants and its limits over all its producers), stored in every
    /// shard as the override of the producer id
    /// `tenant/`, which no producer has (a tenant's producers are
    /// `tenant/name` with a name of at least one character).
    Tenant(String),
}

impl PolicyOwner {
    /// The owner a request's `producer_id` and `tenant` name; both at once
    /// is INVALID_ARGUMENT, as is a producer id that is a tenant's key.
    pub fn of(producer_id: &str, tenant: &str) -> Result<Self, InvalidRequest> {
        match (producer_id.is_empty(), tenant.is_empty()) {
            (true, true) => Ok(Self::Queue),
            (false, true) if tenant_of_policy_key(producer_id).is_some() => {
                Err(InvalidRequest::Malformed(
                    "a producer id `tenant/` names that tenant's policy: set it with `tenant`",
                ))
            }
            (false, true) => Ok(Self::Producer(request::producer_id(producer_id)?)),
            (true, false) => TenantName::parse(tenant)
                .map(|tenant| Self::Tenant(tenant.to_owned()))
                .map_err(|_| {
                    InvalidRequest::Malformed(
                        "a tenant name is ASCII letters, digits, `_` and `-`, at most 64 bytes",
                    )
                }),
            (false, false) => Err(InvalidRequest::Malformed(
                "a policy is a producer's or a tenant's, not both: leave producer_id or tenant empty",
            )),
        }
    }

    /// The producer id the policy is stored under; None for the queue's defaults.
    pub fn stored_as(&self) -> Option<String> {
        match self {
            Self::Queue => None,
            Self::Producer(producer) => Some(producer.clone()),
            Self::Tenant(tenant) => Some(tenant_policy_key(tenant)),
        }
    }
}

/// The producer id `tenant`'s policy is stored under (`tenant/`).
pub fn tenant_policy_key(tenant: &str) -> String {
    format!("{tenant}{TENANT_SEPARATOR}")
}

/// The tenant whose policy is stored under producer id `producer`, if it
/// is such a key (`tenant/`).
pub fn tenant_of_policy_key(producer: &str) -> Option<&str> {
    let tenant = producer.strip_suffix(TENANT_SEPARATOR)?;
    (!tenant.is_empty() && !tenant.contains(TENANT_SEPARATOR)).then_some(tenant)
}

/// A tenant's policy sets its weight and its limits over all its producers
/// (`max_messages`, `max_bytes`, `produce_rate`); what a limit does when
/// passed is always to refuse, so `overflow` may only be `reject`.
pub fn check_tenant_policy(policy: &Policy) -> Result<(), InvalidRequest> {
    let tenant_settings = Policy {
        weight: policy.weight,
        max_messages: policy.max_messages,
        max_bytes: policy.max_bytes,
        produce_rate: policy.produce_rate,
        overflow: policy
            .overflow
            .filter(|overflow| *overflow == Overflow::Reject),
        ..Policy::default()
    };
    if *policy != tenant_settings {
        return Err(InvalidRequest::Malformed(
            "a tenant's policy sets only weight, max_messages, max_bytes and produce_rate (over the limits a produce is refused: overflow reject); the other settings are its producers'",
        ));
    }
    Ok(())
}

/// A policy from the wire, refusing settings that cannot work (a zero
/// weight, a zero TTL...) with INVALID_ARGUMENT.
pub fn from_wire(policy: Option<v1::Policy>) -> Result<Policy, InvalidRequest> {
    let Some(policy) = policy else {
        return Ok(Policy::default());
    };
    let overflow = match v1::Overflow::try_from(policy.overflow) {
        Ok(v1::Overflow::Unset) => None,
        Ok(v1::Overflow::Reject) => Some(Overflow::Reject),
        Ok(v1::Overflow::DropOldest) => Some(Overflow::DropOldest),
        Ok(v1::Overflow::DeadLetterOldest) => Some(Overflow::DeadLetterOldest),
        Err(_) => {
            return Err(InvalidRequest::UnknownPolicyAction {
                setting: "overflow",
                value: policy.overflow,
            });
        }
    };
    let expiry = match v1::Expiry::try_from(policy.expiry) {
        Ok(v1::Expiry::Unset) => None,
        Ok(v1::Expiry::DeadLetter) => Some(Expiry::DeadLetter),
        Ok(v1::Expiry::Drop) => Some(Expiry::Drop),
        Err(_) => {
            return Err(InvalidRequest::UnknownPolicyAction {
                setting: "expiry",
                value: policy.expiry,
            });
        }
    };
    Ok(Policy {
        weight: at_least_one("weight", policy.weight)?,
        priority: policy.priority,
        max_messages: at_least_one("max_messages", policy.max_messages)?,
        max_bytes: at_least_one("max_bytes", policy.max_bytes)?,
        overflow,
        ttl_ms: at_least_one("ttl_ms", policy.ttl_ms)?,
        expiry,
        max_attempts: at_least_one("max_attempts", policy.max_attempts)?,
        max_in_flight: at_least_one("max_in_flight", policy.max_in_flight)?,
        produce_rate: at_least_one("produce_rate", policy.produce_rate)?,
    })
}

/// A setting that must be at least 1 when it is set.
fn at_least_one<T: PartialEq + From<u8>>(
    setting: &'static str,
    value: Option<T>,
) -> Result<Option<T>, InvalidRequest> {
    if value.as_ref() == Some(&T::from(0)) {
        return Err(InvalidRequest::PolicySettingZero { setting });
    }
    Ok(value)
}

/// A policy on the wire.
pub fn to_wire(policy: Policy) -> v1::Policy {
    v1::Policy {
        weight: policy.weight,
        priority: policy.priority,
        max_messages: policy.max_messages,
        max_bytes: policy.max_bytes,
        overflow: match policy.overflow {
            None => v1::Overflow::Unset,
            Some(Overflow::Reject) => v1::Overflow::Reject,
            Some(Overflow::DropOldest) => v1::Overflow::DropOldest,
            Some(Overflow::DeadLetterOldest) => v1::Overflow::DeadLetterOldest,
        } as i32,
        ttl_ms: policy.ttl_ms,
        expiry: match policy.expiry {
            None => v1::Expiry::Unset,
            Some(Expiry::DeadLetter) => v1::Expiry::DeadLetter,
            Some(Expiry::Drop) => v1::Expiry::Drop,
        } as i32,
        max_attempts: policy.max_attempts,
        max_in_flight: policy.max_in_flight,
        produce_rate: policy.produce_rate,
    }
}

/// Every setting in force, floret's defaults filled in where nothing is
/// set (limits stay unset: no limit).
pub fn with_defaults(policy: Policy) -> Policy {
    Policy {
        weight: Some(policy.weight.unwrap_or(1)),
        priority: Some(policy.priority.unwrap_or(0)),
        overflow: Some(policy.overflow.unwrap_or_default()),
        expiry: Some(policy.expiry.unwrap_or_default()),
        ..policy
    }
}

/// What the scheduler needs of a policy.
pub fn scheduling(policy: Policy) -> ProducerPolicy {
    ProducerPolicy {
        weight: policy.weight.unwrap_or(1),
        priority: policy.priority.unwrap_or(0),
        max_in_flight: policy.max_in_flight,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_weight_is_refused_with_a_reason() {
        let refused = from_wire(Some(v1::Policy {
            weight: Some(0),
            ..v1::Policy::default()
        }))
        .unwrap_err();
        assert_eq!(
            refused,
            InvalidRequest::PolicySettingZero { setting: "weight" }
        );
        assert!(refused.to_string().contains("weight"), "{refused}");
    }

    #[test]
    fn policy_round_trips_through_the_wire() {
        let policy = Policy {
            weight: Some(3),
            priority: Some(0),
            max_messages: Some(10),
            overflow: Some(Overflow::DeadLetterOldest),
            expiry: Some(Expiry::Drop),
            ttl_ms: Some(5),
            ..Policy::default()
        };
        assert_eq!(from_wire(Some(to_wire(policy))).unwrap(), policy);
    }
}
