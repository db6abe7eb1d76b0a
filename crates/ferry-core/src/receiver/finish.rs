use super::*;

impl Dispatcher<'_, '_> {
    /// After all data: hard links, deletions, directory metadata.
    pub(super) fn finish(&mut self) {
        let stats = self.sh.stats;
        let opts = self.sh.opts;
        for e in std::mem::take(&mut self.links) {
            let dest = self.root.join(std::ffi::OsStr::from_bytes(&e.path));
            let Some(target) = self.paths.get(&e.link_to) else {
                stats.error(format!(
                    "{}: hard link to an entry not in the list",
                    dest.display()
                ));
                continue;
            };
            if let (Ok(a), Ok(b)) = (fs::symlink_metadata(&dest), fs::metadata(target)) {
                if a.dev() == b.dev() && a.ino() == b.ino() {
                    continue;
                }
            }
            stats.change(format!(
                "hardlink {} => {}",
                shown(&e.path),
                target.display()
            ));
            if opts.dry_run {
                continue;
            }
            let tmp = fsutil::temp_path_for(&dest);
            let r = fs::hard_link(target, &tmp).and_then(|_| fs::rename(&tmp, &dest));
            match r {
                Ok(()) => {
                    Stats::add(&stats.files_transferred, 1);
                    self.sh.changed(&dest);
                }
                Err(err) => {
                    let _ = fs::remove_file(&tmp);
                    stats.error(line(&dest, &err));
                }
            }
        }
        if opts.delete && self.source_unread && !opts.ignore_errors {
            Stats::add(&stats.delete_skipped, 1);
            stats.error_line(
                "I/O error on the sending side: skipping deletion (--ignore-errors deletes anyway)"
                    .into(),
            );
        } else if opts.delete {
            for (dir, e) in &self.dirs {
                self.delete_extras(dir, &e.path);
            }
        }
        if opts.dry_run {
            return;
        }
        for (dir, e) in self.dirs.iter().rev() {
            let r = (|| -> io::Result<()> {
                if opts.owner {
                    fsutil::lchown(dir, e.uid, e.gid).op("set owner of")?;
                }
                if opts.xattrs && !e.xattrs.is_empty() {
                    fsutil::write_xattrs(dir, &e.xattrs).op("set xattrs of")?;
                }
                fs::set_permissions(dir, fs::Permissions::from_mode(e.mode & 0o7777))
                    .op("set permissions of")?;
                fsutil::set_mtime_path(dir, e.mtime, e.mtime_nsec).op("set mtime of")
            })();
            if let Err(err) = r {
                stats.error(line(dir, &err));
            }
        }
        self.sync_dirs();
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
        for dir in dirs {
            let r = File::open(&dir)
                .and_then(|d| d.sync_all())
                .op("fsync directory");
            match r {
                // Deleted in this run (--delete): its parent records that.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => self.sh.stats.error(line(&dir, &err)),
                Ok(()) => {}
            }
        }
    }

    pub(super) fn delete_extras(&self, dir: &Path, rel: &[u8]) {
        let stats = self.sh.stats;
        let Ok(rd) = fs::read_dir(dir) else { return };
        for c in rd.flatten() {
            let name = c.file_name();
            let mut crel = rel.to_vec();
            if !crel.is_empty() {
                crel.push(b'/');
            }
            crel.extend_from_slice(name.as_bytes());
            if self.seen.contains(&crel) {
                continue;
            }
            let is_dir = c.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if self
                .sh
                .opts
                .excludes
                .excluded(Path::new(std::ffi::OsStr::from_bytes(&crel)), is_dir)
            {
                continue;
            }
            // Every entry removed is listed and counted, contents before
            // their directory, as rsync lists them.
            let mut doomed = Vec::new();
            list_tree(&c.path(), crel, is_dir, &mut doomed);
            for (p, rel, dir) in doomed {
                stats.change(format!(
                    "delete {}{}",
                    shown(&rel),
                    if dir { "/" } else { "" }
                ));
                if self.sh.opts.dry_run {
                    Stats::add(&stats.files_deleted, 1);
                    continue;
                }
                let r = if dir {
                    fs::remove_dir(&p)
                } else {
                    fs::remove_file(&p)
                };
                match r {
                    Ok(()) => {
                        Stats::add(&stats.files_deleted, 1);
                        self.sh.changed(&p);
                    }
                    Err(err) => stats.error(format!("{}: delete: {}", p.display(), describe(&err))),
                }
            }
        }
    }
}

/// The entries of a tree to delete, contents before their directory: each
/// with its path, its path relative to the destination root, and whether it
/// is a directory. Symlinks are entries, never followed.
pub(super) fn list_tree(
    p: &Path,
    rel: Vec<u8>,
    is_dir: bool,
    out: &mut Vec<(PathBuf, Vec<u8>, bool)>,
) {
    if is_dir {
        if let Ok(rd) = fs::read_dir(p) {
            for c in rd.flatten() {
                let mut crel = rel.clone();
                crel.push(b'/');
                crel.extend_from_slice(c.file_name().as_bytes());
                let d = c.file_type().is_ok_and(|t| t.is_dir());
                list_tree(&c.path(), crel, d, out);
            }
        }
    }
    out.push((p.to_path_buf(), rel, is_dir));
}
