//! The walk: visits every source in name order, sends the file list
//! (directories, symlinks, hard links, files, NBD exports) and enters each
//! file the receiver may ask for in the table. What cannot be listed is
//! reported to the receiver as a warning and skipped.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_link::{Entry, EntryKind, Message, MsgTx};

use crate::endpoint::Source;
use crate::error::{describe, Error, Result};
use crate::fsutil;
use crate::listcheck::child_path;
use crate::plan::SourceSpec;
use crate::scan;
use crate::stats::Stats;
use crate::SyncOptions;

use super::credit::Credit;
use super::open::open_listed;
use super::{SrcFile, Table};

/// Walks every source and sends the file list.
pub(super) fn walk_all(
    sources: &[SourceSpec],
    opts: &SyncOptions,
    stats: &Stats,
    tx: &MsgTx,
    table: &Table,
    credit: &Credit,
) -> Result<()> {
    let mut w = Walker {
        opts,
        stats,
        tx,
        table,
        credit,
        next_id: 0,
        inodes: HashMap::new(),
        // Several sources can bring the same name (`a/ b/ dst`): the first
        // one is sent, as rsync keeps the first; directories merge.
        names: (sources.len() > 1).then(HashMap::new),
        namer: Default::default(),
        top_dev: 0,
        pending: Vec::new(),
        pending_files: Vec::new(),
        pending_since: None,
        warm: None,
        warm_base: Vec::new(),
        warm_cached: false,
    };
    for src in sources {
        let text = src.path.to_string_lossy();
        if crate::endpoint::Kind::of(&text) == crate::endpoint::Kind::Nbd {
            w.nbd(&text, src.name.clone())?;
            continue;
        }
        if let Some((archive, member)) = crate::endpoint::split_member(&text) {
            w.member(Path::new(archive), member, src.name.clone())?;
            continue;
        }
        let meta = if src.follow {
            std::fs::metadata(&src.path)
        } else {
            std::fs::symlink_metadata(&src.path)
        }
        .map_err(|e| Error::io_op("stat", &src.path, e))?;
        // A tree's inodes are read ahead of the walk (see crate::warm),
        // until one is found cached.
        w.warm = (meta.is_dir() && opts.recursive && !w.warm_cached)
            .then(|| warm_root(&src.path, src.follow, &meta))
            .flatten()
            .map(|fd| {
                let skip = warm_skip(opts.excludes.clone(), src.name.clone());
                crate::warm::Warmer::start(Arc::new(fd), crate::warm::THREADS, Some(skip))
            });
        w.warm_base = src.name.clone();
        w.visit(src.path.clone(), src.name.clone(), &meta, true)?;
        if let Some(warm) = w.warm.take() {
            w.warm_cached = warm.found_cached();
        }
    }
    w.flush()?;
    tx.send(Message::EndOfList)?;
    Ok(())
}

/// The source directory `path` as just `stat`ed (`meta`), opened for the
/// warmers: not if it has been swapped since.
fn warm_root(path: &Path, follow: bool, meta: &std::fs::Metadata) -> Option<std::os::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let mut flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = rustix::fs::open(path, flags, Mode::empty()).ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    #[allow(clippy::unnecessary_cast)]
    let same = st.st_dev as u64 == meta.dev() && st.st_ino as u64 == meta.ino();
    same.then_some(fd)
}

/// The directories of the tree listed as `base` that the walk skips
/// (excluded, or named as ferry's partial state), for its warmers.
fn warm_skip(excludes: crate::exclude::Excludes, base: Vec<u8>) -> crate::warm::Skip {
    Box::new(move |rel: &[u8]| {
        let name = rel.rsplit(|&b| b == b'/').next().unwrap_or(rel);
        let full = if base.is_empty() {
            rel.to_vec()
        } else {
            [base.as_slice(), b"/", rel].concat()
        };
        crate::journal::is_reserved(name)
            || excludes.excluded(Path::new(std::ffi::OsStr::from_bytes(&full)), true)
    })
}

