use super::*;

/// The destination's warmers (see [`crate::warm`]): a re-run over a cold
/// cache `lstat`s every entry of the list. Started at the list's first
/// directory (a list of files alone warms nothing), stopped at its end.
pub(super) enum Warm {
    NotYet,
    On(crate::warm::Warmer),
    Off,
}

impl Dispatcher<'_, '_> {
    /// Tell the warmers where the list is, starting them at its first
    /// directory.
    fn warm_at(&mut self, e: &Entry) {
        let is_dir = e.kind() == EntryKind::Dir;
        if matches!(self.warm, Warm::NotYet) && is_dir {
            self.warm = match self.tree.dir(b"") {
                Ok(root) => Warm::On(crate::warm::Warmer::start(root, crate::warm::THREADS, None)),
                Err(_) => Warm::Off,
            };
        }
        if let Warm::On(w) = &self.warm {
            w.at(&e.path, is_dir);
        }
    }

    pub(super) fn entry(&mut self, mut e: Entry) -> Result<()> {
        // On a pull, only what was asked for; then the path is checked
        // (with the rest of the list's rules) once the first entry of a
        // file-or-directory destination has chosen which.
        self.check
            .top_ok(&e.path)
            .map_err(|r| Error::Protocol(r.to_string()))?;
        self.root_at_first_entry(&mut e)?;
        self.check
            .admit(&e)
            .map_err(|r| Error::Protocol(r.to_string()))?;
        self.subtree(&e.path, e.kind() == EntryKind::Dir)?;
        self.warm_at(&e);
        if !self.sh.opts.meta_xattrs() {
            // Not asked for: not kept (a directory's entry lives until the
            // end of the session).
            e.xattrs = Vec::new();
        }
        if self.sh.opts.untrusted_sender {
            decide::defang(&mut e);
        }
        if !self.sh.opts.numeric_ids {
            use crate::ids::Which;
            e.uid = self.ids.map(Which::User, e.uid, &e.owner);
            e.gid = self.ids.map(Which::Group, e.gid, &e.group);
        }
        if let Some(u) = self.chown.0 {
            e.uid = u;
        }
        if let Some(g) = self.chown.1 {
            e.gid = g;
        }
        if let Some(uri) = self.nbd.clone() {
            return self.nbd_entry(e, &uri);
        }
        let stats = self.sh.stats;
        if e.kind() == EntryKind::Dir {
            Stats::add(&stats.dirs_total, 1);
        } else {
            Stats::add(&stats.files_total, 1);
        }
        if e.kind() == EntryKind::File {
            Stats::add(&stats.bytes_total, e.size);
        }
        if !self.dirs_ok.contains(parent_of(&e.path)) {
            stats.error(format!(
                "{}: skipped: its directory could not be made at the destination",
                shown(&e.path)
            ));
            self.skipped.insert(&e.path);
            return Ok(());
        }
        let name = e.path.rsplit(|&b| b == b'/').next().unwrap_or(&e.path);
        if crate::journal::is_reserved(name) {
            stats.error(format!(
                "{}: skipped: the name is reserved for ferry's partial files",
                shown(&e.path)
            ));
            self.skipped.insert(&e.path);
            return Ok(());
        }
        if self.sh.opts.delete {
            self.seen.insert(&e.path);
        }
        if e.kind() == EntryKind::File
            && self.budget.must_wait(self.waiting.len(), self.open_files())
        {
            self.waiting.push_back(e);
            return Ok(());
        }
        if e.kind() == EntryKind::HardLink {
            self.links.push(e);
            return Ok(());
        }
        let l = match self.tree.loc(&e.path, self.sh.opts.dry_run) {
            Ok(l) => l,
            Err(err) => return self.outcome(Err(err), &self.tree.show(&e.path)),
        };
        let res = match e.kind() {
            EntryKind::Dir => self.dir(e, &l),
            EntryKind::Symlink => self.symlink(&e, &l),
            EntryKind::Special => self.special(&e, &l),
            _ => self.file(e, &l),
        };
        self.outcome(res, &l.shown)
    }

