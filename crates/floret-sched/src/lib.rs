//! Fair scheduling for one queue: which producer's message goes out next, and
//! which delivered messages are still leased to a consumer.
//!
//! floret-sched owns the in-node level of fairness described in docs/design.md
//! ("Fairness, two levels"): deficit round robin across the tenants that
//! have deliverable messages, each getting its tenant weight times its
//! share on this node in messages per turn (a share under a whole is saved
//! up over turns), and inside a tenant across its producers, each getting
//! `weight` messages per turn, in priority tiers (a higher tier first), with an
//! optional limit of leases per producer; plus the delivery leases that turn a missing ack into a
//! redelivery, and held messages (delayed ones whose time has not come,
//! which wait outside the ring without holding anyone back).
//!
//! How it fits: the store persists messages and tells the server which
//! sequences were committed; the server's per-queue dispatcher drives a
//! [`Scheduler`] with those inputs ([`Scheduler::enqueued`]), asks it for the
//! next message when a consumer has credit ([`Scheduler::next`]), routes acks
//! and nacks to it, and calls [`Scheduler::expire`] from its timer. This crate
//! only decides order and tracks leases: it never sees a payload, reads no
//! clock (time is passed in), does no I/O and has no async. Memory is
//! O(producers holding messages), never O(backlog): a producer's undelivered
//! messages are a range of sequence numbers.
//!
//! IMPLEMENTATION CAVEATS:
//!
//! - Attempts live in memory only. After a leader change the new leader
//!   rebuilds its scheduler from the state machine and every unacked message
//!   starts again at attempt 1, so max-delivery-attempts counts per leader term.
//! - A producer's slot, tail included, is dropped once it holds nothing. A
//!   range announced again after that (sequences already acked) is taken as new
//!   and delivered again: the caller must announce each sequence once.
//! - TTL and dead-lettering are the caller's: it checks a dispatch's age
//!   and attempt against the producer's policy.
//! - Every message costs one credit whatever its size: DRR counts messages,
//!   not bytes.
//! - The lease timeout is one value for the whole scheduler, fixed at
//!   construction; there is no per-message extension ("touch") yet.
//! - The slab of producer slots never shrinks: its length is the peak number
//!   of producers holding messages at once (a freed slot keeps only a
//!   generation number).
//! - Policy overrides are kept until reset with `set_policy(p, None)`, even
//!   across [`Scheduler::forget`], since they are policy rather than state.
//! - Each tier keeps a turn state per tenant index it has seen, and that
//!   vector never shrinks either (its length is the peak number of tenants
//!   holding messages at once).
//! - A tenant whose last producer in a tier leaves from anywhere but the
//!   front leaves a stale entry in the tier's tenant ring, dropped when it
//!   reaches the front.
//! - A decision is O(1) amortised, not worst case, once shares are set: a
//!   tenant with a share under one message per turn is passed over until
//!   it has saved a whole one (at most 64 turns, [`MIN_SHARE`]).

mod config;
mod dispatch;
mod error;
mod jain;
mod lease_heap;
mod producer;
mod producer_ring;
mod ring;
mod scheduler;
mod slab;
mod tenants;
mod undelivered;

pub use config::SchedulerConfig;
pub use dispatch::Dispatch;
pub use error::SettleError;
pub use jain::jain_index;
pub use producer::{ProducerPolicy, ProducerView};
pub use scheduler::Scheduler;
pub use tenants::{MIN_SHARE, WHOLE_SHARE};
