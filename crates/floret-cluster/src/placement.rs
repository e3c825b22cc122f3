//! Placement by consistent hashing (`hashring`), twice: producer -> shard
//! ([`ShardPlacement`]) and shard -> replica set ([`ReplicaPlacement`]).
//!
//! Every node builds the same rings from the same shard count and member
//! list, so any node routes any request without asking anyone. Ring points
//! are virtual (`shard#point`, `node#point`), and every key is hashed as
//! plain bytes through hashring's SipHash, which does not change between
//! Rust releases (unlike `std`'s `Hash` of a struct).
//!
//! A shard's replicas are the first R distinct nodes on the node ring after
//! the shard's hash. Which of them is the preferred leader is then chosen so
//! that every node prefers an equal share of shards (hashing alone gave
//! 7/5/4 of 16 over three nodes): leadership, and with it dispatch work,
//! spreads evenly.
//!
//! The node ring's points belong to seats, and each member sits in one
//! ([`ReplicaPlacement::seated`]). A member's seat is its own id, unless it
//! replaced a member: then it takes the seat, and with it the ring points,
//! of the member it replaced, so exactly that member's replicas move to it.
//!
//! IMPLEMENTATION CAVEATS
//! - The shard count is fixed for the life of a data dir; no shard split yet.
//! - The members and their seats come from the membership group
//!   (`shards/members.rs`); this module only computes from them.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use floret_store::{NodeId, ShardId};
use hashring::HashRing;

/// Ring points per shard: enough that a few to a few dozen shards get near-equal key shares.
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

/// Ring points per node.
const VIRTUAL_POINTS_PER_NODE: u16 = 64;

/// One point of a seat on the replica ring. A seat is named by the id of
/// the member that first took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct VirtualNode {
    seat: NodeId,
    point: u16,
}

impl Hash for VirtualNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        StableBytes(format!("node-{}#{}", self.seat, self.point).as_bytes()).hash(state);
    }
}

/// Maps each shard to the nodes that hold it, preferred leader first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaPlacement {
    members: Vec<NodeId>,
    replicas: Vec<Vec<NodeId>>,
    description: String,
}

impl ReplicaPlacement {
    /// Replica sets of `shard_count` shards over `nodes` (not empty), each of
    /// `replication_factor` nodes, or every node when there are fewer; each
    /// node in its own seat.
    pub fn new(shard_count: u32, nodes: &[NodeId], replication_factor: usize) -> Self {
        let seats: BTreeMap<NodeId, NodeId> = nodes.iter().map(|&node| (node, node)).collect();
        Self::seated(shard_count, &seats, replication_factor)
    }

    /// Replica sets over members in seats: `seats` maps each seat to the
    /// member in it (not empty, one seat per member). A shard is placed on
    /// the seats as [`ReplicaPlacement::new`] places it on nodes, then each
    /// seat is read as its member.
    pub fn seated(
        shard_count: u32,
        seats: &BTreeMap<NodeId, NodeId>,
        replication_factor: usize,
    ) -> Self {
        assert!(!seats.is_empty(), "a cluster needs at least one node");
        let mut members: Vec<NodeId> = seats.values().copied().collect();
        members.sort_unstable();
        members.dedup();
        assert_eq!(members.len(), seats.len(), "a member sits in one seat");
        let size = replication_factor.clamp(1, seats.len());
        let mut ring = HashRing::new();
        ring.batch_add(
            seats
                .keys()
                .flat_map(|&seat| {
                    (0..VIRTUAL_POINTS_PER_NODE).map(move |point| VirtualNode { seat, point })
                })
                .collect(),
        );
        let mut preferred_count: BTreeMap<NodeId, u32> =
            members.iter().map(|&node| (node, 0)).collect();
        let replicas = (0..shard_count)
            .map(|shard| {
                let key = format!("shard-{shard}");
                let walk = ring
                    .get_with_replicas(&StableBytes(key.as_bytes()), ring.len() - 1)
                    .expect("the ring holds every seat");
                let mut set: Vec<NodeId> = Vec::with_capacity(size);
                for point in walk {
                    let member = seats[&point.seat];
                    if !set.contains(&member) {
                        set.push(member);
                        if set.len() == size {
                            break;
                        }
                    }
                }
                let leader_rank = (0..set.len())
                    .min_by_key(|&rank| (preferred_count[&set[rank]], rank))
                    .expect("a replica set is never empty");
                set[..=leader_rank].rotate_right(1);
                *preferred_count.get_mut(&set[0]).expect("a member") += 1;
                set
            })
            .collect();
        let replaced: Vec<(NodeId, NodeId)> = seats
            .iter()
            .filter(|(seat, member)| seat != member)
            .map(|(&seat, &member)| (seat, member))
            .collect();
        let seating = if replaced.is_empty() {
            String::new()
        } else {
            format!(" in seats (seat, member) {replaced:?}")
        };
        let description = format!(
            "members {members:?}{seating} with replication factor {}",
            replication_factor.max(1)
        );
        Self {
            members,
            replicas,
            description,
        }
    }

