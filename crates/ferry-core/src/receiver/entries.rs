use super::*;

impl Dispatcher<'_, '_> {
    pub(super) fn entry(&mut self, mut e: Entry) -> Result<()> {
        // On a pull, only what was asked for; then the path is checked
        // (with the rest of the list's rules) once the first entry of a
        // file-or-directory destination has chosen which.
        self.check
            .top_ok(&e.path)
            .map_err(|r| Error::Protocol(r.to_string()))?;
        if let Some(p) = self.late.take() {
            self.resolve_root(&p, &mut e)?;
            if e.kind() != EntryKind::Dir {
                self.check.set_shape(Shape::SingleFile);
            }
        }
        self.check
            .admit(&e)
            .map_err(|r| Error::Protocol(r.to_string()))?;
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
            return Ok(());
        }
        self.seen.insert(e.path.clone());
        let shown = self.tree.show(&e.path);
        if e.kind() == EntryKind::File {
            self.paths.insert(e.id, e.path.clone());
            if !self.waiting.is_empty() || self.open_files() >= self.max_in_flight {
                self.waiting.push_back(e);
                return Ok(());
            }
        }
        if e.kind() == EntryKind::HardLink {
            self.links.push(e);
            return Ok(());
        }
        let res = self
            .tree
            .loc(&e.path, self.sh.opts.dry_run)
            .and_then(|l| match e.kind() {
                EntryKind::Dir => self.dir(e, &l),
                EntryKind::Symlink => self.symlink(&e, &l),
                _ => self.file(e, &l),
            });
        self.outcome(res, &shown)
    }

    /// The one entry of a session whose destination is an NBD export.
    pub(super) fn nbd_entry(&mut self, e: Entry, uri: &str) -> Result<()> {
        let stats = self.sh.stats;
        Stats::add(&stats.files_total, 1);
        if e.kind() != EntryKind::File || e.id != 0 {
            return Err(Error::Usage(format!(
                "{uri}: an NBD destination takes exactly one file"
            )));
        }
        Stats::add(&stats.bytes_total, e.size);
        Stats::add(&stats.bytes_transferred, e.size);
        stats.change(format!("write {} to {uri}", shown(&e.path)));
        if self.sh.opts.dry_run {
            Stats::add(&stats.files_transferred, 1);
            return Ok(());
        }
        let client = ferry_nbd::Client::connect(uri).map_err(|err| Error::io(uri, nbd_io(err)))?;
        if client.read_only() {
            return Err(Error::io(
                uri,
                io::Error::other("the NBD export is read-only"),
            ));
        }
        if client.size() < e.size {
            return Err(Error::io(
                uri,
                io::Error::other(format!(
                    "the export holds {} bytes, the source has {}",
                    client.size(),
                    e.size
                )),
            ));
        }
        let nseg = layout::segment_count(e.size);
        let id = e.id;
        let d = Arc::new(DstFile {
            delta_slot: Mutex::new(None),
            _slot: Slot::take(&self.sh.in_flight),
            basis: None,
            basis_blocks: Default::default(),
            // With --verify the sender hashes even in process.
            verify: !self.sh.opts.in_process || self.sh.opts.verify,
            readback: None,
            delta: AtomicBool::new(false),
            delta_cost: 0.0,
            sig_out: None,
            block: AtomicU64::new(layout::grid_block(e.size)),
            nseg,
            remaining: AtomicU64::new(nseg),
            failed: Mutex::new(None),
            loc: Loc::shown_only(PathBuf::from(uri)),
            tmp: None,
            file: Target::Nbd(client),
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
        self.files.insert(id, d);
        self.tx.send(Message::Want {
            file: id,
            mode: WantMode::Whole,
        })?;
        Ok(())
    }

    /// First entry of a [`Dest::FileOrDir`] session: a directory source
    /// goes under the path, a file source becomes the path.
    pub(super) fn resolve_root(&mut self, p: &Path, e: &mut Entry) -> Result<()> {
        if e.kind() != EntryKind::Dir {
            let name = p
                .file_name()
                .map(|n| n.as_bytes().to_vec())
                .unwrap_or_default();
            if name.is_empty() {
                return Err(Error::Usage(format!("{}: not a file name", p.display())));
            }
            e.path = name;
        }
        // A file goes into the path's directory, a tree into the path.
        let root = match e.kind() {
            EntryKind::Dir => p.to_path_buf(),
            _ => p
                .parent()
                .filter(|q| !q.as_os_str().is_empty())
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from(".")),
        };
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

    /// Make room for a new entry of another type at `dest`.
    pub(super) fn clear(&self, dest: &Loc, meta: &fs::Metadata) -> io::Result<()> {
        if self.sh.opts.dry_run {
            return Ok(());
        }
        if meta.is_dir() {
            self.tree.forget(&dest.rel);
            if self.sh.opts.delete || self.sh.opts.force {
                dest.remove_all().op("remove directory")
            } else {
                dest.remove_dir().map_err(|_| {
                    io::Error::other("a directory is in the way (--force or --delete replaces it)")
                })
            }
        } else {
            dest.remove_file().op("remove")
        }
    }

    pub(super) fn dir(&mut self, e: Entry, dest: &Loc) -> io::Result<()> {
        match dest.stat()? {
            Some(m) if m.is_dir() => {}
            other => {
                if let Some(m) = &other {
                    self.clear(dest, m)?;
                }
                self.sh.stats.change(format!("created {}/", shown(&e.path)));
                if !self.sh.opts.dry_run {
                    dest.mkdir(0o700 | (e.mode & 0o777))
                        .op("create directory")?;
                    self.sh.changed(dest);
                }
            }
        }
        self.dirs_ok.insert(e.path.clone());
        // A directory sent again (two sources merging) is handled once.
        if self.dirs_queued.insert(e.path.clone()) {
            self.dirs.push(e);
        }
        Ok(())
    }

    pub(super) fn symlink(&mut self, e: &Entry, dest: &Loc) -> io::Result<()> {
        let target = std::ffi::OsStr::from_bytes(&e.target);
        match dest.stat()? {
            Some(m) if m.file_type().is_symlink() && dest.read_link()? == target => {
                if !self.sh.opts.dry_run {
                    self.link_meta(e, dest)?;
                }
                return Ok(());
            }
            Some(m) if m.is_dir() => self.clear(dest, &m)?,
            _ => {}
        }
        self.sh.stats.change(format!(
            "symlink {} -> {}",
            shown(&e.path),
            target.to_string_lossy()
        ));
        if self.sh.opts.dry_run {
            return Ok(());
        }
        let tmp = dest.sibling(&fsutil::temp_name_for(dest.name()));
        tmp.symlink(target).op("create symlink")?;
        if let Err(err) = self
            .link_meta(e, &tmp)
            .op("set metadata of")
            .and_then(|_| tmp.rename_to(dest).op("rename into place"))
        {
            let _ = tmp.remove_file();
            return Err(err);
        }
        Stats::add(&self.sh.stats.files_transferred, 1);
        self.sh.changed(dest);
        Ok(())
    }

    pub(super) fn link_meta(&self, e: &Entry, p: &Loc) -> io::Result<()> {
        if self.sh.opts.owner {
            p.chown(e.uid, e.gid)?;
        }
        p.set_mtime(e.mtime, e.mtime_nsec)
    }

    pub(super) fn file(&mut self, e: Entry, dest: &Loc) -> io::Result<()> {
        let opts = self.sh.opts;
        let stats = self.sh.stats;
        let mut is_device = false;
        let mut stream_to = false;
        let mut exists_regular = false;
        let mut old_meta = None;
        match dest.stat()? {
            Some(m) if m.is_dir() => {
                self.clear(dest, &m)?;
            }
            Some(m) if m.file_type().is_block_device() => is_device = true,
            Some(m) if m.file_type().is_char_device() || m.file_type().is_fifo() => {
                stream_to = true
            }
            Some(m) if m.is_file() => {
                exists_regular = true;
                if m.len() == e.size && self.unchanged(&e, dest, &m)? {
                    if !opts.dry_run {
                        self.fix_meta(&e, dest, &m)?;
                    }
                    return Ok(());
                }
                old_meta = Some(m);
            }
            _ => {}
        }
        // A file asked for again whole was listed and counted the first time.
        if !self.whole_only.contains(&e.id) {
            stats.change(format!(
                "{} {}",
                if exists_regular || is_device || stream_to {
                    "update"
                } else {
                    "new"
                },
                shown(&e.path)
            ));
            Stats::add(&stats.bytes_transferred, e.size);
        }
        if opts.dry_run {
            Stats::add(&stats.files_transferred, 1);
            return Ok(());
        }
        let inplace = is_device || (opts.inplace && exists_regular);
        let delta_cost = if !is_device && e.size > 0 {
            old_meta
                .as_ref()
                .filter(|m| m.len() > 0)
                .and_then(|m| self.delta_cost(&e, m, &dest.shown))
        } else {
            None
        };
        let delta = !self.whole_only.contains(&e.id)
            && delta_cost.is_some_and(|c| c < delta_saving(self.sh));
        // The old copy is opened before any temp file exists, so failing
        // to open it leaves nothing behind. It is read through the page
        // cache: signing it leaves it there for the copies, which would
        // otherwise read it from the disk a second time (measured on the
        // 1 GiB mangled file: 3.9-4.5 s buffered, 5.1-8.2 s direct).
        let old_copy = match (delta, inplace) {
            (true, false) => Some(dest.open(false).op("open old copy of")?),
            _ => None,
        };
        let (file, tmp) = if is_device {
            let f = dest.open_write_only().op("open device")?;
            let dev_size = fsutil::size_of(&f, &f.metadata()?)?;
            if dev_size < e.size {
                return Err(io::Error::other(format!(
                    "device holds {dev_size} bytes, source has {}",
                    e.size
                )));
            }
            (f, None)
        } else if stream_to {
            (tempfile::tempfile().op("create temporary file for")?, None)
        } else if inplace {
            (dest.open(true).op("open for writing")?, None)
        } else {
            self.clean_stale_temps(dest);
            let tmp = dest.sibling(&fsutil::temp_name_for(dest.name()));
            let f = tmp.create_new(0o600).op("create temporary file for")?;
            tmp.register_temp();
            if let Err(err) = f.set_len(e.size).op("allocate") {
                let _ = tmp.remove_file();
                tmp.unregister_temp();
                return Err(err);
            }
            (f, Some(tmp))
        };
        let direct = match &tmp {
            Some(_) if opts.direct_io && e.size >= direct::MIN_SIZE => direct::open(&file),
            _ => None,
        };
        let nseg = layout::segment_count(e.size);
        let id = e.id;
        let basis = match (delta, old_copy) {
            (false, _) => None,
            (true, Some(old)) => Some(direct::Reader::new(old, false)),
            // In place the old copy is the file being written.
            (true, None) => Some(direct::Reader::new(file.try_clone()?, false)),
        };
        let file = Target::File(file);
        // A signature kept for the cache grows with the file: none beyond
        // 2^17 segments (1 TiB).
        let sig_out = self
            .sh
            .cache
            .as_ref()
            .filter(|_| nseg > 0 && nseg <= 1 << 17)
            .map(|c| SigOut {
                cache: c.clone(),
                bs: layout::delta_block(e.size),
                parts: Mutex::new(vec![None; nseg as usize]),
            });
        let d = Arc::new(DstFile {
            delta_slot: Mutex::new(delta.then(|| DeltaSlot::take(&self.sh.in_flight))),
            _slot: Slot::take(&self.sh.in_flight),
            basis,
            basis_blocks: Default::default(),
            verify: delta || !opts.in_process || opts.verify,
            readback: opts.verify.then(|| Mutex::new(Vec::new())),
            delta: AtomicBool::new(delta),
            delta_cost: delta_cost.unwrap_or(0.0),
            sig_out,
            // Deltas digest on the delta grid, so the old copy's block
            // hashes can stand for blocks that did not change.
            block: AtomicU64::new(if delta {
                layout::delta_block(e.size)
            } else {
                layout::grid_block(e.size)
            }),
            nseg,
            remaining: AtomicU64::new(nseg),
            failed: Mutex::new(None),
            loc: dest.clone(),
            tmp,
            file,
            direct_ok: AtomicBool::new(direct.is_some()),
            direct,
            is_device,
            stream_to,
            reported: AtomicBool::new(false),
            committed: AtomicBool::new(false),
            entry: e,
        });
        if nseg == 0 {
            // Empty file: nothing to ask for.
            return finalize(&d, self.sh);
        }
        self.files.insert(id, d.clone());
        let link = |err: ferry_proto::LinkError| io::Error::other(err.to_string());
        match old_meta {
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
                    mode: WantMode::Whole,
                })
                .map_err(link)?,
        }
        Ok(())
    }

    /// Before the first temporary file of this run in a directory, remove
    /// what killed runs left there (the files they were writing are
    /// written again now, so this is where their temporary files are).
    pub(super) fn clean_stale_temps(&mut self, dest: &Loc) {
        let dir = parent_of(&dest.rel);
        if self.scanned.insert(dir.to_vec()) {
            let n = dest.parent_fd().map_or(0, fsutil::remove_stale_temps);
            if n > 0 {
                self.sh.changed(dest);
                self.sh.stats.notice(format!(
                    "{}: removed {n} temporary file(s) of an interrupted run",
                    self.tree.show(dir).display()
                ));
            }
        }
    }

    /// Whether to send this changed file as a delta. `--delta`/`--whole-file`
    /// decide; otherwise a local run sends whole files (reading the old copy
    /// costs more than the memory copy it saves, as rsync finds), and across
    /// a link the delta is taken when reading the old copy (skipped when its
    /// signature is cached) takes less time than sending the file whole at
    /// the link rate measured so far.
    pub(super) fn delta_cost(&self, e: &Entry, m: &fs::Metadata, dest: &Path) -> Option<f64> {
        let opts = self.sh.opts;
        match opts.delta {
            crate::DeltaMode::Delta => return Some(0.0),
            crate::DeltaMode::Whole => return None,
            crate::DeltaMode::Auto if opts.in_process || e.size < MIN_DELTA_SIZE => return None,
            crate::DeltaMode::Auto => {}
        }
        let got = self.received.get() as f64;
        let secs = self.started.elapsed().as_secs_f64();
        let mut rate = if got > (4 << 20) as f64 && secs > 0.2 {
            got / secs
        } else {
            ASSUMED_LINK_RATE
        };
        if let Some(cap) = opts.bwlimit {
            rate = rate.min(cap as f64);
        }
        let whole = e.size as f64 / rate;
        let cached = self.sh.cache.as_ref().is_some_and(|c| {
            c.get(&cache_key(dest, m, layout::delta_block(e.size)))
                .is_some()
        });
        let read = if cached {
            0.0
        } else {
            m.len() as f64 / BASIS_READ_RATE
        };
        Some(read / whole)
    }

    /// Is the regular file at `dest` (same size as the source) unchanged?
    pub(super) fn unchanged(&self, e: &Entry, dest: &Loc, m: &fs::Metadata) -> io::Result<bool> {
        if self.sh.opts.checksum {
            let Some(want) = e.digest else {
                return Ok(e.size == 0);
            };
            let f = dest.open(false)?;
            return Ok(crate::scan::file_digest(&f, e.size, self.sh.opts.threads)? == want);
        }
        Ok(fsutil::mtime_of(m) == (e.mtime, e.mtime_nsec))
    }

    /// Bring an unchanged file's metadata in line with the source.
    pub(super) fn fix_meta(&self, e: &Entry, dest: &Loc, m: &fs::Metadata) -> io::Result<()> {
        if m.mode() & 0o7777 != e.mode & 0o7777 {
            dest.chmod(e.mode).op("set permissions of")?;
        }
        if self.sh.opts.owner && (m.uid() != e.uid || m.gid() != e.gid) {
            dest.chown(e.uid, e.gid).op("set owner of")?;
        }
        if fsutil::mtime_of(m) != (e.mtime, e.mtime_nsec) {
            dest.set_mtime(e.mtime, e.mtime_nsec).op("set mtime of")?;
        }
        if self.sh.opts.xattrs && !e.xattrs.is_empty() {
            dest.write_xattrs(&e.xattrs).op("set xattrs of")?;
        }
        Ok(())
    }
}
