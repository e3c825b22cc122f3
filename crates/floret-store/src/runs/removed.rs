//! Which messages of one run are removed (acked, dropped, dead lettered):
//! those before the producer's head, and those whose bit is set in the
//! run's removal marks.
//!
//! Every message below a producer's head is removed (`ProducerRecord::head`),
//! so a removal at the head moves the head and sets no bit. Queues are
//! consumed from the head, so most acks change only the producer's record,
//! and a drained run usually never has marks: writing a marks key for every
//! ack doubled the keys an ack wrote to sled, and a drain of 10,000
//! producers spent most of its time there. A removal above the head (an
//! ack that overtook the one before it) sets its bit, and the head skips
//! set bits when it reaches them within the run.
//!
//! The stored marks are the bits alone; the head comes from the producer's
//! record, so the marks of a run mean nothing without it.

use super::RunError;

/// What [`Removed::insert`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removal {
    /// It was removed already.
    Already,
    /// It was at the head, which moved past it (and past the marked
    /// messages after it): no bit to store.
    MovedHead,
    /// Its bit is set: the marks must be stored.
    Marked,
}

/// The removed messages of a run of `count`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Removed {
    bits: Vec<u8>,
    count: usize,
    /// Where the producer's head stands in the run, once known to be in
    /// it or past it (the run's length: past it). Messages before it are
    /// removed. None while the head is before the run or not yet told.
    head: Option<usize>,
}

impl Removed {
    /// No message of a run of `count` removed.
    pub(crate) fn none(count: usize) -> Self {
        Self {
            bits: vec![0; count.div_ceil(8)],
            count,
            head: None,
        }
    }

    /// The marks stored for a run of `count` (None: it has none), before
    /// the producer's head is known.
    pub(crate) fn stored(bytes: Option<&[u8]>, count: usize) -> Result<Self, RunError> {
        match bytes {
            None => Ok(Self::none(count)),
            Some(bits) if bits.len() == count.div_ceil(8) && Self::padding_clear(bits, count) => {
                Ok(Self {
                    bits: bits.to_vec(),
                    count,
                    head: None,
                })
            }
            Some(_) => Err(RunError("removal marks do not match the run's length")),
        }
    }

    /// Whether the bits past the run's last message are all clear, as
    /// [`Removed::all`] reads only the bits of messages.
    fn padding_clear(bits: &[u8], count: usize) -> bool {
        let used_in_last = count % 8;
        used_in_last == 0 || bits.last().is_none_or(|last| last >> used_in_last == 0)
    }

    /// The producer's head is at sequence `head` and the run starts at
    /// `first`: every message before the head is removed, and the head
    /// moves past the marked messages it finds. A head never moves back, so
    /// an older one changes nothing.
    pub(crate) fn head_at(&mut self, first: u64, head: u64) {
        let Some(offset) = head.checked_sub(first) else {
            return;
        };
        let index = offset.min(self.count as u64) as usize;
        let head = self.head.map_or(index, |known| known.max(index));
        self.head = Some(self.past_marked(head));
    }

    /// The first index from `index` on whose message is not marked.
    fn past_marked(&self, mut index: usize) -> usize {
        while index < self.count && self.marked(index) {
            index += 1;
        }
        index
    }

    /// The producer's head as this run leaves it: None while it is before
    /// the run, else its index (the run's length once past it).
    pub(crate) fn head_index(&self) -> Option<usize> {
        self.head
    }

    fn marked(&self, index: usize) -> bool {
        self.bits[index / 8] & (1 << (index % 8)) != 0
    }

    /// Whether message `index` is removed.
    pub(crate) fn contains(&self, index: usize) -> bool {
        self.head.is_some_and(|head| index < head) || self.marked(index)
    }

    /// Removes message `index`. The message at the head moves the head
    /// past it and past the marked messages after it; any other sets its
    /// bit.
    pub(crate) fn insert(&mut self, index: usize) -> Removal {
        if self.contains(index) {
            return Removal::Already;
        }
        if self.head == Some(index) {
            self.head = Some(self.past_marked(index + 1));
            return Removal::MovedHead;
        }
        self.bits[index / 8] |= 1 << (index % 8);
        Removal::Marked
    }

