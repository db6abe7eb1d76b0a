//! Entries without data: symlinks and (`-D`) device nodes, FIFOs and
//! sockets, each made under a temporary name beside its destination and
//! renamed into place, or, when the same is there, only its attributes
//! brought in line.

use super::*;

impl Dispatcher<'_, '_> {
    pub(super) fn symlink(&mut self, e: &Entry, dest: &Loc) -> io::Result<()> {
        let target = std::ffi::OsStr::from_bytes(&e.target);
        let old = Self::stat(dest)?;
        let kind = old.map(|s| s.kind);
        let current = match kind {
            Some(decide::Kind::Symlink) => Some(dest.read_link()?),
            _ => None,
        };
        if decide::leave_existing(&self.sh.opts.skip, kind) {
            return Ok(());
        }
        let current = current.as_ref().map(|t| t.as_bytes());
        let at = decide::symlink_at(kind, current, &e.target);
        // Listed as rsync lists it: new unless a symlink was there.
        let a = match old.filter(|o| o.kind == decide::Kind::Symlink) {
            // A new target: its time is the new link's (rsync shows no t).
            Some(o) if at != decide::SymlinkAt::Keep => Attrs {
                checksum: true,
                time: false,
                ..decide::differs(e, &o, self.sh.keep)
            },
            Some(o) => decide::differs(e, &o, self.sh.keep),
            None => Attrs::default(),
        };
        let new = kind != Some(decide::Kind::Symlink);
        match at {
            decide::SymlinkAt::Keep => {
                if a.any() {
                    let code = itemize::code(Update::Meta, ItemKind::Symlink, false, a);
                    self.sh.item(code, &e.path, false, &e.target);
                }
                if !self.sh.opts.dry_run {
                    self.link_meta(e, dest)?;
                }
                return Ok(());
            }
            decide::SymlinkAt::ClearThenCreate => self.clear(dest, decide::Kind::Dir)?,
            decide::SymlinkAt::Create => {}
        }
        let code = itemize::code(Update::Local, ItemKind::Symlink, new, a);
        self.sh.item(code, &e.path, false, &e.target);
        if self.sh.opts.dry_run {
            return Ok(());
        }
        self.place(e, dest, EntryKind::Symlink, |tmp| {
            tmp.symlink(target).op("create symlink")
        })
    }

    /// Make an entry without data (`make` on a temporary name beside
    /// `dest`), give it its metadata, back up what it replaces and rename
    /// it into place; on failure the temporary entry goes.
    fn place(
        &self,
        e: &Entry,
        dest: &Loc,
        kind: EntryKind,
        make: impl FnOnce(&Loc) -> io::Result<()>,
    ) -> io::Result<()> {
        let tmp = dest.sibling(&fsutil::temp_name_for(dest.name()));
        make(&tmp)?;
        let steps = decide::meta_for_new(kind, self.sh.keep, false);
        if let Err(err) = self
            .node_meta(e, &tmp, steps)
            .and_then(|_| super::backup::keep_replaced(self.sh, dest).op("back up"))
            .and_then(|_| tmp.rename_to(dest).op("rename into place"))
        {
            let _ = tmp.remove_file();
            return Err(err);
        }
        Stats::add(&self.sh.stats.files_transferred, 1);
        self.sh.changed(dest);
        Ok(())
    }

    /// A device node, FIFO or socket (`-D`): made as such under a
    /// temporary name and renamed into place, or, when one of the same
    /// type and number is there, its attributes fixed.
    pub(super) fn special(&mut self, e: &Entry, dest: &Loc) -> io::Result<()> {
        if !self.sh.opts.specials {
            // Not asked for here: a sender lists them only with -D.
            return Err(io::Error::other(
                "a device, FIFO or socket, and -D (--specials) was not given: skipped",
            ));
        }
        let Some(node) = decide::node_kind(e.mode) else {
            return Err(io::Error::other(
                "listed as special, but not a device, FIFO or socket",
            ));
        };
        let device = matches!(node, decide::Kind::CharDevice | decide::Kind::BlockDevice);
        if device && (!fsutil::is_root() || self.sh.opts.untrusted_sender) {
            // As rsync: only root makes device nodes, the others skip them;
            // and never for a daemon's client (a node is a key to a disk).
            // FIFOs and sockets give nothing: anyone may make them.
            return Ok(());
        }
        let x = if device {
            ItemKind::Device
        } else {
            ItemKind::Special
        };
        let old = Self::stat(dest)?;
        let dry = self.sh.opts.dry_run;
        if let Some(o) = old.filter(|o| decide::same_node(e, o)) {
            let a = decide::differs(e, &o, self.sh.keep);
            if a.any() {
                self.sh.item(
                    itemize::code(Update::Meta, x, false, a),
                    &e.path,
                    false,
                    b"",
                );
            }
            if !dry {
                self.node_meta(e, dest, decide::meta_fixes(e, &o, self.sh.keep, false))?;
            }
            return Ok(());
        }
        if old.is_some_and(|o| o.kind == decide::Kind::Dir) {
            self.clear(dest, decide::Kind::Dir)?;
        }
        let code = itemize::code(Update::Local, x, true, Attrs::default());
        self.sh.item(code, &e.path, false, b"");
        if dry {
            return Ok(());
        }
        self.place(e, dest, EntryKind::Special, |tmp| {
            tmp.mknod(e.mode, e.rdev).op("make node")
        })
    }

    /// A node's or symlink's owner, permissions and time, as `steps` say
    /// (never opened: see [`Loc::chmod`]; a symlink's steps have no mode).
    fn node_meta(&self, e: &Entry, p: &Loc, steps: decide::MetaSteps) -> io::Result<()> {
        if steps.owner {
            let (u, g) = self.sh.keep.ids(e);
            p.chown(u, g).op("set owner of")?;
        }
        if steps.mode {
            p.chmod(e.mode).op("set permissions of")?;
        }
        if steps.mtime {
            p.set_mtime(e.mtime, e.mtime_nsec).op("set mtime of")?;
        }
        Ok(())
    }

    pub(super) fn link_meta(&self, e: &Entry, p: &Loc) -> io::Result<()> {
        let steps = decide::meta_for_new(EntryKind::Symlink, self.sh.keep, false);
        self.node_meta(e, p, steps)
    }
}
