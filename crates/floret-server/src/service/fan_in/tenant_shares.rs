//! The cluster level of tenant fairness, pure: from the backlog each
//! source reports, what each source weighs in the split of a consumer's
//! credits, and each tenant's share of its weight on each source.
//!
//! A tenant's backlog may be spread over several nodes. Each tenant should
//! get its weight's part of the consumer once, over all of them, and each
//! of its producers the same part of that. So a tenant counts on a source
//! for the part of its backlogged producer weight that is there: source
//! `n` weighs the sum over its tenants of `weight(t) x here(t, n) /
//! everywhere(t)`, and inside that source tenant `t` gets that same
//! `here / everywhere` of its weight (its share). A node without token
//! keys reports no tenants: one anonymous tenant, so sources weigh what
//! their backlogged producers weigh, as before tenants.

use std::collections::HashMap;

use floret_sched::WHOLE_SHARE;

use crate::deliver::{BacklogReport, TenantShare};

/// What a tenant of weight 1 with all its backlog on one source adds to
/// that source's weight.
pub(super) const TENANT_WEIGHT_UNIT: u64 = 1_000;

/// One backlogged tenant as a report gives it: name, producer weight there,
/// tenant weight.
type TenantHere<'a> = (&'a str, u64, u32);

/// The tenants of one report; a report without tenants is one anonymous
/// tenant holding its whole producer weight.
fn tenants_of(report: &BacklogReport) -> Vec<TenantHere<'_>> {
    if report.tenants.is_empty() {
        return if report.weight > 0 {
            vec![("", report.weight, 1)]
        } else {
            Vec::new()
        };
    }
    report
        .tenants
        .iter()
        .filter(|tenant| tenant.producer_weight > 0)
        .map(|tenant| {
            (
                tenant.tenant.as_str(),
                tenant.producer_weight,
                tenant.weight.max(1),
            )
        })
        .collect()
}

/// What the merge does with every source's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SourceShares {
    /// Per source, its weight in the credit split; None for a source that
    /// has not reported.
    pub weights: Vec<Option<u64>>,
    /// Per source, the tenants there with less than a whole share, in name
    /// order, scaled so the tenant with the most of its backlog there has a
    /// whole share (only the ratios between a node's tenants matter there).
    pub shares: Vec<Vec<TenantShare>>,
}

/// Each source's weight and its tenants' shares, from the sources' last
/// reports (None: not reported yet).
pub(super) fn source_shares(reports: &[Option<&BacklogReport>]) -> SourceShares {
    let tenants: Vec<Option<Vec<TenantHere<'_>>>> = reports
        .iter()
        .map(|report| report.map(tenants_of))
        .collect();
    let mut everywhere: HashMap<&str, u64> = HashMap::new();
    for (name, producer_weight, _) in tenants.iter().flatten().flatten() {
        let total = everywhere.entry(name).or_default();
        *total = total.saturating_add(*producer_weight);
    }
    let part_here = |name: &str, here: u64| here as f64 / everywhere[name].max(1) as f64;
    let weights = tenants
        .iter()
        .map(|source| {
            source.as_ref().map(|source| {
                let weight: f64 = source
                    .iter()
                    .map(|&(name, here, weight)| f64::from(weight) * part_here(name, here))
                    .sum();
                (weight * TENANT_WEIGHT_UNIT as f64).round() as u64
            })
        })
        .collect();
    let shares = tenants
        .iter()
        .map(|source| {
            let Some(source) = source else {
                return Vec::new();
            };
            let parts: Vec<(&str, f64)> = source
                .iter()
                .map(|&(name, here, _)| (name, part_here(name, here)))
                .collect();
            let most = parts.iter().map(|&(_, part)| part).fold(0.0, f64::max);
            parts
                .into_iter()
                .map(|(name, part)| TenantShare {
                    tenant: name.to_owned(),
                    share: (part / most * f64::from(WHOLE_SHARE)).round() as u32,
                })
                .filter(|share| share.share < WHOLE_SHARE)
                .collect()
        })
        .collect();
    SourceShares { weights, shares }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deliver::TenantBacklog;

    fn report(tenants: &[(&str, u64, u32)]) -> BacklogReport {
        BacklogReport {
            weight: tenants.iter().map(|(_, here, _)| here).sum(),
            tenants: tenants
                .iter()
                .map(|&(tenant, producer_weight, weight)| TenantBacklog {
                    tenant: tenant.to_owned(),
                    producer_weight,
                    weight,
                })
                .collect(),
        }
    }

    fn share(tenant: &str, share: u32) -> TenantShare {
        TenantShare {
            tenant: tenant.to_owned(),
            share,
        }
    }

    #[test]
    fn a_tenant_spread_over_three_nodes_counts_once_not_three_times() {
        // acme: 100 producers, about a third on each node; initech: one
        // producer, on node 1.
        let one = report(&[("acme", 34, 1), ("initech", 1, 1)]);
        let two = report(&[("acme", 33, 1)]);
        let three = report(&[("acme", 33, 1)]);
        let shares = source_shares(&[Some(&one), Some(&two), Some(&three)]);
        assert_eq!(shares.weights, [Some(1_340), Some(330), Some(330)]);
        // On node 1, acme gets 34% of what initech gets.
        assert_eq!(shares.shares[0], [share("acme", 340_000)]);
        // Node 1 serves initech 1000 / 1340 of its credits: 50% of the
        // consumer; acme gets the other 50% over the three nodes.
        assert!(shares.shares[1].is_empty() && shares.shares[2].is_empty());
    }

    #[test]
    fn tenant_weights_weigh_on_every_node_a_tenant_is_on() {
        let one = report(&[("a", 1, 3), ("b", 1, 1)]);
        let two = report(&[("a", 1, 3)]);
        let shares = source_shares(&[Some(&one), Some(&two)]);
        assert_eq!(shares.weights, [Some(2_500), Some(1_500)]);
        assert_eq!(shares.shares[0], [share("a", 500_000)]);
    }

    #[test]
    fn nodes_without_tenants_weigh_their_producers_as_before() {
        let anonymous = |weight| BacklogReport {
            weight,
            tenants: Vec::new(),
        };
        let (six, four, idle) = (anonymous(6), anonymous(4), anonymous(0));
        let shares = source_shares(&[Some(&six), Some(&four), Some(&idle), None]);
        assert_eq!(shares.weights, [Some(600), Some(400), Some(0), None]);
        assert!(shares.shares.iter().all(Vec::is_empty));
    }
}