    /// The one entry of a session whose destination is an NBD export.
    pub(super) fn nbd_entry(&mut self, e: Entry, uri: &str) -> Result<()> {
        let stats = self.sh.stats;
        Stats::add(&stats.files_total, 1);
        if !decide::nbd_entry_ok(e.kind(), e.id) {
            return Err(Error::Usage(format!(
                "{uri}: an NBD destination takes exactly one file"
            )));
        }
        Stats::add(&stats.bytes_total, e.size);
        Stats::add(&stats.bytes_transferred, e.size);
        stats.change_line(format!("write {} to {uri}", shown(&e.path)));
        if self.sh.opts.dry_run {
            Stats::add(&stats.files_transferred, 1);
            return Ok(());
        }
        self.nbd_open(e, uri)
    }

    /// Connect to the export and ask for the file: resumed from the
    /// journal in `--partial-dir`, or whole (always whole when a resume
    /// failed verification and the file is asked for again).
    pub(super) fn nbd_open(&mut self, e: Entry, uri: &str) -> Result<()> {
        let stats = self.sh.stats;
        let sink = NbdExport::connect(uri).map_err(|err| Error::io(uri, err))?;
        stats
            .nbd_connections
            .fetch_max(sink.connections() as u64, Ordering::Relaxed);
        if let Some(why) = decide::nbd_refusal(sink.read_only(), sink.size(), e.size) {
            return Err(Error::io(uri, io::Error::other(why)));
        }
        let loc = Loc::shown_only(PathBuf::from(uri));
        let whole_only = self.whole_only.contains(&e.id);
        // An export is written in place like a device: with --partial-dir
        // its journal is kept there, and a run cut off resumes.
        let opts = self.sh.opts;
        let journal = match &opts.partial_dir {
            Some(dir)
                if decide::device_journal(
                    decide::Write::Device,
                    opts.partial,
                    whole_only,
                    e.size,
                ) =>
            {
                self.open_device_journal(&e, &loc, dir)
            }
            _ => None,
        };
        let resumed = journal.as_ref().is_some_and(|p| p.resumed);
        let nseg = layout::segment_count(e.size);
        let id = e.id;
        let d = Arc::new(DstFile {
            delta_slot: Mutex::new(resumed.then(|| DeltaSlot::take(&self.sh.in_flight))),
            partial: journal,
            _slot: Slot::take(&self.sh.in_flight),
            basis: None,
            basis_blocks: Default::default(),
            // With --verify the sender hashes even in process.
            verify: decide::verify_segments(resumed, opts.in_process, opts.verify),
            readback: None,
            left: Default::default(),
            delta: AtomicBool::new(false),
            delta_cost: 0.0,
            sig_out: None,
            block: AtomicU64::new(decide::digest_block(false, e.size)),
            nseg,
            remaining: AtomicU64::new(nseg),
            failed: Mutex::new(None),
            loc,
            tmp: None,
            batch_fs: None,
            file: Box::new(sink),
            direct: None,
            direct_ok: AtomicBool::new(false),
            is_device: true,
            stream_to: false,
            reported: AtomicBool::new(false),
            committed: AtomicBool::new(false),
            entry: e,
        });
        if nseg == 0 {
            return finalize(&d, self.sh).map_err(|err| Error::io(uri, err));
        }
        self.files.insert(id, d.clone());
        if resumed {
            let dest = d.loc.shown.clone();
            if let Err(err) = self.sign(SignJob::Resume { d, dest }) {
                self.files.remove(&id);
                return Err(Error::io(uri, err));
            }
            return Ok(());
        }
        self.tx.send(Message::Want {
            file: id,
            mode: WantMode::Whole,
        })?;
        Ok(())
    }

    /// What `dest` holds (`None`: nothing), as plain facts.
    pub(super) fn stat(dest: &Loc) -> io::Result<Option<decide::Stat>> {
        Ok(dest.lstat()?.as_ref().map(decide::Stat::of_raw))
    }

