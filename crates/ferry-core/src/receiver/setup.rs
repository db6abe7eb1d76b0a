//! The destination as a session starts on it, and the report this side
//! sends at the end.

use super::*;

/// The destination as a session starts on it: its root made ready and
/// opened as the handle everything below it is reached through.
pub(super) struct Setup {
    pub(super) tree: DestDir,
    pub(super) backup_dir: Option<DestDir>,
    /// The backup directory's device and inode: `--delete` never removes
    /// it (a relative one lies within the destination).
    pub(super) backup_id: Option<(u64, u64)>,
    /// `--chown`'s ids on this host.
    pub(super) chown: (Option<u32>, Option<u32>),
    pub(super) root_created: bool,
    /// A file-or-directory path that the first entry decides.
    pub(super) late: Option<PathBuf>,
    /// `--force` replaces a file at the root with a directory: done at
    /// the first entry, so a session that fails before sending anything
    /// (a pull of a source that is not there) leaves the file.
    pub(super) replace_root: Option<PathBuf>,
    /// An NBD export that the one file of the list is written to.
    pub(super) nbd: Option<String>,
    pub(super) cache: Option<Arc<ferry_delta::SigCache>>,
}

impl Setup {
    pub(super) fn open(dest: &Dest, opts: &SyncOptions) -> Result<Setup> {
        let nbd = match dest {
            Dest::Nbd(uri) => Some(uri.clone()),
            _ => None,
        };
        // A file-or-directory destination that is an existing directory
        // is a directory; otherwise the first entry decides.
        let (root, late) = match dest {
            Dest::Nbd(_) => (PathBuf::from("."), None),
            Dest::Dir(r) => (r.clone(), None),
            Dest::FileOrDir(p) if fs::metadata(p).is_ok_and(|m| m.is_dir()) => (p.clone(), None),
            Dest::FileOrDir(p) => (p.clone(), Some(p.clone())),
        };
        let root = root.as_path();
        let mut root_created = false;
        let mut replace_root = None;
        // A dry run decides as the real run would, and changes nothing.
        let mut absent = nbd.is_some() || late.is_some();
        if !absent {
            let at = root_at(root, opts.force)?;
            absent = opts.dry_run && at != decide::RootAt::Use;
            // A backup directory within it is made now: so is the root.
            let inside = opts.backup_dir.as_ref().is_some_and(|d| d.is_relative());
            let later = at == decide::RootAt::Replace && !inside;
            if later && !opts.dry_run {
                absent = true;
                replace_root = Some(root.to_path_buf());
            } else if !opts.dry_run {
                root_created = prepare_root(root, at)?;
            }
        }
        let tree = if absent {
            DestDir::absent(root)
        } else {
            DestDir::open(root).map_err(|err| Error::io_op("open directory", root, err))?
        };
        let cache = match (&opts.sig_cache, opts.dry_run) {
            (Some(dir), false) => Some(Arc::new(
                ferry_delta::SigCache::open(dir).map_err(|e| Error::io(dir, e))?,
            )),
            _ => None,
        };
        let mut backup_id = None;
        let backup_dir = match &opts.backup_dir {
            Some(dir) => {
                // Relative to the destination directory, as in rsync.
                let base = match &late {
                    Some(p) => p.parent().unwrap_or(Path::new(".")),
                    None => root,
                };
                let path = base.join(dir);
                if opts.dry_run {
                    backup_id = fs::metadata(&path).ok().map(|m| (m.dev(), m.ino()));
                    None
                } else {
                    fs::create_dir_all(&path)
                        .map_err(|err| Error::io_op("create directory", &path, err))?;
                    let d = DestDir::open(&path)
                        .map_err(|err| Error::io_op("open directory", &path, err))?;
                    backup_id = d.id();
                    Some(d)
                }
            }
            None => None,
        };
        let chown = match &opts.chown {
            Some(spec) => crate::ids::parse_chown(spec).map_err(Error::Usage)?,
            None => (None, None),
        };
        Ok(Setup {
            chown,
            backup_dir,
            backup_id,
            tree,
            root_created,
            late,
            replace_root,
            nbd,
            cache,
        })
    }
}

