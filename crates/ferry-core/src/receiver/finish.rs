use super::*;

use std::ffi::OsStr;
use std::os::fd::OwnedFd;

use crate::listcheck::child_path;

use super::deletes::DeleteBudget;

impl Dispatcher<'_, '_> {
    /// A pull with `--files-from` (see [`SyncOptions::listed_by_receiver`]):
    /// each listed path the sender's list lacks, and no rule of the
    /// user's excludes, is an error line, and `--delete` is off, as when
    /// a local sender finds it missing (rsync's "link_stat failed").
    pub(super) fn check_listed(&mut self) {
        let opts = self.sh.opts;
        if !opts.listed_by_receiver {
            return;
        }
        for rel in &opts.listed {
            let excluded = |dir| opts.excludes.excluded(Path::new(rel), dir);
            if self.check.has(rel.as_bytes()) || excluded(false) || excluded(true) {
                continue;
            }
            self.source_unread = true;
            self.sh.stats.error(format!(
                "{rel}: listed by --files-from: not on the sending side"
            ));
        }
    }

    /// After all data: hard links, deletions, directory metadata.
    pub(super) fn finish(&mut self) {
        let stats = self.sh.stats;
        let opts = self.sh.opts;
        // Interrupted: nothing more changes (see `crate::interrupt`).
        let stopping = crate::interrupt::stopping;
        for e in std::mem::take(&mut self.links) {
            if stopping() {
                return;
            }
            let shown_dest = self.tree.show(&e.path);
            if let Err(err) = self.hard_link(&e) {
                stats.error(line(&shown_dest, &err));
            }
        }
        match decide::deletion(opts.delete, self.source_unread, opts.ignore_errors) {
            decide::Deletion::Off => {}
            decide::Deletion::Skipped => {
                Stats::add(&stats.delete_skipped, 1);
                // Directories the list had left before the error may have
                // lost their extras already (as with rsync's default).
                let when = match self.deletes.as_ref().is_some_and(|d| d.streamed()) {
                    true => "skipping deletion from there on",
                    false => "skipping deletion",
                };
                stats.error_line(format!(
                    "I/O error on the sending side: {when} (--ignore-errors deletes anyway)"
                ));
            }
            decide::Deletion::Run => {
                // What was not deleted as its entries ended (see
                // `super::deletes`), in list order.
                if let Some(mut d) = self.deletes.take() {
                    for e in &self.dirs {
                        if d.left_for_end(&e.path) {
                            self.delete_extras(&e.path, &mut d.budget, &d.unlinks, false);
                        }
                    }
                    self.deletes = Some(d);
                }
            }
        }
        if let Some(d) = &self.deletes {
            // Whatever was queued, during the list or now, is done before
            // the directories are synced.
            d.unlinks.settle();
            if d.budget.skipped > 0 && opts.max_delete.is_some() {
                Stats::add(&stats.deletes_held, d.budget.skipped);
                stats.error(format!(
                    "deletions stopped at the --max-delete limit of {}: {} skipped",
                    opts.max_delete.unwrap_or(0),
                    d.budget.skipped
                ));
            }
        }
        if opts.dry_run || stopping() {
            return;
        }
        for e in self.dirs.iter().rev() {
            if stopping() {
                return;
            }
            let r = self.tree.loc(&e.path, false).and_then(|dir| {
                // Only what differs: an unchanged directory costs a stat.
                let steps = match dir.lstat()?.as_ref().map(decide::Stat::of_raw) {
                    Some(old) if old.kind == decide::Kind::Dir => {
                        decide::dir_meta_fixes(e, &old, self.sh.keep, opts.meta_xattrs())
                    }
                    _ => decide::meta_for_new(EntryKind::Dir, self.sh.keep, opts.meta_xattrs()),
                };
                if steps.owner {
                    let (u, g) = self.sh.keep.ids(e);
                    dir.chown(u, g).op("set owner of")?;
                }
                if steps.xattrs {
                    dir.write_xattrs(&e.xattrs, &|n| opts.xattr_scope(n))
                        .op("set xattrs of")?;
                }
                if steps.mode {
                    dir.chmod(e.mode).op("set permissions of")?;
                }
                if steps.mtime {
                    dir.set_mtime(e.mtime, e.mtime_nsec).op("set mtime of")?;
                }
                Ok(())
            });
            if let Err(err) = r {
                stats.error(line(&self.tree.show(&e.path), &err));
            }
        }
        self.sync_dirs();
    }