/// Where `rel` (a path of the list) is in the tree listed as `base`.
fn within<'a>(base: &[u8], rel: &'a [u8]) -> Option<&'a [u8]> {
    if base.is_empty() {
        return Some(rel);
    }
    match rel.strip_prefix(base)? {
        [] => Some(&[]),
        [b'/', r @ ..] => Some(r),
        _ => None,
    }
}

/// Entries a walk hands to the link at once at most.
const BATCH: usize = 256;

/// How long an entry may wait in a batch for more: the receiver starts on
/// a file only once its entry arrives.
const HOLD: std::time::Duration = std::time::Duration::from_millis(5);

/// With several sources, whether the entry `rel` is sent, given `names`
/// (every name sent so far and whether it is a directory), which it joins
/// if so: the first of a name is kept, and a directory merges into a
/// directory of the same name.
fn claim_name(names: &mut HashMap<Vec<u8>, bool>, rel: &[u8], is_dir: bool) -> bool {
    match names.get(rel) {
        Some(true) if is_dir => true,
        Some(_) => false,
        None => {
            names.insert(rel.to_vec(), is_dir);
            true
        }
    }
}

/// Whether a non-directory, non-symlink entry is sent as a file: a regular
/// file, or a block device named as a source itself (never one found in a
/// directory). Anything else (fifos, sockets, character devices) is not.
fn sendable_as_file(is_file: bool, is_block_device: bool, top: bool) -> bool {
    is_file || (top && is_block_device)
}

/// Whether the extended attribute `name` is sent, as rsync splits them:
/// `-X` (`xattrs`) the attributes outside the `system.` namespace, `-A`
/// (`acls`) the POSIX ACLs (`system.posix_acl_*`); other `system.`
/// attributes never (the kernel derives them).
fn xattr_wanted(name: &[u8], xattrs: bool, acls: bool) -> bool {
    match name.strip_prefix(b"system.") {
        Some(rest) => acls && rest.starts_with(b"posix_acl_"),
        None => xattrs,
    }
}

/// Take the next entry id; the list holds at most `u32::MAX` entries.
fn take_id(next: &mut u32) -> Result<u32> {
    let id = *next;
    *next = next
        .checked_add(1)
        .ok_or_else(|| Error::Usage("more than 4 billion entries".into()))?;
    Ok(id)
}

struct Walker<'a> {
    opts: &'a SyncOptions,
    stats: &'a Stats,
    tx: &'a MsgTx,
    table: &'a Table,
    /// The receiver's decisions, which the list may not run far ahead of.
    credit: &'a Credit,
    next_id: u32,
    /// Files with more than one link, by device and inode: the id and
    /// path of the first listed, which later names link to.
    inodes: HashMap<(u64, u64), (u32, Vec<u8>)>,
    /// With several sources: every name sent and whether it is a directory.
    names: Option<HashMap<Vec<u8>, bool>>,
    /// Which owners and groups have been named to the receiver.
    namer: crate::ids::Namer,
    /// The filesystem of the source being walked (`-x` stays on it).
    top_dev: u64,
    /// Entries not handed to the link yet (see [`Walker::flush`]), and
    /// since when the first of them waits.
    pending: Vec<Message>,
    /// The files of those entries, entered in the table as they go: the
    /// receiver may ask only for what it was told of.
    pending_files: Vec<(u32, Arc<SrcFile>)>,
    pending_since: Option<std::time::Instant>,
    /// Warmers on the tree being walked, told of each entry visited.
    warm: Option<crate::warm::Warmer>,
    /// The name of the tree they warm in the list (a prefix of `rel`).
    warm_base: Vec<u8>,
    /// A tree was found cached: no warmers for the sources after it.
    warm_cached: bool,
}

