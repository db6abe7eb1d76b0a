//! How far the file list runs ahead of the receiver (protocol version 10).
//!
//! The receiver says with `Decided { below }` that it has decided on every
//! entry below `below`: asked for it, or found it up to date. The walk
//! lists at most [`WINDOW`] entries past the last `below`, so the entries
//! the sender keeps for the receiver to ask for, and those the receiver
//! holds while its open-file budget is spent, stay bounded however many
//! files the tree has (a million-file tree no longer lists itself into
//! memory on both sides before the first file is written).

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Entries the list may run ahead of the receiver's last `Decided`.
pub(crate) const WINDOW: u32 = 1 << 16;

/// Whether entry `id` may be listed when the receiver has decided on every
/// entry below `below`.
pub(crate) fn may_list(id: u32, below: u32) -> bool {
    u64::from(id) < u64::from(below) + u64::from(WINDOW)
}

/// The receiver's last `below`, shared by the request thread (which hears
/// it) and the walk (which waits for it).
#[derive(Default)]
pub(super) struct Credit {
    st: Mutex<(u32, bool)>,
    cv: Condvar,
}

impl Credit {
    /// The receiver decided on everything below `below`.
    pub(super) fn decided(&self, below: u32) {
        if let Ok(mut g) = self.st.lock() {
            g.0 = g.0.max(below);
        }
        self.cv.notify_all();
    }

    /// The receiver's requests ended (it finished, failed or went away):
    /// nobody waits any more.
    pub(super) fn close(&self) {
        if let Ok(mut g) = self.st.lock() {
            g.1 = true;
        }
        self.cv.notify_all();
    }

    /// Wait until entry `id` may be listed, or the requests ended.
    pub(super) fn wait_for(&self, id: u32) {
        let Ok(mut g) = self.st.lock() else { return };
        while !may_list(id, g.0) && !g.1 {
            g = match self.cv.wait_timeout(g, Duration::from_millis(200)) {
                Ok((g, _)) => g,
                Err(_) => return,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_runs_a_window_ahead() {
        assert!(may_list(0, 0));
        assert!(may_list(WINDOW - 1, 0));
        assert!(!may_list(WINDOW, 0));
        assert!(may_list(WINDOW + 9, 10));
        assert!(may_list(u32::MAX - 1, u32::MAX - WINDOW));
        assert!(may_list(u32::MAX, u32::MAX));
    }

    #[test]
    fn a_waiting_walk_goes_on_when_told_or_closed() {
        let c = std::sync::Arc::new(Credit::default());
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.wait_for(WINDOW + 5));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished());
        c.decided(6);
        t.join().unwrap();
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.wait_for(3 * WINDOW));
        c.close();
        t.join().unwrap();
    }
}
