//! rsync's options that leave a destination file alone whatever its
//! content: `--update`, `--ignore-existing`, `--min-size`, `--max-size`.

use super::{Kind, Stat};
use crate::SkipRules;

/// Whether the file entry of `size` bytes and modification time `mtime`
/// is left as the destination has it (`old`: what is there, if anything):
/// not written, its metadata not touched, never deleted for it.
pub(crate) fn leave_alone(
    rules: &SkipRules,
    size: u64,
    mtime: (i64, u32),
    old: Option<&Stat>,
) -> bool {
    if rules.min_size.is_some_and(|m| size < m) || rules.max_size.is_some_and(|m| size > m) {
        return true;
    }
    match old {
        None => false,
        Some(_) if rules.ignore_existing => true,
        // Newer at the destination; an equal time is updated (rsync:
        // a size that differs is still sent).
        Some(o) if rules.update && o.kind == Kind::File => (o.mtime, o.mtime_nsec) > mtime,
        Some(_) => false,
    }
}

/// Whether a symlink or hard-link entry is left as the destination has
/// it: with `--ignore-existing`, whatever is there stays (a file where the
/// source has a symlink, a file where it has another name of a linked
/// file), as rsync leaves any existing entry that is not a directory.
pub(crate) fn leave_existing(rules: &SkipRules, old: Option<Kind>) -> bool {
    rules.ignore_existing && old.is_some()
}

/// Whether a later name of a linked file (a hard-link entry, which
/// carries the source's time but no size) is left as the destination has
/// it: `--ignore-existing` and anything there, or `--update` and a newer
/// file there, as rsync decides for each name of a linked file.
pub(crate) fn leave_link(rules: &SkipRules, mtime: (i64, u32), old: Option<&Stat>) -> bool {
    match old {
        None => false,
        Some(_) if rules.ignore_existing => true,
        Some(o) => rules.update && o.kind == Kind::File && (o.mtime, o.mtime_nsec) > mtime,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(mtime: i64) -> Stat {
        Stat {
            kind: Kind::File,
            size: 5,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            mtime,
            mtime_nsec: 0,
            dev: 1,
            ino: 2,
            rdev: 0,
        }
    }

    #[test]
    fn a_later_name_is_left_by_its_own_time() {
        let u = SkipRules {
            update: true,
            min_size: Some(100),
            ..Default::default()
        };
        assert!(leave_link(&u, (10, 0), Some(&file(20))));
        assert!(!leave_link(&u, (30, 0), Some(&file(20))));
        assert!(!leave_link(&u, (10, 0), None), "no size rule for a link");
        let ie = SkipRules {
            ignore_existing: true,
            ..Default::default()
        };
        assert!(leave_link(&ie, (30, 0), Some(&file(20))));
        assert!(!leave_link(&SkipRules::default(), (10, 0), Some(&file(20))));
    }

    #[test]
    fn what_each_rule_leaves_alone() {
        let none = SkipRules::default();
        assert!(!leave_alone(&none, 5, (10, 0), Some(&file(20))));
        let u = SkipRules {
            update: true,
            ..Default::default()
        };
        assert!(leave_alone(&u, 5, (10, 0), Some(&file(20))));
        assert!(
            !leave_alone(&u, 5, (20, 0), Some(&file(20))),
            "equal: updated"
        );
        assert!(!leave_alone(&u, 5, (30, 0), Some(&file(20))));
        assert!(!leave_alone(&u, 5, (10, 0), None));
        let mut dir = file(20);
        dir.kind = Kind::Dir;
        assert!(!leave_alone(&u, 5, (10, 0), Some(&dir)), "-u is for files");
        let ie = SkipRules {
            ignore_existing: true,
            ..Default::default()
        };
        assert!(leave_alone(&ie, 5, (30, 0), Some(&file(20))));
        assert!(!leave_alone(&ie, 5, (30, 0), None));
        let sized = SkipRules {
            min_size: Some(10),
            max_size: Some(100),
            ..Default::default()
        };
        assert!(leave_alone(&sized, 9, (0, 0), None));
        assert!(!leave_alone(&sized, 10, (0, 0), None));
        assert!(!leave_alone(&sized, 100, (0, 0), None));
        assert!(leave_alone(&sized, 101, (0, 0), None));
    }

    #[test]
    fn ignore_existing_leaves_any_existing_entry() {
        let ie = SkipRules {
            ignore_existing: true,
            ..Default::default()
        };
        for k in [Kind::File, Kind::Symlink, Kind::Dir] {
            assert!(leave_existing(&ie, Some(k)), "{k:?}");
            assert!(!leave_existing(&SkipRules::default(), Some(k)));
        }
        assert!(!leave_existing(&ie, None));
    }
}