    pub(super) fn dir(&mut self, mut e: Entry, dest: &Loc) -> io::Result<()> {
        let old = Self::stat(dest)?;
        let kind = old.map(|s| s.kind);
        if !self.sh.opts.perms {
            let had = old.filter(|o| o.kind == decide::Kind::Dir).map(|o| o.mode);
            e.mode = decide::mode_without_perms(e.mode, had, self.umask);
            if self.sh.opts.untrusted_sender {
                // The old copy's set-ID bits are not the client's to keep.
                decide::defang(&mut e);
            }
        }
        let at = decide::dir_at(kind);
        // The root this run made is listed as made, as rsync lists it.
        let made = e.path.is_empty() && self.root_created;
        if made {
            let code = itemize::code(Update::Local, ItemKind::Dir, true, Attrs::default());
            self.sh.item(code, &e.path, true, b"");
        } else if let (decide::DirAt::Keep, Some(old)) = (at, old) {
            let a = decide::differs(&e, &old, self.sh.keep);
            if a.any() {
                let code = itemize::code(Update::Meta, ItemKind::Dir, false, a);
                self.sh.item(code, &e.path, true, b"");
            }
        }
        if at != decide::DirAt::Keep {
            if let (decide::DirAt::ClearThenCreate, Some(k)) = (at, kind) {
                if decide::leave_existing(&self.sh.opts.skip, kind) {
                    // rsync leaves it too, and what was to go in it fails.
                    return Err(io::Error::other(
                        "not a directory, left alone (--ignore-existing)",
                    ));
                }
                self.clear(dest, k)?;
            }
            let code = itemize::code(Update::Local, ItemKind::Dir, true, Attrs::default());
            self.sh.item(code, &e.path, true, b"");
            if !self.sh.opts.dry_run {
                dest.mkdir(0o700 | (e.mode & 0o777))
                    .op("create directory")?;
                self.sh.changed(dest);
            }
        }
        self.dirs_ok.insert(&e.path);
        // A directory sent again (two sources merging) is handled once.
        if self.dirs_queued.insert(e.path.clone()) {
            self.dirs.push(e);
        }
        Ok(())
    }

    pub(super) fn file(&mut self, mut e: Entry, dest: &Loc) -> io::Result<()> {
        let opts = self.sh.opts;
        let old = Self::stat(dest)?;
        if !opts.perms {
            let had = old.filter(|o| o.kind == decide::Kind::File).map(|o| o.mode);
            e.mode = decide::mode_without_perms(e.mode, had, self.umask);
            if self.sh.opts.untrusted_sender {
                // The old copy's set-ID bits are not the client's to keep.
                decide::defang(&mut e);
            }
        }
        if decide::leave_alone(&opts.skip, e.size, (e.mtime, e.mtime_nsec), old.as_ref()) {
            if opts.hard_links {
                let facts = (e.size, (e.mtime, e.mtime_nsec));
                self.left_alone.insert(&e.path, facts);
            }
            return Ok(());
        }
        if old.is_none() && self.link_from_earlier(&e, dest)? {
            return Ok(());
        }
        let at = decide::file_at(old.map(|s| s.kind));
        let mut old_meta = None;
        match (at, old) {
            (decide::FileAt::Dir, _) => self.clear(dest, decide::Kind::Dir)?,
            (decide::FileAt::Regular, Some(old)) => {
                if self.unchanged(&e, dest, &old)? {
                    return self.keep_old(&e, dest, &old);
                }
                // Changed: the old copy's full metadata, for what follows
                // (an unchanged file costs only the one `lstat`).
                old_meta = dest.stat()?;
            }
            _ => {}
        }
        // A file asked for again whole was listed and counted the first time.
        let whole_only = self.whole_only.contains(&e.id);
        if let (decide::FileAt::Regular, Some(o)) = (at, old) {
            let write = decide::write_method(at, opts.inplace);
            let (sizes, mode) = ((e.size, o.size), opts.delta);
            let (checksum, dry) = (opts.checksum, opts.dry_run);
            if decide::check_first(write, sizes, whole_only, mode, checksum, dry) {
                match self.start_check(e, dest, o)? {
                    None => return Ok(()),
                    Some(back) => e = back,
                }
            }
        }
        self.transfer(e, dest, at, old, old_meta, whole_only, false)
    }

