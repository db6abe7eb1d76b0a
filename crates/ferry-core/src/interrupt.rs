//! An interrupted run (Ctrl-C, SIGTERM), as the CLI's handler drives it:
//! [`stop`] first, so that the receiver changes nothing more in the
//! destination (no rename into place, no deletion, no new entry), then
//! [`record`], which syncs each partial file and records in its journal
//! what is complete, so the next run resumes from there.

use std::sync::atomic::{AtomicBool, Ordering};

static STOPPING: AtomicBool = AtomicBool::new(false);

/// From now on, the destination is left as it is.
pub fn stop() {
    STOPPING.store(true, Ordering::SeqCst);
}

/// Whether the run was interrupted: checked before each rename into
/// place, each deletion and each entry of the list.
pub fn stopping() -> bool {
    STOPPING.load(Ordering::Relaxed)
}

/// Record what each partial file being written completed (see
/// [`crate::receiver::record_on_interrupt`]).
pub fn record() {
    crate::receiver::record_on_interrupt();
}
