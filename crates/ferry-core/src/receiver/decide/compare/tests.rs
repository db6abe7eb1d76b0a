//! Unit tests of [`super`]: the quick check, what is in the way, and the
//! metadata steps, on entries and [`Stat`]s built by hand.

use super::super::fixture::{file, same_as};
use super::*;

#[test]
fn same_size_and_mtime_is_unchanged_and_a_nanosecond_is_not() {
    let e = file(10);
    let old = same_as(&e);
    assert_eq!(quick_check(&e, &old, false), QuickCheck::Unchanged);
    let newer = Stat {
        mtime_nsec: e.mtime_nsec + 1,
        ..old
    };
    assert_eq!(quick_check(&e, &newer, false), QuickCheck::Changed);
    let other_second = Stat {
        mtime: e.mtime - 1,
        ..old
    };
    assert_eq!(quick_check(&e, &other_second, false), QuickCheck::Changed);
}

#[test]
fn another_size_is_changed_even_with_checksum_and_equal_mtime() {
    let mut e = file(10);
    e.digest = Some([9; 32]);
    let old = Stat {
        size: 11,
        ..same_as(&e)
    };
    assert_eq!(quick_check(&e, &old, false), QuickCheck::Changed);
    // No contents are read when the sizes already differ.
    assert_eq!(quick_check(&e, &old, true), QuickCheck::Changed);
}

#[test]
fn checksum_ignores_mtime_and_compares_contents() {
    let mut e = file(10);
    e.digest = Some([3; 32]);
    let old = Stat {
        mtime: 1,
        ..same_as(&e)
    };
    assert_eq!(
        quick_check(&e, &old, true),
        QuickCheck::CompareDigest([3; 32])
    );
    // The same mtime does not spare the comparison either.
    assert_eq!(
        quick_check(&e, &same_as(&e), true),
        QuickCheck::CompareDigest([3; 32])
    );
}

#[test]
fn checksum_entry_without_digest_is_unchanged_only_when_empty() {
    let empty = file(0);
    assert_eq!(
        quick_check(&empty, &same_as(&empty), true),
        QuickCheck::Unchanged
    );
    // A sender that leaves the digest out cannot make a file look
    // unchanged: it is sent again.
    let e = file(5);
    assert_eq!(quick_check(&e, &same_as(&e), true), QuickCheck::Changed);
}

#[test]
fn file_at_maps_every_kind() {
    assert_eq!(file_at(None), FileAt::Nothing);
    assert_eq!(file_at(Some(Kind::Symlink)), FileAt::Nothing);
    assert_eq!(file_at(Some(Kind::Other)), FileAt::Nothing);
    assert_eq!(file_at(Some(Kind::Dir)), FileAt::Dir);
    assert_eq!(file_at(Some(Kind::BlockDevice)), FileAt::BlockDevice);
    assert_eq!(file_at(Some(Kind::CharDevice)), FileAt::Stream);
    assert_eq!(file_at(Some(Kind::Fifo)), FileAt::Stream);
    assert_eq!(file_at(Some(Kind::File)), FileAt::Regular);
}

#[test]
fn a_directory_in_the_way_needs_delete_or_force_unless_empty() {
    assert_eq!(clear_for(true, false, false), Clear::EmptyDir);
    assert_eq!(clear_for(true, true, false), Clear::Tree);
    assert_eq!(clear_for(true, false, true), Clear::Tree);
    assert_eq!(clear_for(true, true, true), Clear::Tree);
    // A file in the way is always removed; the options do not matter.
    for (d, f) in [(false, false), (true, false), (false, true)] {
        assert_eq!(clear_for(false, d, f), Clear::File);
    }
}

#[test]
fn a_symlink_to_a_directory_is_not_a_directory() {
    assert_eq!(dir_at(Some(Kind::Dir)), DirAt::Keep);
    assert_eq!(dir_at(None), DirAt::Create);
    // Never followed: a symlink planted where a directory goes is
    // removed, so nothing is written through it.
    assert_eq!(dir_at(Some(Kind::Symlink)), DirAt::ClearThenCreate);
    assert_eq!(dir_at(Some(Kind::File)), DirAt::ClearThenCreate);
    assert_eq!(dir_at(Some(Kind::Fifo)), DirAt::ClearThenCreate);
}

#[test]
fn symlink_kept_only_with_the_same_target() {
    let s = Some(Kind::Symlink);
    assert_eq!(symlink_at(s, Some(b"a/b"), b"a/b"), SymlinkAt::Keep);
    assert_eq!(symlink_at(s, Some(b"a/c"), b"a/b"), SymlinkAt::Create);
    assert_eq!(symlink_at(s, Some(b"a/b/"), b"a/b"), SymlinkAt::Create);
    // A regular file whose "target" was somehow given is no symlink.
    assert_eq!(
        symlink_at(Some(Kind::File), Some(b"a/b"), b"a/b"),
        SymlinkAt::Create
    );
    assert_eq!(
        symlink_at(Some(Kind::Dir), None, b"x"),
        SymlinkAt::ClearThenCreate
    );
    assert_eq!(symlink_at(None, None, b"x"), SymlinkAt::Create);
}

