//! Producer -> shard placement by consistent hashing (`hashring`).
//!
//! Every node builds the same ring from the same shard count, so any node
//! routes any producer without asking anyone. Ring points are virtual
//! shards (`shard#replica`), and every key is hashed as plain bytes through
//! hashring's SipHash, which does not change between Rust releases (unlike
//! `std`'s `Hash` of a struct).
//!
//! IMPLEMENTATION CAVEATS
//! - The shard count is fixed for the life of a data dir; no shard split yet.
//! - Replica sets over node ids come with the cluster (one node for now).

use std::hash::{Hash, Hasher};

use floret_store::ShardId;
use hashring::HashRing;

/// Ring points per shard: enough that 16 shards get near-equal key shares.
pub const VIRTUAL_POINTS_PER_SHARD: u16 = 64;

/// Bytes hashed as they are, with no length prefix or terminator.
struct StableBytes<'a>(&'a [u8]);

impl Hash for StableBytes<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.0);
    }
}

/// One point of a shard on the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct VirtualShard {
    shard: ShardId,
    point: u16,
}

impl Hash for VirtualShard {
    fn hash<H: Hasher>(&self, state: &mut H) {
        StableBytes(format!("shard-{}#{}", self.shard, self.point).as_bytes()).hash(state);
    }
}

/// Maps `(queue, producer)` to the shard that holds the producer's queue.
pub struct ShardPlacement {
    ring: HashRing<VirtualShard>,
    shard_count: u32,
}

impl ShardPlacement {
    /// A ring over shards `0..shard_count` (`shard_count` > 0).
    pub fn new(shard_count: u32) -> Self {
        assert!(shard_count > 0, "a cluster needs at least one shard");
        let mut ring = HashRing::new();
        ring.batch_add(
            (0..shard_count)
                .flat_map(|shard| {
                    (0..VIRTUAL_POINTS_PER_SHARD).map(move |point| VirtualShard { shard, point })
                })
                .collect(),
        );
        Self { ring, shard_count }
    }

    /// Number of shards.
    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }

    /// The shard of a producer of a queue.
    pub fn shard_of(&self, queue: &str, producer: &str) -> ShardId {
        let mut key = Vec::with_capacity(queue.len() + 1 + producer.len());
        key.extend_from_slice(queue.as_bytes());
        key.push(0);
        key.extend_from_slice(producer.as_bytes());
        self.ring
            .get(&StableBytes(&key))
            .expect("the ring holds every shard")
            .shard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_is_the_same_on_every_node() {
        let a = ShardPlacement::new(16);
        let b = ShardPlacement::new(16);
        for i in 0..1000 {
            let producer = format!("tenant-{i}");
            assert_eq!(
                a.shard_of("default", &producer),
                b.shard_of("default", &producer)
            );
        }
    }

    #[test]
    fn producers_spread_over_all_shards() {
        let placement = ShardPlacement::new(16);
        let mut counts = [0u32; 16];
        for i in 0..16_000 {
            counts[placement.shard_of("default", &format!("tenant-{i}")) as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*min > 500 && *max < 1500, "uneven spread: {counts:?}");
    }

    #[test]
    fn known_producer_keeps_its_shard_across_builds() {
        let placement = ShardPlacement::new(16);
        let pinned: Vec<_> = ["a", "b", "tenant-1", "tenant-2"]
            .iter()
            .map(|p| placement.shard_of("default", p))
            .collect();
        assert_eq!(pinned, PINNED_SHARDS);
    }

    /// Shards computed once; a change here means data dirs would be read with a different placement.
    const PINNED_SHARDS: [u32; 4] = [4, 12, 9, 9];
}
