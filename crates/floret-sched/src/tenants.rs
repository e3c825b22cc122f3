//! The tenants of one scheduler: each tenant that holds a producer slot has
//! an index (what the tiers' rings and turn states use), its weight, its
//! share on this node, and a count of its slots; an index is freed and
//! reused once its last slot is gone. Weight overrides and shares are kept
//! even for tenants without slots.
//!
//! A tenant's share is the part of its weight it gets among this node's
//! tenants: a tenant whose backlog is spread over several nodes gets its
//! weight in turns on all of them together, so on each node it gets the
//! part of its weight its backlog there is of its whole backlog (the
//! cluster level computes it). Its quantum per turn is weight x share, in
//! millionths of a message ([`WHOLE_MESSAGE`]); a quantum under one message
//! is saved up over turns.

use std::collections::HashMap;
use std::hash::Hash;

use crate::config::DEFAULT_WEIGHT;

/// A share of a whole weight, in parts per million.
pub const WHOLE_SHARE: u32 = 1_000_000;

/// One message, in the units of a tenant's quantum and credit.
pub(crate) const WHOLE_MESSAGE: u64 = WHOLE_SHARE as u64;

/// The smallest share a tenant gets: a tenant with less of its backlog on a
/// node is still served there as if it had this much, so a turn of the
/// ring grants every tenant at least a 64th of a message.
pub const MIN_SHARE: u32 = WHOLE_SHARE / 64;

/// One tenant holding slots.
#[derive(Debug, Clone)]
struct TenantState<T> {
    /// `None` while the index is free.
    key: Option<T>,
    /// Messages per turn of the tenant among the tenants of a tier.
    weight: u32,
    /// Its share of that weight on this node, in parts per million.
    share: u32,
    /// Producer slots of the tenant.
    slots: usize,
}

/// Tenants by index, reused through a free list.
#[derive(Debug, Clone)]
pub(crate) struct Tenants<T> {
    states: Vec<TenantState<T>>,
    free: Vec<usize>,
    by_key: HashMap<T, usize>,
    /// Weight overrides; tenants without one weigh [`DEFAULT_WEIGHT`].
    weights: HashMap<T, u32>,
    /// Shares under [`WHOLE_SHARE`]; tenants without one have a whole share.
    shares: HashMap<T, u32>,
}

impl<T> Default for Tenants<T> {
    fn default() -> Self {
        Self {
            states: Vec::new(),
            free: Vec::new(),
            by_key: HashMap::new(),
            weights: HashMap::new(),
            shares: HashMap::new(),
        }
    }
}

impl<T: Clone + Eq + Hash> Tenants<T> {
    /// The index of `tenant`, counting one more slot of it.
    pub(crate) fn acquire(&mut self, tenant: T) -> usize {
        if let Some(&index) = self.by_key.get(&tenant) {
            self.states[index].slots += 1;
            return index;
        }
        let weight = self.weights.get(&tenant).copied().unwrap_or(DEFAULT_WEIGHT);
        let share = self.shares.get(&tenant).copied().unwrap_or(WHOLE_SHARE);
        let state = TenantState {
            key: Some(tenant.clone()),
            weight,
            share,
            slots: 1,
        };
        let index = match self.free.pop() {
            Some(index) => {
                self.states[index] = state;
                index
            }
            None => {
                self.states.push(state);
                self.states.len() - 1
            }
        };
        self.by_key.insert(tenant, index);
        index
    }

    /// One slot of tenant `index` is gone; the index is freed with its last.
    pub(crate) fn release(&mut self, index: usize) {
        let state = &mut self.states[index];
        state.slots -= 1;
        if state.slots == 0
            && let Some(key) = state.key.take()
        {
            self.by_key.remove(&key);
            self.free.push(index);
        }
    }

    /// The weight of tenant `index`.
    pub(crate) fn weight(&self, index: usize) -> u32 {
        self.states[index].weight
    }

    /// What tenant `index` gets per turn: its weight times its share, in
    /// millionths of a message.
    pub(crate) fn quantum(&self, index: usize) -> u64 {
        let state = &self.states[index];
        u64::from(state.weight) * u64::from(state.share)
    }

    /// The key of tenant `index`, which holds slots.
    pub(crate) fn key(&self, index: usize) -> &T {
        self.states[index]
            .key
            .as_ref()
            .expect("a tenant in a ring holds slots")
    }

    /// Replaces every tenant's share: the listed tenants get theirs
    /// (clamped to [`MIN_SHARE`]..=[`WHOLE_SHARE`]), every other tenant a
    /// whole share.
    pub(crate) fn set_shares(&mut self, shares: impl IntoIterator<Item = (T, u32)>) {
        let old = std::mem::take(&mut self.shares);
        for (tenant, share) in shares {
            let share = share.clamp(MIN_SHARE, WHOLE_SHARE);
            if share < WHOLE_SHARE {
                self.shares.insert(tenant, share);
            }
        }
        for tenant in old.keys().chain(self.shares.keys()) {
            if let Some(&index) = self.by_key.get(tenant) {
                self.states[index].share = self.shares.get(tenant).copied().unwrap_or(WHOLE_SHARE);
            }
        }
    }

    /// Sets (or with `None` clears) `tenant`'s weight override. Returns the
    /// tenant's index with its old and new weight when it holds slots.
    pub(crate) fn set_weight(
        &mut self,
        tenant: &T,
        weight: Option<u32>,
    ) -> Option<(usize, u32, u32)> {
        let weight = match weight {
            Some(weight) => {
                let weight = weight.max(1);
                self.weights.insert(tenant.clone(), weight);
                weight
            }
            None => {
                self.weights.remove(tenant);
                DEFAULT_WEIGHT
            }
        };
        let index = *self.by_key.get(tenant)?;
        let old = std::mem::replace(&mut self.states[index].weight, weight);
        Some((index, old, weight))
    }

    /// Whether any weight override is set.
    pub(crate) fn has_overrides(&self) -> bool {
        !self.weights.is_empty()
    }
}