    /// Ask for the changed file `e` (or, `asked`, take the data of a check
    /// that found it differs: see [`super::check`]) and open what it is
    /// written to. `old`, `old_meta`: what is at `dest` now.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn transfer(
        &mut self,
        e: Entry,
        dest: &Loc,
        at: decide::FileAt,
        old: Option<decide::Stat>,
        old_meta: Option<fs::Metadata>,
        whole_only: bool,
        asked: bool,
    ) -> io::Result<()> {
        let opts = self.sh.opts;
        let stats = self.sh.stats;
        if !whole_only {
            let (new, a) = match (at, old) {
                (decide::FileAt::Regular, Some(o)) => {
                    let a = decide::differs(&e, &o, self.sh.keep);
                    let checksum = opts.checksum && !a.size;
                    (false, Attrs { checksum, ..a })
                }
                // A device or a pipe is written, not replaced.
                (decide::FileAt::BlockDevice | decide::FileAt::Stream, _) => {
                    (false, Attrs::default())
                }
                _ => (true, Attrs::default()),
            };
            let code = itemize::code(Update::Received, ItemKind::File, new, a);
            self.sh.item(code, &e.path, false, b"");
            Stats::add(&stats.bytes_transferred, e.size);
        }
        if opts.dry_run {
            Stats::add(&stats.files_transferred, 1);
            return Ok(());
        }
        let write = decide::write_method(at, opts.inplace);
        let inplace = matches!(write, decide::Write::Device | decide::Write::InPlace);
        if write == decide::Write::Temp && !opts.partial {
            self.drop_partial(dest);
        }
        let delta_cost = match &old_meta {
            Some(m) if decide::delta_possible(write, e.size, Some(m.len())) => {
                self.delta_cost(&e, m, &dest.shown)
            }
            _ => None,
        };
        let mut delta =
            !asked && decide::choose_delta(whole_only, delta_cost, delta_saving(self.sh));
        // A delta moves only what changed against the old copy; a resume
        // sends whole every segment the partial file lacks. When a delta
        // is chosen, the partial file starts over as its temporary file.
        let partial = decide::use_partial(write, opts.partial, whole_only || asked, e.size)
            .then(|| self.open_partial(&e, dest, !delta))
            .flatten();
        let device_journal = match &opts.partial_dir {
            Some(dir)
                if decide::device_journal(write, opts.partial, whole_only || asked, e.size) =>
            {
                self.open_device_journal(&e, dest, dir)
            }
            _ => None,
        };
        let resumed = partial.as_ref().is_some_and(|(_, _, p)| p.resumed)
            || device_journal.as_ref().is_some_and(|p| p.resumed);
        delta &= !resumed;
        // The old copy is opened before any temp file exists, so failing
        // to open it leaves nothing behind. It is read through the page
        // cache: signing it leaves it there for the copies, which would
        // otherwise read it from the disk a second time (measured on the
        // 1 GiB mangled file: 3.9-4.5 s buffered, 5.1-8.2 s direct).
        let old_copy = match (delta, inplace) {
            (true, false) => Some(dest.open(false).op("open old copy of")?),
            _ => None,
        };
        let (file, tmp, partial) = match partial {
            Some((file, tmp, p)) => (file, Some(tmp), Some(p)),
            None => {
                let (file, tmp) = self.open_target(write, &e, dest)?;
                (file, tmp, device_journal)
            }
        };
        // A temporary file made now (not a partial file): its directory
        // was visited at the first temporary file made there. (Only the
        // choice of batch commit is taken from that visit, never what
        // makes the file durable: the batch's `syncfs` goes to each file's
        // own filesystem, see [`super::commit`].)
        let batch_fs = match (&tmp, &partial) {
            (Some(_), None) => self.scanned.get(parent_of(&dest.rel)).copied().flatten(),
            _ => None,
        };
        let direct = if decide::use_direct(write, opts.direct_io, e.size) {
            direct::open(&file)
        } else {
            None
        };
        let nseg = layout::segment_count(e.size);
        let id = e.id;
        let basis = match (delta, old_copy) {
            (false, _) => None,
            (true, Some(old)) => Some(direct::Reader::new(old, false)),
            // In place the old copy is the file being written.
            (true, None) => Some(direct::Reader::new(file.try_clone()?, false)),
        };
        let file: Box<dyn Sink> = Box::new(file);
        // A signature kept for the cache grows with the file.
        let sig_out = self
            .sh
            .cache
            .as_ref()
            .filter(|_| decide::keep_signature(nseg))
            .map(|c| SigOut {
                cache: c.clone(),
                bs: layout::delta_block(e.size),
                parts: Mutex::new(vec![None; nseg as usize]),
            });
        let d = Arc::new(DstFile {
            delta_slot: Mutex::new((delta || resumed).then(|| DeltaSlot::take(&self.sh.in_flight))),
            partial,
            _slot: Slot::take(&self.sh.in_flight),
            basis,
            basis_blocks: Default::default(),
            // A check's data comes with the real digest, even in process.
            verify: decide::verify_segments(
                delta || resumed || asked,
                opts.in_process,
                opts.verify,
            ),
            readback: opts.verify.then(|| Mutex::new(Vec::new())),
            left: Default::default(),
            delta: AtomicBool::new(delta),
            delta_cost: delta_cost.unwrap_or(0.0),
            sig_out,
            block: AtomicU64::new(decide::digest_block(delta, e.size)),
            nseg,
            remaining: AtomicU64::new(nseg),
            failed: Mutex::new(None),
            loc: dest.clone(),
            tmp,
            batch_fs,
            file,
            direct_ok: AtomicBool::new(direct.is_some()),
            direct,
            is_device: write == decide::Write::Device,
            stream_to: write == decide::Write::Stream,
            reported: AtomicBool::new(false),
            committed: AtomicBool::new(false),
            entry: e,
        });
        if let Some(p) = &d.partial {
            super::live::watch(p.live, &d);
        }
        if nseg == 0 {
            // Empty file: nothing to ask for.
            return finalize(&d, self.sh);
        }
        self.files.insert(id, d.clone());
        let link = |err: ferry_link::LinkError| io::Error::other(err.to_string());
        if resumed {
            // Re-hashing the partial file reads what it holds: the signer
            // thread does that too.
            let job = SignJob::Resume {
                d,
                dest: dest.shown.clone(),
            };
            if let Err(err) = self.sign(job) {
                self.files.remove(&id);
                return Err(err);
            }
            return Ok(());
        }
        match old_meta {
            // A check's data is on its way: nothing to ask for.
            _ if asked => {}
            Some(meta) if d.basis.is_some() => {
                // Signing the old copy reads all of it: the signer thread
                // does that, so this thread keeps routing data meanwhile.
                let job = SignJob::Sign {
                    d,
                    meta: Box::new(meta),
                    dest: dest.shown.clone(),
                    inplace,
                };
                if let Err(err) = self.sign(job) {
                    // Nothing will sign it: it must not hold up the run.
                    self.files.remove(&id);
                    return Err(err);
                }
            }
            _ => self
                .tx
                .send(Message::Want {
                    file: id,
                    mode: decide::want_mode(false, inplace),
                })
                .map_err(link)?,
        }
        Ok(())
    }

    /// Open what a changed file's bytes are written to (see
    /// [`decide::Write`]), and the temporary file to rename, if any.
    fn open_target(
        &mut self,
        write: decide::Write,
        e: &Entry,
        dest: &Loc,
    ) -> io::Result<(File, Option<Loc>)> {
        match write {
            decide::Write::Device => {
                let f = dest.open_write_only().op("open device")?;
                let dev_size = fsutil::size_of(&f, &f.metadata()?)?;
                if let Some(why) = decide::device_refusal(dev_size, e.size) {
                    return Err(io::Error::other(why));
                }
                Ok((f, None))
            }
            decide::Write::Stream => {
                // Sized first: zeros and holes are written without growing
                // the file, so a source ending in them would read back short.
                let f = tempfile::tempfile().op("create temporary file for")?;
                f.set_len(e.size).op("allocate")?;
                Ok((f, None))
            }
            decide::Write::InPlace => Ok((dest.open(true).op("open for writing")?, None)),
            decide::Write::Temp => {
                self.clean_stale_temps(dest);
                let tmp = dest.sibling(&fsutil::temp_name_for(dest.name()));
                let f = tmp.create_new(0o600).op("create temporary file for")?;
                tmp.register_temp();
                if let Err(err) = f.set_len(e.size).op("allocate") {
                    let _ = tmp.remove_file();
                    tmp.unregister_temp();
                    return Err(err);
                }
                Ok((f, Some(tmp)))
            }
        }
    }

    /// Before the first temporary file of this run in a directory, remove
    /// what killed runs left there (the files they were writing are
    /// written again now, so this is where their temporary files are).
    /// At the same first visit, learn whether the directory's filesystem
    /// takes batch commits (see [`DstFile::batch_fs`]).
    pub(super) fn clean_stale_temps(&mut self, dest: &Loc) {
        let dir = parent_of(&dest.rel);
        if self.scanned.contains_key(dir) {
            return;
        }
        let parent = dest.parent_fd().ok();
        let batch = parent.and_then(|d| rustix::fs::fstatfs(d).ok());
        let batch = batch.map(|s| decide::batch_fs(s.f_type as u64));
        self.scanned.insert(dir.to_vec(), batch);
        let n = parent.map_or(0, fsutil::remove_stale_temps);
        if n > 0 {
            self.sh.changed(dest);
            self.sh.stats.notice(format!(
                "{}: removed {n} temporary file(s) of an interrupted run",
                self.tree.show(dir).display()
            ));
        }
    }

    /// Whether to send this changed file as a delta, and at what cost
    /// (see [`decide::delta_policy`] and [`decide::delta_cost`]): across a
    /// link, reading the old copy (skipped when its signature is cached)
    /// against sending the file whole at the link rate measured so far.
    pub(super) fn delta_cost(&self, e: &Entry, m: &fs::Metadata, dest: &Path) -> Option<f64> {
        let opts = self.sh.opts;
        match decide::delta_policy(opts.delta, opts.in_process, e.size) {
            decide::DeltaPolicy::Always => return Some(0.0),
            decide::DeltaPolicy::Never => return None,
            decide::DeltaPolicy::Weigh => {}
        }
        let secs = self.started.elapsed().as_secs_f64();
        let rate = decide::link_rate(self.received.get(), secs, opts.bwlimit);
        let cached = self.sh.cache.as_ref().is_some_and(|c| {
            c.get(&cache_key(dest, m, layout::delta_block(e.size)))
                .is_some()
        });
        Some(decide::delta_cost(e.size, m.len(), rate, cached))
    }

    /// Is the regular file `old` at `dest` unchanged (see
    /// [`decide::quick_check`])? With `--checksum` its contents are read.
    pub(super) fn unchanged(&self, e: &Entry, dest: &Loc, old: &decide::Stat) -> io::Result<bool> {
        match decide::quick_check(e, old, self.sh.opts.checksum) {
            decide::QuickCheck::Unchanged => Ok(true),
            decide::QuickCheck::Changed => Ok(false),
            decide::QuickCheck::CompareDigest(want) => {
                let f = dest.open(false)?;
                Ok(crate::scan::file_digest(&f, e.size, self.sh.opts.threads)? == want)
            }
        }
    }

    /// The file at `dest` has the source's contents: list what differs
    /// of its metadata, and set that.
    pub(super) fn keep_old(&self, e: &Entry, dest: &Loc, old: &decide::Stat) -> io::Result<()> {
        let a = decide::differs(e, old, self.sh.keep);
        if a.any() {
            let code = itemize::code(Update::Meta, ItemKind::File, false, a);
            self.sh.item(code, &e.path, false, b"");
        }
        if self.sh.opts.dry_run {
            return Ok(());
        }
        self.fix_meta(e, dest, old)
    }

    /// Bring an unchanged file's metadata in line with the source.
    pub(super) fn fix_meta(&self, e: &Entry, dest: &Loc, old: &decide::Stat) -> io::Result<()> {
        let opts = self.sh.opts;
        let steps = decide::meta_fixes(e, old, self.sh.keep, opts.meta_xattrs());
        // Owner first: chown clears set-user-ID and set-group-ID bits.
        if steps.owner {
            let (u, g) = self.sh.keep.ids(e);
            dest.chown(u, g).op("set owner of")?;
        }
        if steps.mode {
            dest.chmod(e.mode).op("set permissions of")?;
        }
        if steps.mtime {
            dest.set_mtime(e.mtime, e.mtime_nsec).op("set mtime of")?;
        }
        if steps.xattrs {
            dest.write_xattrs(&e.xattrs, &|n| opts.xattr_scope(n))
                .op("set xattrs of")?;
        }
        Ok(())
    }
}