    /// Whether every message of the run is removed.
    pub(crate) fn all(&self) -> bool {
        (self.head.unwrap_or(0)..self.count).all(|index| self.marked(index))
    }

    /// The stored form: the bits alone.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_know_when_the_whole_run_is_removed() {
        let mut removed = Removed::none(9);
        for index in 0..8 {
            assert_eq!(removed.insert(index), Removal::Marked);
        }
        assert_eq!(removed.insert(3), Removal::Already);
        assert!(!removed.all());
        removed.insert(8);
        assert!(removed.all());
        let stored = Removed::stored(Some(removed.as_bytes()), 9).unwrap();
        assert_eq!(stored, removed);
        assert!(Removed::stored(Some(&[0]), 9).is_err());
        assert!(
            Removed::stored(Some(&[0xff, 0b10]), 9).is_err(),
            "a mark past the run's end would make a live run look removed"
        );
    }

    #[test]
    fn removals_at_the_head_set_no_bit() {
        let mut removed = Removed::none(10);
        removed.head_at(100, 100);
        for index in 0..4 {
            assert_eq!(removed.insert(index), Removal::MovedHead);
        }
        assert_eq!(removed.head_index(), Some(4));
        assert_eq!(removed.as_bytes(), &[0, 0], "no marks to write");
        assert!(removed.contains(3) && !removed.contains(4));
    }

    #[test]
    fn a_removal_in_a_run_the_head_has_not_reached_is_marked() {
        let mut removed = Removed::none(4);
        removed.head_at(10, 7);
        assert_eq!(removed.insert(0), Removal::Marked);
        assert_eq!(removed.head_index(), None);
        assert_eq!(
            removed.as_bytes(),
            &[1],
            "the head is in an earlier run: only a bit can say 10 is gone"
        );
    }

    #[test]
    fn an_ack_repeated_below_the_head_counts_once() {
        let mut removed = Removed::none(4);
        removed.head_at(10, 12);
        assert_eq!(
            removed.insert(0),
            Removal::Already,
            "below the head: removed already"
        );
        assert_eq!(removed.insert(1), Removal::Already);
        assert_eq!(removed.insert(2), Removal::MovedHead);
        assert_eq!(removed.insert(2), Removal::Already);
    }

    #[test]
    fn the_head_skips_the_acks_that_overtook_it() {
        let mut removed = Removed::none(6);
        removed.head_at(0, 0);
        assert_eq!(removed.insert(2), Removal::Marked);
        assert_eq!(removed.insert(1), Removal::Marked);
        assert_eq!(
            removed.head_index(),
            Some(0),
            "acks above the head set bits"
        );
        assert_eq!(removed.insert(0), Removal::MovedHead);
        assert_eq!(removed.head_index(), Some(3));
        assert_eq!(removed.insert(4), Removal::Marked);
        assert_eq!(removed.insert(5), Removal::Marked);
        assert!(!removed.all(), "3 is still stored");
        assert_eq!(removed.insert(3), Removal::MovedHead);
        assert_eq!(removed.head_index(), Some(6));
        assert!(removed.all());
    }

    #[test]
    fn a_head_told_to_a_run_moves_past_its_marked_messages() {
        let mut removed = Removed::none(4);
        removed.insert(0);
        removed.insert(1);
        removed.head_at(20, 20);
        assert_eq!(
            removed.head_index(),
            Some(2),
            "the head reached a run whose first acks overtook it"
        );
    }

    #[test]
    fn a_head_past_the_run_removes_all_of_it_and_an_older_head_changes_nothing() {
        let mut removed = Removed::none(5);
        removed.head_at(10, 3);
        assert_eq!(removed.head_index(), None, "a head before the run");
        removed.head_at(10, 40);
        assert!(removed.all());
        removed.head_at(10, 12);
        assert_eq!(removed.head_index(), Some(5), "the head does not move back");
    }
}
