//! The files with a partial file and journal that this process is
//! writing, so that an interrupt (Ctrl-C, SIGTERM) can record the
//! segments complete since each journal's last append before the process
//! exits. Without it a run interrupted a few seconds after an append
//! would send those segments again (see [`crate::journal::SYNC_AFTER`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::file::DstFile;

/// A file's place in [`LIVE`].
pub(super) type Key = u64;

#[derive(Default)]
struct Live {
    next: Key,
    files: HashMap<Key, Weak<DstFile>>,
}

/// One entry per file with a journal being written: bounded by the files
/// in flight, removed when the file's journal state is dropped.
static LIVE: Mutex<Option<Live>> = Mutex::new(None);

/// A key for a file about to be made (kept by its journal state, which
/// calls [`forget`] when dropped).
pub(super) fn reserve() -> Key {
    let Ok(mut g) = LIVE.lock() else {
        return Key::MAX;
    };
    let live = g.get_or_insert_with(Live::default);
    live.next += 1;
    live.next
}

/// Watch `f` under `k` (from [`reserve`]).
pub(super) fn watch(k: Key, f: &Arc<DstFile>) {
    if let Ok(mut g) = LIVE.lock() {
        g.get_or_insert_with(Live::default)
            .files
            .insert(k, Arc::downgrade(f));
    }
}

pub(super) fn forget(k: Key) {
    if let Ok(mut g) = LIVE.lock() {
        if let Some(live) = g.as_mut() {
            live.files.remove(&k);
        }
    }
}

/// Sync each partial file being written and record in its journal the
/// segments complete and verified so far, as a file that the run ends
/// without does when it is dropped (one that failed verification
/// records nothing). Called once by the CLI when the run is interrupted,
/// after [`crate::interrupt::stop`]; the process exits afterwards.
pub fn record_on_interrupt() {
    let files: Vec<Arc<DstFile>> = match LIVE.lock() {
        Ok(g) => g
            .as_ref()
            .map(|l| l.files.values().filter_map(Weak::upgrade).collect())
            .unwrap_or_default(),
        Err(_) => return,
    };
    for f in files {
        f.record_partial();
    }
}