impl Dispatcher<'_, '_> {
    /// The root, at the list's first entry: a file that `--force`
    /// replaces with a directory is replaced now (see
    /// [`Setup::replace_root`]), and a file-or-directory destination
    /// becomes one or the other (see [`Dispatcher::resolve_root`]).
    pub(super) fn root_at_first_entry(&mut self, e: &mut Entry) -> Result<()> {
        if let Some(r) = self.replace_root.take() {
            prepare_root(&r, decide::RootAt::Replace)?;
            self.tree = DestDir::open(&r).map_err(|err| Error::io_op("open directory", &r, err))?;
        }
        let Some(p) = self.late.take() else {
            return Ok(());
        };
        // A device the user named is written in place, never replaced by
        // whatever else a sender lists.
        let kind = e.kind();
        let device = |m: fs::Metadata| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_block_device() || m.file_type().is_char_device()
        };
        if !matches!(kind, EntryKind::File | EntryKind::Dir)
            && fs::symlink_metadata(&p).is_ok_and(device)
        {
            let what = match kind {
                EntryKind::Symlink => "symlink",
                _ => "special file",
            };
            return Err(Error::Protocol(format!(
                "{}: a device is written in place, and the sender sent a {what}",
                p.display()
            )));
        }
        self.resolve_root(&p, e)?;
        if e.kind() != EntryKind::Dir {
            self.check.set_shape(Shape::SingleFile);
        }
        Ok(())
    }

    /// First entry of a [`Dest::FileOrDir`] session: a directory source
    /// goes under the path, a file source becomes the path.
    pub(super) fn resolve_root(&mut self, p: &Path, e: &mut Entry) -> Result<()> {
        // A file goes into the path's directory, a tree into the path.
        let decide::LateRoot { root, name } = decide::late_root(p, e.kind())?;
        if let Some(name) = name {
            e.path = name;
        }
        if !root.exists() {
            self.root_created = true;
            if !self.sh.opts.dry_run {
                fs::create_dir_all(&root)
                    .map_err(|err| Error::io_op("create directory", &root, err))?;
            }
        }
        self.tree = if self.sh.opts.dry_run && !root.exists() {
            DestDir::absent(&root)
        } else {
            DestDir::open(&root).map_err(|err| Error::io_op("open directory", &root, err))?
        };
        Ok(())
    }
}

/// What this side tells the sender at the end, from its counters.
pub(super) fn receiver_report(stats: &Stats) -> ReceiverReport {
    let rep = stats.report(0.0);
    ReceiverReport {
        files_total: rep.files_total,
        files_transferred: rep.files_transferred,
        files_delta: rep.files_delta,
        files_deleted: rep.files_deleted,
        files_failed: rep.files_failed,
        bytes_total: rep.bytes_total,
        bytes_transferred: rep.bytes_transferred,
        bytes_written: rep.bytes_written,
        bytes_matched: rep.bytes_matched,
        dirs_total: rep.dirs_total,
        delete_skipped: rep.delete_skipped as u64,
        delta_mismatch: stats.delta_mismatch.load(Ordering::Relaxed),
        bytes_resumed: rep.bytes_resumed,
        files_vanished: rep.files_vanished,
        deletes_held: rep.deletes_held,
        errors: rep.errors,
    }
}

/// What is to be done with the tree's root (see [`decide::root_at`]);
/// an error if it is to stay what it is, not a directory.
fn root_at(root: &Path, force: bool) -> Result<decide::RootAt> {
    // `dst/` names the same entry as `dst`: a file there is a file, not
    // "nothing there" (lstat of `file/` fails with ENOTDIR).
    let bare = fsutil::bare(root);
    let existing = fs::symlink_metadata(bare)
        .ok()
        .map(|m| decide::Stat::of(&m).kind)
        // A symlink to a directory, named by the user (a daemon refuses a
        // symlink its client names), is that directory, as in rsync.
        .map(|k| match k {
            decide::Kind::Symlink if fs::metadata(bare).is_ok_and(|m| m.is_dir()) => {
                decide::Kind::Dir
            }
            k => k,
        });
    match decide::root_at(existing, force) {
        // Nothing was changed: a usage error (exit 1), on either side.
        decide::RootAt::Refuse(why) => Err(Error::Usage(format!("{}: {why}", root.display()))),
        at => Ok(at),
    }
}

/// Make the tree's root a directory as `at` says; whether it had to be
/// created.
fn prepare_root(root: &Path, at: decide::RootAt) -> Result<bool> {
    match at {
        decide::RootAt::Use | decide::RootAt::Refuse(_) => Ok(false),
        decide::RootAt::Replace => fs::remove_file(fsutil::bare(root))
            .and_then(|_| fs::create_dir(root))
            .map(|_| false)
            .map_err(|err| Error::io_op("replace with a directory", root, err)),
        // Only a directory this run made counts as made (a failed run
        // removes it again): one that another run made meanwhile does not.
        decide::RootAt::Create => {
            let bare = fsutil::bare(root);
            if let Some(parent) = bare.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::create_dir_all(parent)
                    .map_err(|err| Error::io_op("create directory", parent, err))?;
            }
            match fs::create_dir(bare) {
                Ok(()) => Ok(true),
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                Err(err) => Err(Error::io_op("create directory", root, err)),
            }
        }
    }
}
