//! The list window of protocol version 10, as both sides count it.
//!
//! The receiver says with `Decided { below }` that it has decided on every
//! entry whose id is below `below`. Of the entries the sender has sent,
//! at most [`WINDOW`] may have an id at or above the last `below` it got:
//! counted in entries sent, not in ids, because a walk skips ids (entries
//! it could not or would not list), and a run of skipped ids must not
//! close the window. The sender waits for the next `Decided` instead of
//! sending more; the receiver, which counts the same way against the last
//! `below` it sent (never ahead of what the sender has heard), refuses an
//! entry past it. So the entries each side holds for the list (the
//! sender's table, the receiver's files waiting for room) stay bounded
//! however many files the tree has.

use std::collections::VecDeque;

/// Entries sent and not yet below the last `Decided`.
pub const WINDOW: usize = 1 << 16;

/// The ids of the entries in the window.
#[derive(Debug, Default)]
pub struct Window {
    below: u32,
    open: VecDeque<u32>,
}

impl Window {
    /// The receiver decided on everything below `below`; false when that
    /// goes back.
    pub fn decided(&mut self, below: u32) -> bool {
        if below < self.below {
            return false;
        }
        self.below = below;
        while self.open.front().is_some_and(|&id| id < below) {
            self.open.pop_front();
        }
        true
    }

    /// The last `below`.
    pub fn below(&self) -> u32 {
        self.below
    }

    /// Whether entry `id` (ids increase) fits in the window now.
    pub fn has_room(&self, id: u32) -> bool {
        id < self.below || self.open.len() < WINDOW
    }

    /// Count entry `id` as sent (or received); false when it did not fit.
    pub fn push(&mut self, id: u32) -> bool {
        if !self.has_room(id) {
            return false;
        }
        if id >= self.below {
            self.open.push_back(id);
        }
        true
    }

    /// The id after the last entry counted, if any (a `below` past it
    /// names entries that were never sent).
    pub fn next(&self) -> Option<u32> {
        self.open.back().map(|&id| id.saturating_add(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_counts_entries_not_ids() {
        let mut w = Window::default();
        for id in 0..WINDOW as u32 {
            assert!(w.push(id));
        }
        assert!(!w.push(WINDOW as u32), "full");
        assert!(w.decided(10));
        for id in 0..10u32 {
            // A gap of a million ids costs one place, not a million.
            assert!(w.push(WINDOW as u32 + id * 1_000_000));
        }
        assert!(!w.push(u32::MAX - 1));
        assert_eq!(w.next(), Some(WINDOW as u32 + 9_000_001));
    }

    #[test]
    fn decided_never_goes_back_and_may_pass_the_list() {
        let mut w = Window::default();
        assert!(w.push(5));
        assert!(w.decided(3));
        assert!(!w.decided(2));
        assert!(w.decided(3));
        assert!(w.decided(u32::MAX));
        assert_eq!(w.below(), u32::MAX);
        // Below the last `below` (never in order, but never refused).
        assert!(w.has_room(7));
    }
}