    /// Make the hard-link entry `e` a link to the file entry it names: an
    /// entry of this transfer, reached through the same handles.
    fn hard_link(&self, e: &Entry) -> io::Result<()> {
        // The list check made sure the target is a regular file listed
        // before it (version 10 names it by path); it must also be one
        // this run took (not a reserved name or one below a directory it
        // could not make), and a regular file where it is now.
        let target_rel = &e.target;
        if self.skipped.contains(target_rel) {
            return Err(io::Error::other("hard link to an entry that was skipped"));
        }
        let dry = self.sh.opts.dry_run;
        let dest = self.tree.loc(&e.path, dry)?;
        if let Some(&(size, mtime)) = self.left_alone.get(target_rel) {
            // What the first name holds is not the source's content: this
            // name is left alone by the same rule, or not linked to it.
            let old = Self::stat(&dest)?;
            // Left by the same rule, or already the source's (its size and
            // time, as a re-run's quick check finds it).
            let current = old.is_some_and(|o| {
                o.kind == decide::Kind::File
                    && o.size == size
                    && (o.mtime, o.mtime_nsec) == (e.mtime, e.mtime_nsec)
            });
            if current || decide::leave_alone(&self.sh.opts.skip, size, mtime, old.as_ref()) {
                return Ok(());
            }
            return Err(io::Error::other(format!(
                "not linked: its first name {} was left as the destination has it \
                 (--update, --ignore-existing)",
                crate::listcheck::shown(target_rel)
            )));
        }
        let target = self.tree.loc(target_rel, dry)?;
        let is_file = |t: &Loc| {
            t.lstat()
                .map(|s| s.map(|s| decide::Stat::of_raw(&s).kind == decide::Kind::File))
        };
        if !dry && !is_file(&target)?.unwrap_or(false) {
            return Err(io::Error::other("hard link to what is not a regular file"));
        }
        let old = Self::stat(&dest)?;
        if decide::leave_link(&self.sh.opts.skip, (e.mtime, e.mtime_nsec), old.as_ref()) {
            return Ok(());
        }
        if let (Some(a), Some(b)) = (old, Self::stat(&target)?) {
            if decide::already_linked(&a, &b) {
                return Ok(());
            }
        }
        let code = itemize::code(Update::HardLink, ItemKind::File, true, Attrs::default());
        self.sh.item(code, &e.path, false, target_rel);
        if dry {
            return Ok(());
        }
        let tmp = dest.sibling(&fsutil::temp_name_for(dest.name()));
        let r = tmp
            .hard_link_to(&target)
            .op("link")
            .and_then(|_| super::backup::keep_replaced(self.sh, &dest).op("back up"))
            .and_then(|_| tmp.rename_to(&dest).op("rename into place"));
        if r.is_err() {
            let _ = tmp.remove_file();
        }
        r?;
        Stats::add(&self.sh.stats.files_transferred, 1);
        self.sh.changed(&dest);
        Ok(())
    }

