//! A listed file by its handle: the table entry the walk makes for each
//! file, and how a worker opens it (once, shared by its segments, only if
//! it is still the file the walk saw) and lets it go after its last
//! segment.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::early::PreHash;
use crate::endpoint::Source;
use crate::error::{Error, Result};

use super::SrcFile;

/// Open a listed file for reading: without following a symlink (unless
/// the user named it), and only if it is still the file the walk saw, so a
/// file swapped for a symlink or another file after the walk is never sent
/// in its place.
pub(super) fn open_listed(path: &Path, ident: (u64, u64), follow: bool) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    if !follow {
        o.custom_flags(libc::O_NOFOLLOW);
    }
    let changed = || {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "vanished or replaced since it was listed",
        )
    };
    let h = o.open(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => changed(),
        _ => e,
    })?;
    let m = h.metadata()?;
    if (m.dev(), m.ino()) != ident {
        return Err(changed());
    }
    Ok(h)
}

impl SrcFile {
    /// A file or block device found by the walk, opened by path when first
    /// read.
    pub(super) fn listed(
        path: PathBuf,
        size: u64,
        mtime: (i64, u32),
        ident: (u64, u64),
        follow: bool,
    ) -> Self {
        Self {
            path,
            size,
            mtime,
            open: Mutex::new(None),
            kept_open: false,
            remaining: AtomicU64::new(0),
            failed: Default::default(),
            prehash: PreHash::default(),
            ident,
            follow,
            holey: false,
            dense: false,
            device: false,
        }
    }

    /// A source opened at walk time and kept for the session (an NBD
    /// export): never opened by path again.
    pub(super) fn kept(
        path: PathBuf,
        size: u64,
        mtime: (i64, u32),
        reader: Arc<dyn Source>,
    ) -> Self {
        Self {
            path,
            size,
            mtime,
            open: Mutex::new(Some(reader)),
            kept_open: true,
            remaining: AtomicU64::new(0),
            failed: Default::default(),
            prehash: PreHash::default(),
            // Kept open from the start: never opened by path again.
            ident: (0, 0),
            follow: true,
            holey: true,
            dense: false,
            device: false,
        }
    }

    /// The reader a segment of this file reads with: the one already
    /// open, else a new one (kept for the file's other segments). `None`
    /// once the file has failed; the open's error (returned after the lock
    /// is let go) when it cannot be opened.
    pub(super) fn reader(
        &self,
        direct_io: bool,
    ) -> Result<std::io::Result<Option<Arc<dyn Source>>>> {
        let mut g = self
            .open
            .lock()
            .map_err(|_| Error::Protocol("lock poisoned".into()))?;
        Ok(match &*g {
            Some(h) => Ok(Some(h.clone())),
            None if self.failed.load(Ordering::SeqCst) => Ok(None),
            None => open_listed(&self.path, self.ident, self.follow).map(|h| {
                let direct = direct_io && !self.device;
                let r = crate::direct::Reader::listed(h, direct, self.size, self.dense);
                let h: Arc<dyn Source> = Arc::new(r);
                *g = Some(h.clone());
                Some(h)
            }),
        })
    }

    /// A handle to ask where the file's data lies while its segments are
    /// queued (see [`super::holes`]): the one kept open, else the file
    /// opened once more, as the workers will open it. `None` when it has
    /// no holes to find, or cannot be opened (the workers meet and report
    /// that).
    pub(super) fn reader_for_plan(&self) -> Option<Arc<dyn Source>> {
        if !self.holey {
            return None;
        }
        if self.kept_open {
            return self.open.lock().ok().and_then(|g| g.clone());
        }
        let f = open_listed(&self.path, self.ident, self.follow).ok()?;
        Some(Arc::new(f))
    }

    /// After the file's last segment: close it, unless it is kept open.
    pub(super) fn release(&self) {
        if !self.kept_open {
            if let Ok(mut g) = self.open.lock() {
                *g = None;
            }
        }
    }
}
