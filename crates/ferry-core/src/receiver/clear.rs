//! An entry of another type in the way of a new one: removed as the
//! options allow (`--delete`/`--force` for a directory that holds
//! anything), or with `--backup` kept as its backup.

use super::*;

impl Dispatcher<'_, '_> {
    /// Make room for a new entry of another type at `dest`, which holds
    /// an entry of `kind`.
    pub(super) fn clear(&self, dest: &Loc, kind: decide::Kind) -> io::Result<()> {
        if self.sh.opts.dry_run {
            return Ok(());
        }
        if crate::interrupt::stopping() {
            return Err(io::Error::other("interrupted"));
        }
        let is_dir = kind == decide::Kind::Dir;
        if is_dir {
            self.tree.forget(&dest.rel);
        }
        let clear = decide::clear_for(is_dir, self.sh.opts.delete, self.sh.opts.force);
        if let (Some(suffix), decide::Clear::Tree | decide::Clear::File) =
            (self.sh.opts.backup.as_deref(), clear)
        {
            // `--backup`: what is in the way is kept, as a deleted entry
            // is; an empty directory just goes, as rsync's does.
            if is_dir && dest.remove_dir().is_ok() {
                return Ok(());
            }
            return super::backup::keep_deleted(self.sh, dest, suffix).op("back up");
        }
        match clear {
            decide::Clear::Tree => dest.remove_all().op("remove directory"),
            decide::Clear::EmptyDir => dest.remove_dir().map_err(|_| {
                io::Error::other("a directory is in the way (--force or --delete replaces it)")
            }),
            decide::Clear::File => dest.remove_file().op("remove"),
        }
    }
}
