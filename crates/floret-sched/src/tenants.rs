//! The tenants of one scheduler: each tenant that holds a producer slot has
//! an index (what the tiers' rings and turn states use), its weight, and a
//! count of its slots; an index is freed and reused once its last slot is
//! gone. Weight overrides are kept even for tenants without slots.

use std::collections::HashMap;
use std::hash::Hash;

use crate::config::DEFAULT_WEIGHT;

/// One tenant holding slots.
#[derive(Debug, Clone)]
struct TenantState<T> {
    /// `None` while the index is free.
    key: Option<T>,
    /// Messages per turn of the tenant among the tenants of a tier.
    weight: u32,
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
}

impl<T> Default for Tenants<T> {
    fn default() -> Self {
        Self {
            states: Vec::new(),
            free: Vec::new(),
            by_key: HashMap::new(),
            weights: HashMap::new(),
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
        let state = TenantState {
            key: Some(tenant.clone()),
            weight,
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