#[test]
fn hard_link_is_done_only_on_the_same_device_and_inode() {
    let e = file(1);
    let a = same_as(&e);
    assert!(already_linked(&a, &a));
    assert!(!already_linked(&a, &Stat { ino: 3, ..a }));
    // The same inode number on another filesystem is another file.
    assert!(!already_linked(&a, &Stat { dev: 9, ..a }));
}

#[test]
fn new_entries_get_metadata_by_kind_and_options() {
    let all = meta_for_new(EntryKind::File, Keep::ALL, true);
    assert_eq!(
        all,
        MetaSteps {
            owner: true,
            mode: true,
            xattrs: true,
            mtime: true
        }
    );
    let plain = meta_for_new(EntryKind::Dir, Keep::USER, true);
    // With --xattrs they are made the source's even when it has none (an
    // inherited default ACL goes).
    assert!(!plain.owner && plain.xattrs && plain.mode && plain.mtime);
    // Xattrs the source has are not set without --xattrs.
    assert!(!meta_for_new(EntryKind::File, Keep::USER, false).xattrs);
    // chmod on a symlink would change its target: never.
    let link = meta_for_new(EntryKind::Symlink, Keep::ALL, true);
    assert!(link.owner && link.mtime && !link.mode && !link.xattrs);
    assert_eq!(
        meta_for_new(EntryKind::HardLink, Keep::ALL, true),
        MetaSteps::default()
    );
}

#[test]
fn unchanged_file_in_line_needs_no_fix() {
    let e = file(10);
    assert_eq!(
        meta_fixes(&e, &same_as(&e), Keep::ALL, false),
        MetaSteps::default()
    );
}

#[test]
fn fixes_compare_permission_bits_not_the_file_type() {
    let e = file(10);
    // Same permissions, type bits dropped: nothing to fix.
    let typeless = Stat {
        mode: 0o644,
        ..same_as(&e)
    };
    assert!(!meta_fixes(&e, &typeless, Keep::USER, false).mode);
    // A setuid bit the source lacks must go.
    let setuid = Stat {
        mode: 0o104644,
        ..same_as(&e)
    };
    assert!(meta_fixes(&e, &setuid, Keep::USER, false).mode);
}

#[test]
fn owner_fixed_only_with_owner_and_when_it_differs() {
    let e = file(10);
    let other_gid = Stat {
        gid: 0,
        ..same_as(&e)
    };
    assert!(!meta_fixes(&e, &other_gid, Keep::USER, false).owner);
    let f = meta_fixes(&e, &other_gid, Keep::ALL, false);
    assert!(f.owner && !f.mode && !f.mtime);
}

#[test]
fn fixes_mtime_to_the_nanosecond_and_xattrs_whenever_asked() {
    let mut e = file(10);
    let old = Stat {
        mtime_nsec: 0,
        ..same_as(&e)
    };
    assert!(meta_fixes(&e, &old, Keep::USER, false).mtime);
    // Without any at the source, those at the destination in scope go.
    assert!(meta_fixes(&e, &old, Keep::USER, true).xattrs);
    e.xattrs.push((b"user.a".to_vec(), b"1".to_vec()));
    // Xattrs are not compared: with --xattrs they are written again.
    assert!(meta_fixes(&e, &same_as(&e), Keep::USER, true).xattrs);
    assert!(!meta_fixes(&e, &same_as(&e), Keep::USER, false).xattrs);
}

#[test]
fn itemized_differences() {
    let e = file(10);
    let same = same_as(&e);
    assert!(!differs(&e, &same, Keep::ALL).any());
    let other = Stat {
        size: 11,
        mtime: 1,
        mode: 0o100600,
        uid: 0,
        ..same
    };
    let d = differs(&e, &other, Keep::ALL);
    assert!(d.size && d.time && d.perms && d.owner && !d.group);
    // Owners count only when they are kept.
    assert!(!differs(&e, &other, Keep::USER).owner);
    // A symlink has no permissions of its own, nor a size to compare.
    let mut l = file(0);
    l.kind = Some(EntryKind::Symlink);
    let d = differs(&l, &other, Keep::USER);
    assert!(!d.perms && !d.size && d.time);
}

