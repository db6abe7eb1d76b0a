//! The sender's side of the list window (protocol version 10; see
//! [`crate::window`]): the walk waits for room before it sends an entry,
//! the request thread makes room when the receiver's `Decided` comes.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::window::Window;

/// The window, shared by the request thread (which hears `Decided`) and
/// the walk (which waits for room).
#[derive(Default)]
pub(super) struct Credit {
    st: Mutex<(Window, bool)>,
    cv: Condvar,
}

/// What the receiver's `below` says, against what was sent.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decided {
    Ok,
    /// Smaller than the last one.
    Back,
    /// Past the last entry sent: it decided on entries it never got.
    Past,
}

impl Credit {
    /// The receiver decided on everything below `below`.
    pub(super) fn decided(&self, below: u32) -> Decided {
        let r = match self.st.lock() {
            Ok(mut g) => {
                let sent = g.0.next().unwrap_or(g.0.below());
                if below > sent.max(g.0.below()) {
                    Decided::Past
                } else if g.0.decided(below) {
                    Decided::Ok
                } else {
                    Decided::Back
                }
            }
            Err(_) => Decided::Ok,
        };
        self.cv.notify_all();
        r
    }

    /// The receiver's requests ended (it finished, failed or went away):
    /// nobody waits any more.
    pub(super) fn close(&self) {
        if let Ok(mut g) = self.st.lock() {
            g.1 = true;
        }
        self.cv.notify_all();
    }

    /// [`Credit::send`] without waiting: `None` while `id` does not fit.
    pub(super) fn try_send(&self, id: u32) -> Option<bool> {
        let Ok(mut g) = self.st.lock() else {
            return Some(false);
        };
        if g.1 {
            return Some(false);
        }
        g.0.push(id).then_some(true)
    }

    /// Wait until entry `id` fits in the window and count it as sent;
    /// false when the requests ended first (the walk stops).
    pub(super) fn send(&self, id: u32) -> bool {
        let Ok(mut g) = self.st.lock() else {
            return false;
        };
        loop {
            if g.1 {
                return false;
            }
            if g.0.push(id) {
                return true;
            }
            g = match self.cv.wait_timeout(g, Duration::from_millis(200)) {
                Ok((g, _)) => g,
                Err(_) => return false,
            };
        }
    }
}

/// Closes the credit when dropped: the walk never waits on requests that
/// ended, whether they returned or panicked.
pub(super) struct CloseOnDrop<'a>(pub(super) &'a Credit);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::WINDOW;

    #[test]
    fn a_waiting_walk_goes_on_when_told_and_stops_when_closed() {
        let c = std::sync::Arc::new(Credit::default());
        for id in 0..WINDOW as u32 {
            assert_eq!(c.try_send(id), Some(true));
        }
        assert_eq!(c.try_send(WINDOW as u32 + 5), None, "full: would wait");
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.send(WINDOW as u32 + 5));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished());
        assert_eq!(c.decided(6), Decided::Ok);
        assert!(t.join().unwrap());
        assert_eq!(c.decided(5), Decided::Back);
        assert_eq!(c.decided(WINDOW as u32 + 7), Decided::Past);
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.send(3 * WINDOW as u32));
        c.close();
        assert!(!t.join().unwrap());
    }
}