    /// fsync every directory whose entries changed (once each, at the end:
    /// a tree of many small files pays one fsync per directory, not per
    /// file), so that what the run reports is on the disk.
    pub(super) fn sync_dirs(&self) {
        let dirs = self
            .sh
            .dirty
            .lock()
            .map(|mut d| std::mem::take(&mut *d))
            .unwrap_or_default();
        let dirs = if decide::sync_whole_fs(dirs.len()) {
            self.syncfs_dirs(dirs)
        } else {
            dirs.into_iter().collect()
        };
        for rel in dirs {
            let r = self
                .tree
                .dir(&rel)
                .and_then(|d| Ok(rustix::fs::fsync(&*d)?))
                .op("fsync directory");
            match r {
                // Deleted in this run (--delete): its parent records that.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => self.sh.stats.error(line(&self.tree.show(&rel), &err)),
                Ok(()) => {}
            }
        }
        if self.root_created && self.sh.opts.fsync {
            // The root itself is new: its parent (the user's own path)
            // records it.
            let parent = match self.tree.shown().parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            if let Err(err) = File::open(&parent).and_then(|d| d.sync_all()) {
                self.sh.stats.error(line(&parent, &err));
            }
        }
    }

    /// Many changed directories: one `syncfs` for each filesystem they are
    /// on, one journal commit in all, where an fsync each costs one per
    /// directory (1,000 directories: 0.15 s here). Only on the local
    /// filesystems whose `syncfs` writes everything ([`decide::batch_fs`],
    /// as for batched file commits; not FUSE or network filesystems, which
    /// may ignore it). Gives back the directories left to fsync one by
    /// one: on other filesystems, or where `syncfs` failed (it reports
    /// errors of any file there). As for the file batches, a `syncfs`
    /// reports a failed write back only on Linux 5.8 and later.
    fn syncfs_dirs(&self, dirs: HashSet<Vec<u8>>) -> Vec<Vec<u8>> {
        let mut synced: Vec<(u64, bool)> = Vec::new();
        let mut left = Vec::new();
        for rel in dirs {
            let dev = self
                .tree
                .dir(&rel)
                .and_then(|d| Ok((rustix::fs::fstat(&*d)?.st_dev, d)));
            let ok = match dev {
                // Deleted in this run (--delete): its parent records that.
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(_) => false,
                Ok((dev, d)) => match synced.iter().find(|(s, _)| *s == dev) {
                    Some(&(_, ok)) => ok,
                    None => {
                        #[allow(clippy::unnecessary_cast)]
                        let local = rustix::fs::fstatfs(&*d)
                            .is_ok_and(|s| decide::batch_fs(s.f_type as u64));
                        let ok = local && rustix::fs::syncfs(&*d).is_ok();
                        synced.push((dev, ok));
                        ok
                    }
                },
            };
            if !ok {
                left.push(rel);
            }
        }
        left
    }

    /// `--delete`: remove what the directory `rel` holds that the list
    /// does not (and the excludes do not protect); `during` the list, not
    /// what may be work in progress ([`decide::in_use`]). Whether such
    /// work was held back (the end of the run looks again).
    pub(super) fn delete_extras(
        &self,
        rel: &[u8],
        budget: &mut DeleteBudget,
        unlinks: &unlink::Unlinks,
        during: bool,
    ) -> bool {
        let dir = match self.tree.loc(rel, false).and_then(|l| l.open_dir()) {
            Ok(d) => Arc::new(d),
            // Not there (a dry run) or not a directory: nothing to delete.
            Err(_) => return false,
        };
        let Ok(entries) = crate::destdir::list(&dir) else {
            return false;
        };
        let opts = self.sh.opts;
        let protect = (!opts.delete_excluded).then_some(&opts.excludes);
        let (mut extras, held) = decide::extras(rel, entries, &self.seen, protect, during);
        extras.retain(|x| !super::backup::is_backup(opts, &x.name));
        // In rsync's order: which entries a --max-delete limit spares is
        // then the same (and does not depend on the directory's hash order).
        extras.sort_by(|a, b| decide::rsync_delete_order((&a.name, a.is_dir), (&b.name, b.is_dir)));
        for x in extras {
            self.tree.forget(&x.rel);
            self.delete_tree(&dir, &x.name, x.rel, x.is_dir, (budget, unlinks));
        }
        held
    }