    /// The members it places shards on, in id order.
    pub fn members(&self) -> &[NodeId] {
        &self.members
    }

    /// What the placement follows from (member ids, replication factor):
    /// equal descriptions give equal replica sets.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// How many shards it places.
    pub fn shard_count(&self) -> u32 {
        self.replicas.len() as u32
    }

    /// The nodes holding `shard`, preferred leader first.
    pub fn replicas(&self, shard: ShardId) -> &[NodeId] {
        &self.replicas[shard as usize]
    }

    /// The replica that should lead `shard` while it is healthy.
    pub fn preferred_leader(&self, shard: ShardId) -> NodeId {
        self.replicas[shard as usize][0]
    }

    /// Whether `node` holds a replica of `shard`.
    pub fn holds(&self, node: NodeId, shard: ShardId) -> bool {
        self.replicas(shard).contains(&node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_nodes_each_hold_every_shard_and_prefer_an_equal_share() {
        let placement = ReplicaPlacement::new(16, &[1, 2, 3], 3);
        let mut preferred = [0; 4];
        for shard in 0..16 {
            let mut set = placement.replicas(shard).to_vec();
            preferred[placement.preferred_leader(shard) as usize] += 1;
            set.sort_unstable();
            assert_eq!(set, [1, 2, 3]);
        }
        assert!(
            preferred[1..].iter().all(|&n| n == 5 || n == 6),
            "{preferred:?}"
        );
    }

    #[test]
    fn replica_sets_have_distinct_nodes_and_are_the_same_on_every_node() {
        let a = ReplicaPlacement::new(32, &[5, 1, 9, 3, 7], 3);
        let b = ReplicaPlacement::new(32, &[1, 3, 5, 7, 9], 3);
        assert_eq!(a, b);
        for shard in 0..32 {
            let mut set = a.replicas(shard).to_vec();
            set.sort_unstable();
            set.dedup();
            assert_eq!(set.len(), 3);
        }
    }

    #[test]
    fn a_single_node_holds_everything() {
        let placement = ReplicaPlacement::new(4, &[7], 3);
        assert!((0..4).all(|shard| placement.replicas(shard) == [7]));
    }

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

    #[test]
    fn a_member_in_anothers_seat_holds_what_that_member_held_and_is_named_in_the_description() {
        let own: BTreeMap<NodeId, NodeId> = [(1, 1), (2, 2), (3, 3)].into();
        let replaced: BTreeMap<NodeId, NodeId> = [(1, 1), (2, 7), (3, 3)].into();
        let before = ReplicaPlacement::seated(16, &own, 3);
        let after = ReplicaPlacement::seated(16, &replaced, 3);
        assert_eq!(before, ReplicaPlacement::new(16, &[1, 2, 3], 3));
        for shard in 0..16 {
            let renamed: Vec<NodeId> = before
                .replicas(shard)
                .iter()
                .map(|&node| if node == 2 { 7 } else { node })
                .collect();
            assert_eq!(after.replicas(shard), renamed);
        }
        assert_eq!(
            before.description(),
            "members [1, 2, 3] with replication factor 3"
        );
        assert_eq!(
            after.description(),
            "members [1, 3, 7] in seats (seat, member) [(2, 7)] with replication factor 3"
        );
    }

    #[test]
    fn known_shards_keep_their_replicas_across_builds() {
        let placement = ReplicaPlacement::new(6, &[1, 2, 3, 4, 5], 3);
        let pinned: Vec<&[NodeId]> = (0..6).map(|shard| placement.replicas(shard)).collect();
        assert_eq!(pinned, PINNED_REPLICAS);
    }

    /// Replica sets computed once (5 nodes, 6 shards, R=3); a change here
    /// means data dirs would be read with a different placement.
    const PINNED_REPLICAS: [&[NodeId]; 6] = [
        &[4, 2, 1],
        &[5, 4, 2],
        &[2, 3, 1],
        &[3, 5, 2],
        &[1, 4, 2],
        &[3, 1, 5],
    ];

    /// Shards computed once; a change here means data dirs would be read with a different placement.
    const PINNED_SHARDS: [u32; 4] = [4, 12, 9, 9];
}
