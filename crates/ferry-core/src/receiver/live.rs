//! The journals of the partial files this process is writing, so that an
//! interrupt (Ctrl-C, SIGTERM) can record the segments complete since
//! each journal's last append before the process exits. Without it a
//! run interrupted a few seconds after an append would send those
//! segments again (see [`crate::journal::SYNC_AFTER`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::partial::{record_now, JournalW};

/// A journal's place in [`LIVE`].
pub(super) type Key = u64;

struct Live {
    next: Key,
    journals: HashMap<Key, Weak<Mutex<JournalW>>>,
}

/// One entry per partial file being written: bounded by the files in
/// flight, removed when the file is dropped.
static LIVE: Mutex<Option<Live>> = Mutex::new(None);

/// Watch `w` until [`forget`] is called with the key returned.
pub(super) fn watch(w: &Arc<Mutex<JournalW>>) -> Key {
    let Ok(mut g) = LIVE.lock() else {
        return Key::MAX;
    };
    let live = g.get_or_insert_with(|| Live {
        next: 0,
        journals: HashMap::new(),
    });
    let k = live.next;
    live.next += 1;
    live.journals.insert(k, Arc::downgrade(w));
    k
}

pub(super) fn forget(k: Key) {
    if let Ok(mut g) = LIVE.lock() {
        if let Some(live) = g.as_mut() {
            live.journals.remove(&k);
        }
    }
}

/// Sync each partial file being written and record in its journal the
/// segments complete and verified so far. Called once, by the CLI, when
/// the run is interrupted; the process exits afterwards. A file whose
/// sync fails records nothing more (its next run sends those segments).
pub fn record_on_interrupt() {
    let journals: Vec<_> = match LIVE.lock() {
        Ok(g) => g
            .as_ref()
            .map(|l| l.journals.values().filter_map(Weak::upgrade).collect())
            .unwrap_or_default(),
        Err(_) => return,
    };
    for w in journals {
        if let Ok(mut w) = w.lock() {
            record_now(&mut w);
        }
    }
}
