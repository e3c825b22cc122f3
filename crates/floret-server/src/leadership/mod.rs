//! Leadership of shards as the node follows and steers it:
//!
//! - `watch.rs`: tells the dispatcher when this node gains (confirmed) or
//!   loses a shard's leadership.
//! - `hand_back.rs`: a leader asked by a shard's preferred replica to step
//!   aside decides whether to, and does (pauses the proposer, stops
//!   dispatching, turns heartbeats off until the replica has taken over).
//! - `rebalance.rs`: a node asks the leaders of the shards it is the
//!   preferred replica of to hand them back.
//! - `drain.rs`: a node about to stop hands every shard it leads to a
//!   caught-up replica (the same stepping aside, pushed instead of asked).
//! - `moves.rs`: the leader of a shard whose replicas the current members
//!   place elsewhere moves it there, step by step.
//! - `leavers.rs`: the membership group's leader lets a removed member go
//!   once no shard holds a replica on it, and it has retired them.
//! - `retire.rs`: a node deletes the state of its replicas a move took
//!   away, once their leader has committed a configuration without it.
//!
//! Raft itself (elections, terms, votes) is openraft's, in floret-cluster;
//! the vote guard of a node that may have forgotten a vote is there too.

pub mod drain;
pub mod hand_back;
pub mod leavers;
pub mod moves;
pub mod rebalance;
pub mod retire;
pub mod watch;
