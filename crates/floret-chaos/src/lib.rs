//! Chaos testing for floret: a workload that records every produce,
//! delivery and ack ([`history`]), faults injected into real `floret serve`
//! processes, and a checker that finds lost, unexpected, corrupted and
//! out-of-order messages in the recorded history ([`checker`]).

pub mod checker;
pub mod history;