impl Walker<'_> {
    /// Send `e`, naming its owner and group the first time each is listed
    /// (unless `--numeric-ids`).
    fn send(&mut self, mut e: Entry) -> Result<()> {
        if !self.opts.numeric_ids {
            use crate::ids::Which;
            e.owner = self.namer.name(Which::User, e.uid);
            e.group = self.namer.name(Which::Group, e.gid);
        }
        // At most a window ahead of what the receiver has decided on;
        // before waiting for room, what it has not got yet goes out.
        let fits = match self.credit.try_send(e.id) {
            Some(fits) => fits,
            None => {
                self.flush()?;
                self.credit.send(e.id)
            }
        };
        if !fits {
            return Err(Error::Protocol(
                "the receiver stopped taking the list".into(),
            ));
        }
        self.pending.push(Message::Entry(Box::new(e)));
        let since = *self
            .pending_since
            .get_or_insert_with(std::time::Instant::now);
        if self.pending.len() >= BATCH || since.elapsed() >= HOLD {
            self.flush()?;
        }
        Ok(())
    }

    /// Hand the entries gathered so far to the link: when a batch is full
    /// or old, and before anything that may take long (reading a
    /// directory or a file, waiting for the receiver) or any other message.
    fn flush(&mut self) -> Result<()> {
        self.pending_since = None;
        if !self.pending_files.is_empty() {
            if let Ok(mut t) = self.table.lock() {
                t.extend(self.pending_files.drain(..));
            }
            self.pending_files.clear();
        }
        if !self.pending.is_empty() {
            self.tx.send_batch(std::mem::take(&mut self.pending))?;
        }
        Ok(())
    }

    /// Report a source entry that cannot be sent. It travels to the
    /// receiver, which keeps the tally, so a remote sender's problems reach
    /// the side that prints.
    fn warn(&mut self, error: String) -> Result<()> {
        self.flush()?;
        self.tx.send(Message::FileFailed {
            file: ferry_link::NO_FILE,
            error,
        })?;
        Ok(())
    }

    fn visit(
        &mut self,
        path: PathBuf,
        rel: Vec<u8>,
        meta: &std::fs::Metadata,
        top: bool,
    ) -> Result<()> {
        let ft = meta.file_type();
        if let Some(w) = &self.warm {
            if let Some(r) = within(&self.warm_base, &rel) {
                w.at(r, ft.is_dir());
            }
        }
        if top {
            self.top_dev = meta.dev();
        }
        let name = rel.rsplit(|&b| b == b'/').next().unwrap_or(&rel);
        if !top
            && (self
                .opts
                .excludes
                .excluded(Path::new(std::ffi::OsStr::from_bytes(&rel)), ft.is_dir())
                || crate::journal::is_reserved(name))
        {
            // Excluded, or partial state of an interrupted run here.
            return Ok(());
        }
        if let Some(names) = &mut self.names {
            if !claim_name(names, &rel, ft.is_dir()) {
                self.stats.notice(format!(
                    "{}: another source has the same name; the first one is kept",
                    path.display()
                ));
                return Ok(());
            }
        }
        let id = take_id(&mut self.next_id)?;
        let is_root = rel.is_empty();
        let mut e = Entry {
            id,
            path: rel,
            kind: None,
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            size: 0,
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec() as u32,
            ..Default::default()
        };
        if !ft.is_symlink() && !self.opts.chmod.is_empty() {
            e.mode = self.opts.chmod.apply(e.mode, ft.is_dir());
        }
        // What rsync's -r and -l leave out when they are turned off.
        if ft.is_dir() && !self.opts.recursive {
            let name = if is_root {
                ".".into()
            } else {
                path.display().to_string()
            };
            self.stats.change_line(format!("skipping directory {name}"));
            return Ok(());
        }
        if ft.is_symlink() && !self.opts.symlinks {
            self.stats
                .change_line(format!("skipping non-regular file {}", path.display()));
            return Ok(());
        }
        if self.opts.xattrs || self.opts.acls {
            e.xattrs = fsutil::read_xattrs(&path).map_err(|err| Error::io(&path, err))?;
            e.xattrs
                .retain(|(k, _)| xattr_wanted(k, self.opts.xattrs, self.opts.acls));
        }
        if ft.is_dir() {
            e.kind = Some(EntryKind::Dir);
            let rel = e.path.clone();
            if !is_root || self.opts.list_root {
                self.send(e)?;
            }
            // -x: a mount point is listed, what is mounted there is not.
            if self.opts.one_file_system && meta.dev() != self.top_dev {
                return Ok(());
            }
            return self.visit_children(&path, &rel);
        }
        if ft.is_symlink() {
            e.kind = Some(EntryKind::Symlink);
            e.target = std::fs::read_link(&path)
                .map_err(|err| Error::io(&path, err))?
                .into_os_string()
                .as_bytes()
                .to_vec();
            self.send(e)?;
            return Ok(());
        }
        let node = ft.is_char_device() || ft.is_fifo() || ft.is_socket() || ft.is_block_device();
        // -D: a node as a node (a block device named as a source is read
        // as the image it holds).
        if self.opts.specials && node && !(top && ft.is_block_device()) {
            e.kind = Some(EntryKind::Special);
            e.rdev = meta.rdev();
            return self.send(e);
        }
        if !sendable_as_file(ft.is_file(), ft.is_block_device(), top) {
            self.stats
                .change_line(format!("skipping non-regular file {}", path.display()));
            return Ok(());
        }
        self.visit_file(path, meta, e, top)
    }

    /// The entries of the directory `path` (listed as `rel`), in name order.
    fn visit_children(&mut self, path: &Path, rel: &[u8]) -> Result<()> {
        self.flush()?;
        // Each name taken once: sorting by `DirEntry::file_name` would make
        // two copies for every comparison.
        let mut children: Vec<_> = match std::fs::read_dir(path) {
            Ok(rd) => rd
                .filter_map(|d| d.ok())
                .map(|d| (d.file_name(), d))
                .collect(),
            Err(err) => {
                self.warn(format!(
                    "list directory {}: {}",
                    path.display(),
                    describe(&err)
                ))?;
                return Ok(());
            }
        };
        // Names in a directory are unique: an unstable sort is exact.
        children.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (name, c) in children {
            let cp = c.path();
            // Without following a symlink, and relative to the directory
            // read (one name to look up, not the whole path).
            let m = match c.metadata() {
                Ok(m) => m,
                Err(err) => {
                    self.warn(format!("stat {}: {}", cp.display(), describe(&err)))?;
                    continue;
                }
            };
            self.visit(cp, child_path(rel, name.as_bytes()), &m, false)?;
        }
        Ok(())
    }

    /// A regular file (or a block device named as a source): a hard link
    /// to one listed before, or a file for the table, with its digest under
    /// `--checksum`.
    fn visit_file(
        &mut self,
        path: PathBuf,
        meta: &std::fs::Metadata,
        mut e: Entry,
        top: bool,
    ) -> Result<()> {
        let ft = meta.file_type();
        let ident = (meta.dev(), meta.ino());
        if self.opts.hard_links && meta.nlink() > 1 && ft.is_file() {
            if let Some((first, first_path)) = self.inodes.get(&ident) {
                e.kind = Some(EntryKind::HardLink);
                e.link_to = *first;
                // Version 10: the path too, so the receiver need not keep
                // every file's path in case a link names it.
                e.target = first_path.clone();
                self.send(e)?;
                return Ok(());
            }
        }
        // Later names of this inode link to this entry, once it is sent.
        let first_name = (self.opts.hard_links && meta.nlink() > 1 && ft.is_file())
            .then(|| (ident, (e.id, e.path.clone())));
        e.kind = Some(EntryKind::File);
        let size = if ft.is_block_device() {
            let f = open_listed(&path, ident, top)
                .map_err(|err| Error::io_op("open for reading", &path, err))?;
            fsutil::size_of(&f, meta).map_err(|err| Error::io(&path, err))?
        } else {
            meta.len()
        };
        e.size = size;
        if top && self.opts.sparsify {
            self.flush()?;
            let f = open_listed(&path, ident, top)
                .map_err(|err| Error::io_op("open for reading", &path, err))?;
            let mounted = crate::endpoint::looks_mounted(&f);
            let reader: Arc<dyn Source> =
                Arc::new(crate::direct::Reader::new(f, self.opts.direct_io));
            let mtime = (e.mtime, e.mtime_nsec);
            return self.send_image(&path, e, mtime, reader, mounted);
        }
        if self.opts.checksum && size > 0 {
            self.flush()?;
            match open_listed(&path, ident, top)
                .and_then(|f| scan::file_digest(&f, size, self.opts.threads))
            {
                Ok(d) => e.digest = Some(d),
                Err(err) => {
                    self.warn(format!("read {}: {}", path.display(), describe(&err)))?;
                    return Ok(());
                }
            }
        }
        let mut f = SrcFile::listed(path, size, (e.mtime, e.mtime_nsec), ident, top);
        // Fewer blocks than its size: it may have holes worth finding.
        f.holey = ft.is_file() && meta.blocks().saturating_mul(512) < size;
        f.dense = ft.is_file() && crate::direct::dense(meta.blocks(), size);
        f.device = ft.is_block_device();
        self.pending_files.push((e.id, Arc::new(f)));
        self.send(e)?;
        if let Some((ident, first)) = first_name {
            self.inodes.insert(ident, first);
        }
        Ok(())
    }

    /// An NBD export as a source file: its size from the server, "now" as
    /// its modification time (an export has none, so it is never taken as
    /// unchanged by size and time; `--checksum` compares contents).
    fn nbd(&mut self, uri: &str, name: Vec<u8>) -> Result<()> {
        self.flush()?;
        let src = crate::endpoint::NbdExport::connect(uri).map_err(|e| Error::io(uri, e))?;
        let size = src.size();
        let conns = src.connections() as u64;
        (self.stats.nbd_connections).fetch_max(conns, std::sync::atomic::Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let id = take_id(&mut self.next_id)?;
        let e = Entry {
            id,
            path: name,
            kind: Some(EntryKind::File),
            mode: 0o100644,
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            size,
            mtime: now.as_secs() as i64,
            mtime_nsec: now.subsec_nanos(),
            ..Default::default()
        };
        let reader: Arc<dyn Source> = Arc::new(src);
        let mtime = (e.mtime, e.mtime_nsec);
        self.send_image(Path::new(uri), e, mtime, reader, None)
    }

    /// A member of a tar archive (`vm.ova#disk.img`), read in place: the
    /// archive's owner, mode and time, the member's size.
    fn member(&mut self, archive: &Path, member: &str, name: Vec<u8>) -> Result<()> {
        self.flush()?;
        let f = crate::endpoint::open_archive(archive)?;
        let meta = f.metadata().map_err(|err| Error::io(archive, err))?;
        let reader: Arc<dyn Source> = Arc::new(crate::direct::Reader::new(f, self.opts.direct_io));
        let m = crate::endpoint::open_member(reader, archive, member)?;
        let size = m.len();
        let id = take_id(&mut self.next_id)?;
        let e = Entry {
            id,
            path: name,
            kind: Some(EntryKind::File),
            mode: libc::S_IFREG | (meta.mode() & 0o7777),
            uid: meta.uid(),
            gid: meta.gid(),
            size,
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec() as u32,
            ..Default::default()
        };
        let shown = format!("{}#{member}", archive.display());
        self.send_image(
            Path::new(&shown),
            e,
            (meta.mtime(), meta.mtime_nsec() as u32),
            Arc::new(m),
            None,
        )
    }

    /// A file read through a reader opened now and kept (an NBD export, a
    /// tar member, an image under `--sparsify`): mapped through its guest
    /// with `--sparsify`, digested with `--checksum`, entered in the table.
    fn send_image(
        &mut self,
        path: &Path,
        mut e: Entry,
        mtime: (i64, u32),
        mut reader: Arc<dyn Source>,
        mounted: Option<String>,
    ) -> Result<()> {
        self.flush()?;
        let size = e.size;
        if self.opts.sparsify {
            let shown = path.display().to_string();
            let (r, map) =
                crate::endpoint::sparsify(reader, size, &shown, self.opts.force, mounted)?;
            reader = r;
            if let Ok(mut n) = self.stats.notices.lock() {
                n.extend(
                    map.summary_lines()
                        .into_iter()
                        .map(|l| format!("{shown}: {l}")),
                );
            }
        }
        if self.opts.checksum && size > 0 {
            e.digest = Some(
                scan::file_digest(&*reader, size, self.opts.threads)
                    .map_err(|err| Error::io(path, err))?,
            );
        }
        let f = SrcFile::kept(path.to_path_buf(), size, mtime, reader);
        self.pending_files.push((e.id, Arc::new(f)));
        self.send(e)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warmers_skip_what_the_walk_skips() {
        let ex = crate::exclude::Excludes::new(&["node_modules/".to_string()]).unwrap();
        let skip = warm_skip(ex.clone(), b"src".to_vec());
        assert!(skip(b"a/node_modules"));
        assert!(!skip(b"a/b"));
        let skip = warm_skip(ex, Vec::new());
        assert!(skip(b"node_modules"));
        assert!(!skip(b"lib"));
    }

    #[test]
    fn a_path_of_the_list_is_found_in_the_tree_it_names() {
        assert_eq!(within(b"", b"a/b"), Some(&b"a/b"[..]));
        assert_eq!(within(b"src", b"src"), Some(&b""[..]));
        assert_eq!(within(b"src", b"src/a/b"), Some(&b"a/b"[..]));
        assert_eq!(within(b"src", b"srcx/a"), None);
        assert_eq!(within(b"src", b"other"), None);
    }

    #[test]
    fn dash_x_sends_no_acls_and_dash_a_only_acls() {
        let acl = b"system.posix_acl_access";
        let user = b"user.note";
        assert!(xattr_wanted(user, true, false) && !xattr_wanted(acl, true, false));
        assert!(xattr_wanted(acl, false, true) && !xattr_wanted(user, false, true));
        assert!(xattr_wanted(acl, true, true) && xattr_wanted(b"security.selinux", true, true));
        assert!(!xattr_wanted(b"system.nfs4_acl", true, true));
    }

    #[test]
    fn the_first_of_a_name_is_kept_and_directories_merge() {
        let mut names = HashMap::new();
        assert!(claim_name(&mut names, b"a", true));
        assert!(claim_name(&mut names, b"f", false));
        // Same name again: a directory merges into a directory...
        assert!(claim_name(&mut names, b"a", true));
        // ...but nothing else replaces or joins what came first.
        assert!(!claim_name(&mut names, b"a", false));
        assert!(!claim_name(&mut names, b"f", false));
        assert!(!claim_name(&mut names, b"f", true));
        // What was refused did not change what the name is.
        assert_eq!(names.get(&b"a"[..]), Some(&true));
        assert_eq!(names.get(&b"f"[..]), Some(&false));
        assert_eq!(names.len(), 2);
    }

    #[test]
    fn only_a_named_block_device_is_read_as_a_file() {
        assert!(sendable_as_file(true, false, false));
        assert!(sendable_as_file(true, false, true));
        assert!(sendable_as_file(false, true, true));
        assert!(!sendable_as_file(false, true, false));
        // Fifos, sockets, character devices.
        assert!(!sendable_as_file(false, false, true));
        assert!(!sendable_as_file(false, false, false));
    }

    #[test]
    fn entry_ids_run_out_at_u32_max() {
        let mut next = 0;
        assert_eq!(take_id(&mut next).unwrap(), 0);
        assert_eq!(take_id(&mut next).unwrap(), 1);
        assert_eq!(next, 2);
        let mut next = u32::MAX - 1;
        assert_eq!(take_id(&mut next).unwrap(), u32::MAX - 1);
        assert!(matches!(take_id(&mut next), Err(Error::Usage(_))));
    }
}
