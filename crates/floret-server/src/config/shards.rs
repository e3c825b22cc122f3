//! How many shards a new cluster gets when its configuration names none.
//! A data dir keeps the count it was created with (the node reads it back
//! at start); a joining node takes the cluster's.

/// The fewest shards a cluster whose configuration names none gets: two
/// per node of a three-node cluster, so that each node leads two and a
/// failed node's two go one to each survivor. Against 16, on three nodes
/// on one 2-core machine (BENCHMARKS.md): single-message produce
/// 1.2-1.45x, batched 1.05x, a quiet producer's latency under a flood
/// unchanged.
pub const DEFAULT_SHARDS: u32 = 6;

/// Shards per founding member of a cluster whose configuration names none.
pub const DEFAULT_SHARDS_PER_NODE: u32 = 2;

/// The shard count of a new cluster of `founding_members` whose
/// configuration names none: [`DEFAULT_SHARDS_PER_NODE`] per member, at
/// least [`DEFAULT_SHARDS`], so a larger cluster starts with more shards
/// (a cluster meant to grow sets `shards` for its largest size:
/// `docs/design.md`, "Membership").
pub fn default_shards(founding_members: usize) -> u32 {
    (founding_members as u32)
        .saturating_mul(DEFAULT_SHARDS_PER_NODE)
        .max(DEFAULT_SHARDS)
}
