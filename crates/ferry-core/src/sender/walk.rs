//! The walk: visits every source in name order, sends the file list
//! (directories, symlinks, hard links, files, NBD exports) and enters each
//! file the receiver may ask for in the table. What cannot be listed is
//! reported to the receiver as a warning and skipped.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
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
use super::open::{open_listed, Reach};
use super::rules::{claim_name, sendable_as_file, take_id, warm_skip, within, xattr_wanted};
use super::tree::{self, DirAt, Meta};
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
        base: Vec::new(),
        root: None,
        follow_top: false,
        depth: 0,
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
        let meta = match tree::stat_named(&src.path, src.follow) {
            Ok(m) => m,
            // One source of several that cannot be looked at is one error
            // line, as in rsync: the others are sent, `--delete` is off.
            Err(e) if sources.len() > 1 => {
                let line = format!("{}: stat: {}", src.path.display(), describe(&e));
                w.warn(line)?;
                continue;
            }
            Err(e) => return Err(Error::io_op("stat", &src.path, e)),
        };
        if meta.is_dir() {
            w.check_listed(&src.path)?;
        }
        w.base = src.name.clone();
        w.root = None;
        w.follow_top = src.follow;
        w.visit(None, src.path.clone(), src.name.clone(), &meta, true)?;
        if let Some(warm) = w.warm.take() {
            w.warm_cached = warm.found_cached();
        }
    }
    w.flush()?;
    tx.send(Message::EndOfList)?;
    Ok(())
}

/// Directories within directories the walk enters at most, as far as a
/// path fits in `PATH_MAX` with one-letter names; deeper ones are reported
/// and skipped (a tree a user made that deep would otherwise exhaust the
/// stack, and a daemon's sessions with it).
pub(super) const MAX_DEPTH: usize = 2048;
/// The walk thread's stack: room for [`MAX_DEPTH`] levels of its recursion
/// many times over (only what is touched is ever allocated).
pub(super) const STACK: usize = 64 << 20;

/// Entries a walk hands to the link at once at most.
const BATCH: usize = 256;

