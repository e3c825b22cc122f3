//! Why an ack or nack was refused.

use std::fmt;

/// Refusal of [`Scheduler::ack`](crate::Scheduler::ack) or
/// [`Scheduler::nack`](crate::Scheduler::nack); the caller tells the consumer
/// its settlement came too late or named the wrong delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleError {
    /// No live lease for that (producer, sequence, attempt): it expired, was
    /// nacked or acked already, or belongs to another attempt.
    NotLeased,
}

impl fmt::Display for SettleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotLeased => f.write_str("no live lease for this message and attempt"),
        }
    }
}

impl std::error::Error for SettleError {}