#[test]
fn without_perms_new_entries_get_the_umask_and_old_ones_keep_theirs() {
    assert_eq!(mode_without_perms(0o104755, None, 0o022), 0o100755);
    assert_eq!(mode_without_perms(0o100666, None, 0o027), 0o100640);
    assert_eq!(
        mode_without_perms(0o100644, Some(0o100600), 0o022),
        0o100600
    );
    assert_eq!(mode_without_perms(0o040777, Some(0o042750), 0), 0o042750);
    // Nothing is fixed that is not kept.
    let e = file(10);
    let old = Stat {
        mode: 0o100600,
        mtime: 1,
        ..same_as(&e)
    };
    let none = Keep {
        perms: false,
        times: false,
        ..Keep::USER
    };
    assert_eq!(meta_fixes(&e, &old, none, false), MetaSteps::default());
    let new = meta_for_new(EntryKind::File, none, false);
    assert!(new.mode && !new.mtime && !new.owner);
    let group_only = Keep {
        group: true,
        ..Keep::USER
    };
    assert_eq!(group_only.ids(&e), (None, Some(1000)));
}

#[test]
fn set_id_bits_are_set_again_after_a_chown() {
    let mut e = file(10);
    e.mode = 0o104755;
    let old = Stat {
        uid: 5,
        ..same_as(&e)
    };
    let f = meta_fixes(&e, &old, Keep::ALL, false);
    assert!(f.owner && f.mode);
    e.mode = 0o100755;
    let old = Stat {
        uid: 5,
        ..same_as(&e)
    };
    assert!(!meta_fixes(&e, &old, Keep::ALL, false).mode);
}

#[test]
fn special_nodes_by_type_and_number() {
    assert_eq!(node_kind(0o020644), Some(Kind::CharDevice));
    assert_eq!(node_kind(0o060660), Some(Kind::BlockDevice));
    assert_eq!(node_kind(0o010644), Some(Kind::Fifo));
    assert_eq!(node_kind(0o140755), Some(Kind::Other));
    assert_eq!(node_kind(0o100644), None);
    assert_eq!(node_kind(0o040755), None);
    let mut e = file(0);
    e.kind = Some(EntryKind::Special);
    e.mode = 0o020644;
    e.rdev = 0x0103;
    let old = Stat {
        kind: Kind::CharDevice,
        mode: 0o020600,
        rdev: 0x0103,
        ..same_as(&e)
    };
    assert!(same_node(&e, &old));
    assert!(!same_node(
        &e,
        &Stat {
            rdev: 0x0105,
            ..old
        }
    ));
    assert!(!same_node(
        &e,
        &Stat {
            kind: Kind::Fifo,
            mode: 0o010644,
            ..old
        }
    ));
}

#[test]
fn a_raw_lstat_gives_the_same_facts_as_std() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("f");
    std::fs::write(&f, b"12345").unwrap();
    std::os::unix::fs::symlink("f", d.path().join("l")).unwrap();
    for p in [f, d.path().join("l"), d.path().to_path_buf()] {
        let raw = rustix::fs::lstat(&p).unwrap();
        let std = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!(Stat::of_raw(&raw), Stat::of(&std), "{}", p.display());
    }
}

#[test]
fn a_directory_gets_its_permission_bits_with_or_without_perms() {
    let mut e = file(0);
    e.kind = Some(EntryKind::Dir);
    e.mode = 0o040555;
    let made = Stat {
        kind: Kind::Dir,
        mode: 0o040755,
        ..Stat::of_raw(&rustix::fs::lstat("/").unwrap())
    };
    let no_perms = Keep {
        perms: false,
        ..Keep::ALL
    };
    // Made this run with owner access first: set to the entry's bits.
    assert!(dir_meta_fixes(&e, &made, no_perms, false).mode);
    assert!(dir_meta_fixes(&e, &made, Keep::ALL, false).mode);
    // Already right: nothing to do.
    let right = Stat {
        mode: 0o040555,
        ..made
    };
    assert!(!dir_meta_fixes(&e, &right, no_perms, false).mode);
}

#[test]
fn an_earlier_copy_is_linked_only_with_the_kept_attributes_equal() {
    let e = file(10);
    let old = same_as(&e);
    assert!(linkable(&e, &old, Keep::USER));
    let older = Stat {
        mtime: e.mtime - 3600,
        ..old
    };
    // `-c` finds the content equal; the time still differs.
    assert!(!linkable(&e, &older, Keep::USER));
    let untimed = Keep {
        times: false,
        ..Keep::USER
    };
    assert!(linkable(&e, &older, untimed));
    let other_mode = Stat {
        mode: old.mode ^ 0o022,
        ..old
    };
    assert!(!linkable(&e, &other_mode, Keep::USER));
    let no_perms = Keep {
        perms: false,
        ..Keep::USER
    };
    assert!(linkable(&e, &other_mode, no_perms), "without -p, as rsync");
    let dir = Stat {
        kind: Kind::Dir,
        ..old
    };
    assert!(!linkable(&e, &dir, Keep::USER));
}
