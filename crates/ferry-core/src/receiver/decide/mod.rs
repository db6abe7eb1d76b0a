//! The receiver's decisions as plain functions: given values (an entry of
//! the list, a [`Stat`] of what the destination holds, the options that
//! matter, counters), each returns what to do. None of them touches a
//! socket, a file or a clock, so each is unit-tested on values built by
//! hand; the dispatcher, the writers and the signer gather the facts, call
//! these, and carry out the answer.
//!
//! - [`compare`]: what a destination entry is, whether a file is up to
//!   date, what must be cleared to make room, which metadata to apply.
//! - [`transfer`]: how a changed file is written (temp file, in place,
//!   device, stream) and whether it comes whole or as a delta.
//! - [`progress`]: whether an op fits, when a file's segments are all
//!   done and agree, what a failure leads to, and the open-file and
//!   segment budgets.
//! - [`cleanup`]: whether `--delete` runs and what it removes, and how the
//!   destination root is prepared.

mod cleanup;
mod compare;
mod defang;
mod progress;
mod skip;
mod transfer;

pub(crate) use cleanup::*;
pub(crate) use compare::*;
pub(crate) use defang::*;
pub(crate) use progress::*;
pub(crate) use skip::*;
pub(crate) use transfer::*;

/// Entries and [`Stat`]s built by hand for the tests of every module.
#[cfg(test)]
pub(crate) mod fixture {
    use ferry_link::{Entry, EntryKind};

    use super::{Kind, Stat};

    /// A regular file entry of `size` bytes, mode 0644, mtime 1000.5.
    pub(crate) fn file(size: u64) -> Entry {
        Entry {
            id: 7,
            path: b"d/f".to_vec(),
            kind: Some(EntryKind::File),
            mode: 0o100644,
            uid: 1000,
            gid: 1000,
            size,
            mtime: 1000,
            mtime_nsec: 500,
            target: Vec::new(),
            link_to: 0,
            xattrs: Vec::new(),
            digest: None,
            owner: Vec::new(),
            group: Vec::new(),
            rdev: 0,
        }
    }

    /// What the destination holds when it matches [`file`] exactly.
    pub(crate) fn same_as(e: &Entry) -> Stat {
        Stat {
            kind: Kind::File,
            size: e.size,
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            mtime: e.mtime,
            mtime_nsec: e.mtime_nsec,
            dev: 1,
            ino: 2,
            rdev: 0,
        }
    }
}
