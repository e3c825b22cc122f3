//! Chaos testing for floret, after Jepsen's queue tests: a workload that
//! records every produce, delivery and ack ([`history`], [`workload`]),
//! named fault schedules injected into real `floret serve` processes
//! ([`schedule`], [`cluster`], [`proxy`]), and a checker that finds lost,
//! unexpected, corrupted and out-of-order messages in the history after a
//! full drain ([`checker`]). [`run`] ties one schedule's run together; the
//! `floret-chaos` binary runs many as a soak, and `tests/chaos.rs` runs a
//! short round of each in `cargo test`. [`ports`] picks loopback ports
//! for nodes started as processes, and [`process`] is how every test starts
//! one (the command line, the ready line, leader polling), here and in the
//! black-box tests' harness.
//!
//! IMPLEMENTATION CAVEATS
//! - Three nodes on loopback only; clock faults and disk-full are not injected.

pub mod checker;
pub mod cluster;
pub mod history;
pub mod ports;
pub mod process;
pub mod proxy;
pub mod run;
pub mod schedule;
pub mod workload;

pub use run::{RunResult, RunSpec, run};
pub use schedule::Schedule;