/// How long an entry may wait in a batch for more: the receiver starts on
/// a file only once its entry arrives.
const HOLD: std::time::Duration = std::time::Duration::from_millis(5);

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
    /// The name of the tree being walked in the list (a prefix of `rel`).
    base: Vec<u8>,
    /// The handle of its top directory, which its files are opened below.
    root: Option<Arc<OwnedFd>>,
    /// Its top was named through a symlink the user chose: followed.
    follow_top: bool,
    /// Directories entered and not left yet.
    depth: usize,
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

    /// `--files-from`: each listed path that is not under the source
    /// directory `top` is an error line, before any of the list goes (the
    /// receiver then deletes nothing), as rsync reports it.
    fn check_listed(&mut self, top: &Path) -> Result<()> {
        let opts = self.opts;
        for rel in &opts.listed {
            if let Err(e) = tree::stat_named(&top.join(rel), false) {
                self.warn(format!("{rel}: listed by --files-from: {}", describe(&e)))?;
            }
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

    /// The entry `meta` at `path`, listed as `rel`: a source the user
    /// named (`top`), or the entry named in the directory `at` is open as.
    fn visit(
        &mut self,
        at: Option<(&OwnedFd, &OsStr)>,
        path: PathBuf,
        rel: Vec<u8>,
        meta: &Meta,
        top: bool,
    ) -> Result<()> {
        let ft = meta;
        if let Some(w) = &self.warm {
            if let Some(r) = within(&self.base, &rel) {
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
            mtime: meta.mtime().0,
            mtime_nsec: meta.mtime().1,
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
            let got = match at {
                Some((dir, name)) => tree::xattrs_at(dir, name, meta, &path),
                None => fsutil::read_xattrs(&path),
            };
            e.xattrs = match got {
                Ok(x) => x,
                Err(err) => {
                    let shown = path.display();
                    let why = describe(&err);
                    return self.warn(format!("read extended attributes of {shown}: {why}"));
                }
            };
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
            return self.enter(at, &path, &rel, meta, top);
        }
        if ft.is_symlink() {
            e.kind = Some(EntryKind::Symlink);
            e.target = match at {
                Some((dir, name)) => tree::read_link_at(dir, name),
                None => std::fs::read_link(&path).map(|t| t.into_os_string().into_vec()),
            }
            .map_err(|err| Error::io(&path, err))?;
            self.send(e)?;
            return Ok(());
        }
        let node = ft.is_node();
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

    /// Open the directory `meta` at `path` (listed as `rel`) and visit its
    /// entries in name order. The top of a tree becomes the handle its
    /// files are opened below, and its warmers' (see [`crate::warm`]; until
    /// a tree is found cached).
    fn enter(
        &mut self,
        at: Option<(&OwnedFd, &OsStr)>,
        path: &Path,
        rel: &[u8],
        meta: &Meta,
        top: bool,
    ) -> Result<()> {
        self.flush()?;
        if self.depth >= MAX_DEPTH {
            let shown = path.display();
            return self.warn(format!(
                "list directory {shown}: nested more than {MAX_DEPTH} directories deep"
            ));
        }
        let how = match at {
            Some((dir, name)) => DirAt::In { dir, name },
            None => DirAt::Named {
                path,
                follow: self.follow_top,
            },
        };
        let dir = match tree::open_dir(how, meta) {
            Ok(dir) => dir,
            Err(err) => {
                let shown = path.display();
                return self.warn(format!("list directory {shown}: {}", describe(&err)));
            }
        };
        if !top {
            self.depth += 1;
            let r = self.visit_children(&dir, path, rel);
            self.depth -= 1;
            return r;
        }
        let root = Arc::new(dir);
        self.root = Some(root.clone());
        if !self.warm_cached {
            let skip = warm_skip(self.opts.excludes.clone(), self.base.clone());
            let warm = crate::warm::Warmer::start(root.clone(), crate::warm::THREADS, Some(skip));
            warm.at(&[], true);
            self.warm = Some(warm);
        }
        self.visit_children(&root, path, rel)
    }

    /// The entries of the open directory `dir` at `path` (listed as
    /// `rel`), in name order.
    fn visit_children(&mut self, dir: &OwnedFd, path: &Path, rel: &[u8]) -> Result<()> {
        let names = match tree::names(dir) {
            Ok(names) => names,
            Err(err) => {
                let shown = path.display();
                return self.warn(format!("list directory {shown}: {}", describe(&err)));
            }
        };
        for name in names {
            let cp = path.join(&name);
            // Without following a symlink, and relative to the directory
            // read (one name to look up, not the whole path).
            let m = match tree::stat_at(dir, &name) {
                Ok(m) => m,
                Err(err) => {
                    self.warn(format!("stat {}: {}", cp.display(), describe(&err)))?;
                    continue;
                }
            };
            self.visit(
                Some((dir, &name)),
                cp,
                child_path(rel, name.as_bytes()),
                &m,
                false,
            )?;
        }
        Ok(())
    }

    /// A regular file (or a block device named as a source): a hard link
    /// to one listed before, or a file for the table, with its digest under
    /// `--checksum`.
    fn visit_file(&mut self, path: PathBuf, meta: &Meta, mut e: Entry, top: bool) -> Result<()> {
        let ft = meta;
        let ident = meta.ident();
        // A named source by its path; a file of a tree below its handle.
        let reach = match (&self.root, within(&self.base, &e.path)) {
            (Some(root), Some(rel)) if !top => Reach::Beneath {
                root: root.clone(),
                rel: rel.to_vec(),
            },
            // Lstat'ed unless named through a symlink the user chose.
            _ => Reach::Named {
                follow: top && self.follow_top,
            },
        };
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
            let f = open_listed(&path, &reach, ident)
                .map_err(|err| Error::io_op("open for reading", &path, err))?;
            rustix::fs::seek(&f, rustix::fs::SeekFrom::End(0))
                .map_err(|err| Error::io(&path, err.into()))?
        } else {
            meta.len()
        };
        e.size = size;
        if top && self.opts.sparsify {
            self.flush()?;
            let f = open_listed(&path, &reach, ident)
                .map_err(|err| Error::io_op("open for reading", &path, err))?;
            let mounted = crate::endpoint::looks_mounted(&f);
            let reader: Arc<dyn Source> =
                Arc::new(crate::direct::Reader::new(f, self.opts.direct_io));
            let mtime = (e.mtime, e.mtime_nsec);
            return self.send_image(&path, e, mtime, reader, mounted);
        }
        if self.opts.checksum && size > 0 {
            self.flush()?;
            match open_listed(&path, &reach, ident)
                .and_then(|f| scan::file_digest(&f, size, self.opts.threads))
            {
                Ok(d) => e.digest = Some(d),
                Err(err) => {
                    self.warn(format!("read {}: {}", path.display(), describe(&err)))?;
                    return Ok(());
                }
            }
        }
        let mut f = SrcFile::listed(path, size, (e.mtime, e.mtime_nsec), ident, reach);
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