    /// Delete `name` in `dir` and all it holds: every entry removed is
    /// listed and counted, contents before their directory, as rsync lists
    /// them. Each level is opened from its parent's handle; symlinks are
    /// entries, never followed. Whether it is gone (or would be, in a dry
    /// run): not when an entry in it is protected by the rules (as rsync,
    /// the directory then stays), `--max-delete` stopped it, or deleting
    /// failed. A plain file is unlinked by the [`unlink`] workers: it
    /// counts as gone, and a directory is removed only once the unlinks
    /// queued since it was opened have finished, and none failed.
    fn delete_tree(
        &self,
        dir: &Arc<OwnedFd>,
        name: &OsStr,
        rel: Vec<u8>,
        is_dir: bool,
        (budget, unlinks): (&mut DeleteBudget, &unlink::Unlinks),
    ) -> bool {
        if crate::interrupt::stopping() {
            return false;
        }
        let stats = self.sh.stats;
        let opts = self.sh.opts;
        let mut all_gone = true;
        let failed_before = if is_dir { unlinks.settle() } else { 0 };
        if is_dir {
            let sub = rustix::fs::openat(
                dir,
                name,
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::NOFOLLOW
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            );
            if let Ok(sub) = sub.map(Arc::new) {
                // Only a run with a backup directory pays for the fstat.
                let is_backup_dir = self.sh.backup_id.is_some_and(|want| {
                    rustix::fs::fstat(&*sub).is_ok_and(|st| (st.st_dev, st.st_ino) == want)
                });
                if is_backup_dir {
                    // `--backup-dir` within the destination: it stays,
                    // and with it the directories that lead to it.
                    return false;
                }
                let mut children = crate::destdir::list(&sub).unwrap_or_default();
                children.sort_by(|a, b| decide::rsync_delete_order((&a.0, a.1), (&b.0, b.1)));
                for (child, d) in children {
                    let crel = child_path(&rel, child.as_bytes());
                    let protected = (!opts.delete_excluded
                        && opts
                            .excludes
                            .excluded(Path::new(OsStr::from_bytes(&crel)), d))
                        || super::backup::is_backup(opts, &child);
                    all_gone &= !protected
                        && self.delete_tree(&sub, &child, crel, d, (&mut *budget, unlinks));
                }
            }
            all_gone &= unlinks.settle() == failed_before;
        }
        // A directory that keeps an entry stays.
        if !all_gone {
            return false;
        }
        if !budget.take() {
            budget.skipped += 1;
            return false;
        }
        self.sh.item(itemize::DELETING, &rel, is_dir, b"");
        if self.sh.opts.dry_run {
            Stats::add(&stats.files_deleted, 1);
            return true;
        }
        if !is_dir && opts.backup.is_none() {
            self.sh.changed_rel(&rel);
            let job = unlink::Job {
                dir: dir.clone(),
                name: name.to_owned(),
                shown: self.tree.show(&rel),
            };
            return match unlinks.queue(job) {
                Ok(()) => true,
                Err(job) => unlink::unlink(&job.dir, &job.name, &job.shown, stats),
            };
        }
        let flags = if is_dir {
            rustix::fs::AtFlags::REMOVEDIR
        } else {
            rustix::fs::AtFlags::empty()
        };
        let res = match (&opts.backup, is_dir) {
            (Some(suffix), false) => self
                .tree
                .loc(&rel, false)
                .and_then(|l| super::backup::keep_deleted(self.sh, &l, suffix)),
            _ => rustix::fs::unlinkat(dir, name, flags).map_err(io::Error::from),
        };
        match res {
            Ok(()) => {
                Stats::add(&stats.files_deleted, 1);
                self.sh.changed_rel(&rel);
                // A backup beside it stays in the directory, which stays too.
                opts.backup.is_none() || opts.backup_dir.is_some() || is_dir
            }
            Err(err) => {
                stats.error(format!(
                    "{}: delete: {}",
                    self.tree.show(&rel).display(),
                    describe(&err)
                ));
                false
            }
        }
    }
}
