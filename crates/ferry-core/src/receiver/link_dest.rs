//! `--link-dest DIR`: a file missing at the destination that an earlier
//! copy in DIR holds unchanged (the same quick check as a re-run: size and
//! modification time, or content with `--checksum`; and the same time,
//! permissions and owner, where those are kept) is hard-linked from there
//! instead of sent: snapshots that share what did not change. DIR is
//! relative to the destination (as in rsync) unless absolute, is reached
//! through a directory handle like the destination, and is only read.
//! Where the link cannot be made (another filesystem), the file is sent.

use super::*;

impl Dispatcher<'_, '_> {
    /// Whether `e`, missing at `dest`, was linked from a `--link-dest`
    /// directory (or would be, in a dry run).
    pub(super) fn link_from_earlier(&mut self, e: &Entry, dest: &Loc) -> io::Result<bool> {
        let opts = self.sh.opts;
        if opts.link_dest.is_empty() {
            return Ok(false);
        }
        if self.link_dests.is_none() {
            let root = self.tree.shown().to_path_buf();
            let dirs = opts
                .link_dest
                .iter()
                .filter_map(|d| DestDir::open(&root.join(d)).ok())
                .collect();
            self.link_dests = Some(dirs);
        }
        let Some(dirs) = &self.link_dests else {
            return Ok(false);
        };
        for d in dirs {
            let Ok(earlier) = d.loc(&e.path, true) else {
                continue;
            };
            let Ok(Some(m)) = earlier.stat() else {
                continue;
            };
            let old = decide::Stat::of(&m);
            if !decide::linkable(e, &old, self.sh.keep) || !self.unchanged(e, &earlier, &old)? {
                continue;
            }
            if opts.dry_run {
                return Ok(true);
            }
            if dest.hard_link_to(&earlier).is_ok() {
                self.sh.changed(dest);
                return Ok(true);
            }
        }
        Ok(false)
    }
}
