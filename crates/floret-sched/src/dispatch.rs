//! What [`Scheduler::next`](crate::Scheduler::next) hands out.

/// One message chosen for delivery; the caller reads its payload from the
/// store by `(producer, sequence)` and echoes all three fields in the ack.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Dispatch<K> {
    /// The producer the message belongs to.
    pub producer: K,
    /// The message's sequence number within its producer.
    pub sequence: u64,
    /// Delivery attempt, 1 on first delivery; an ack must name it so a late
    /// ack of an expired attempt cannot settle the redelivery.
    pub attempt: u32,
}
