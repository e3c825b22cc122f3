//! How a sink pump's batches close: by count, by bytes, or by the linger of
//! their oldest message. Pure: the time is passed in.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Gathers items into batches.
#[derive(Debug)]
pub struct Batcher<T> {
    batch_max: usize,
    batch_max_bytes: u64,
    linger: Duration,
    /// The batch still taking items.
    forming: Vec<T>,
    forming_bytes: u64,
    /// When the forming batch's first item came.
    oldest_at: Option<Instant>,
    /// Batches closed by count or bytes, oldest first.
    closed: VecDeque<Vec<T>>,
}

impl<T> Batcher<T> {
    /// Batches of at most `batch_max` items (at least 1) and
    /// `batch_max_bytes` (an item larger than that goes alone), closed
    /// `linger` after their first item at the latest.
    pub fn new(batch_max: usize, batch_max_bytes: u64, linger: Duration) -> Self {
        Self {
            batch_max: batch_max.max(1),
            batch_max_bytes,
            linger,
            forming: Vec::new(),
            forming_bytes: 0,
            oldest_at: None,
            closed: VecDeque::new(),
        }
    }

    /// Changes the count a batch closes at (at least 1), from the next item on.
    pub fn set_batch_max(&mut self, batch_max: usize) {
        self.batch_max = batch_max.max(1);
    }

    /// Adds `item` of `bytes` that arrived at `now`.
    pub fn push(&mut self, item: T, bytes: u64, now: Instant) {
        if !self.forming.is_empty() && self.forming_bytes + bytes > self.batch_max_bytes {
            self.close();
        }
        if self.forming.is_empty() {
            self.oldest_at = Some(now);
        }
        self.forming.push(item);
        self.forming_bytes += bytes;
        self.close_if_full();
    }

    fn close_if_full(&mut self) {
        if self.forming.len() >= self.batch_max {
            self.close();
        }
    }

    /// The next batch to send at `now`: a closed one, or the forming one
    /// once its oldest item has waited the linger.
    pub fn take(&mut self, now: Instant) -> Option<Vec<T>> {
        if self.closed.is_empty() && self.deadline().is_some_and(|deadline| now >= deadline) {
            self.close();
        }
        self.closed.pop_front()
    }

    /// When the forming batch closes by linger, if it holds anything.
    pub fn deadline(&self) -> Option<Instant> {
        self.oldest_at.map(|oldest| oldest + self.linger)
    }

    fn close(&mut self) {
        if self.forming.is_empty() {
            return;
        }
        self.closed.push_back(std::mem::take(&mut self.forming));
        self.forming_bytes = 0;
        self.oldest_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINGER: Duration = Duration::from_millis(5);

    #[test]
    fn lone_message_waits_the_linger_and_no_longer() {
        let start = Instant::now();
        let mut batcher = Batcher::new(100, 1 << 20, LINGER);
        batcher.push("a", 10, start);
        assert_eq!(batcher.take(start + Duration::from_millis(4)), None);
        assert_eq!(batcher.deadline(), Some(start + LINGER));
        assert_eq!(batcher.take(start + LINGER), Some(vec!["a"]));
        assert_eq!(batcher.deadline(), None);
        assert_eq!(batcher.take(start + LINGER * 10), None);
    }

    #[test]
    fn flood_leaves_in_full_batches_without_waiting() {
        let start = Instant::now();
        let mut batcher = Batcher::new(3, 1 << 20, LINGER);
        for item in 0..7 {
            batcher.push(item, 10, start);
        }
        assert_eq!(batcher.take(start), Some(vec![0, 1, 2]));
        assert_eq!(batcher.take(start), Some(vec![3, 4, 5]));
        assert_eq!(batcher.take(start), None, "the seventh waits for more");
        assert_eq!(batcher.take(start + LINGER), Some(vec![6]));
    }

    #[test]
    fn batch_closes_before_a_message_would_pass_its_bytes() {
        let start = Instant::now();
        let mut batcher = Batcher::new(100, 100, LINGER);
        batcher.push("a", 60, start);
        batcher.push("b", 60, start);
        batcher.push("huge", 500, start);
        batcher.push("c", 1, start);
        assert_eq!(batcher.take(start), Some(vec!["a"]));
        assert_eq!(batcher.take(start), Some(vec!["b"]));
        assert_eq!(
            batcher.take(start),
            Some(vec!["huge"]),
            "a large message goes alone"
        );
        assert_eq!(batcher.take(start + LINGER), Some(vec!["c"]));
    }

    #[test]
    fn linger_counts_from_the_oldest_message_of_the_batch() {
        let start = Instant::now();
        let mut batcher = Batcher::new(100, 1 << 20, LINGER);
        batcher.push(1, 1, start);
        batcher.push(2, 1, start + Duration::from_millis(4));
        assert_eq!(batcher.take(start + LINGER), Some(vec![1, 2]));
        batcher.push(3, 1, start + Duration::from_millis(6));
        assert_eq!(
            batcher.deadline(),
            Some(start + Duration::from_millis(6) + LINGER)
        );
    }
}
