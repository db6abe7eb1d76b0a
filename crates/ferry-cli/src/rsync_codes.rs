//! For scripts written for rsync: `--rsync-exit-codes` (rsync's exit
//! numbers instead of ferry's) and `--stats` (rsync's statistics block).

use std::sync::atomic::{AtomicBool, Ordering};

use ferry_core::{Error, Report};
use ferry_link::LinkError;

use crate::exit;

static RSYNC_CODES: AtomicBool = AtomicBool::new(false);

/// Use rsync's exit numbers from now on (also for Ctrl-C).
pub fn set(on: bool) {
    RSYNC_CODES.store(on, Ordering::SeqCst);
}

/// The exit code of an interrupted run.
pub fn interrupted() -> i32 {
    if RSYNC_CODES.load(Ordering::SeqCst) {
        20
    } else {
        exit::INTERRUPTED
    }
}

/// ferry's exit `code` of a run that ended with `err`, as rsync would
/// number it when `--rsync-exit-codes` was given.
pub fn code(code: i32, err: Option<&Error>) -> i32 {
    if !RSYNC_CODES.load(Ordering::SeqCst) {
        return code;
    }
    match err {
        // ssh's own failure: rsync passes on its status. (A remote
        // program that is not there is rsync's 12, as below.)
        Some(Error::Ssh { .. }) => 255,
        _ => rsync_number(
            code,
            matches!(err, Some(Error::Link(LinkError::TimedOut(_)))),
        ),
    }
}

/// rsync's number for ferry's exit `code` (`timeout`: the link went
/// silent for --timeout).
/// rsync's 25 for a run whose only failure is that `--max-delete` held
/// deletions back (in rsync's numbers only: ferry's own code is 2).
pub fn max_delete(code: i32, r: &Report) -> i32 {
    let only_the_limit = r.deletes_held > 0 && r.files_failed <= 1;
    if RSYNC_CODES.load(Ordering::SeqCst) && code == 23 && only_the_limit {
        25
    } else {
        code
    }
}

pub fn rsync_number(code: i32, timeout: bool) -> i32 {
    match code {
        exit::OK => 0,
        exit::USAGE => 1,
        exit::PARTIAL => 23,
        exit::IO => 11,
        exit::CONNECTION if timeout => 30,
        // rsync: "error in rsync protocol data stream", what it says when
        // the link or the remote side goes away too.
        exit::PROTOCOL | exit::CONNECTION | exit::REMOTE | exit::AUTH => 12,
        exit::INTERRUPTED => 20,
        exit::VANISHED => 24,
        other => other,
    }
}

fn n(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// rsync's `--stats` block, from what ferry counts.
pub fn stats_block(r: &Report) -> String {
    let speedup = if r.bytes_wire > 0 {
        r.bytes_total as f64 / r.bytes_wire as f64
    } else {
        0.0
    };
    let rate = if r.seconds > 0.0 {
        r.bytes_wire as f64 / r.seconds
    } else {
        0.0
    };
    format!(
        "\nNumber of files: {} (reg: {}, dir: {})\n\
         Number of deleted files: {}\n\
         Number of regular files transferred: {}\n\
         Total file size: {} bytes\n\
         Total transferred file size: {} bytes\n\
         Literal data: {} bytes\n\
         Matched data: {} bytes\n\
         Resumed data: {} bytes\n\
         Total bytes on the link: {}\n\n\
         sent and received {} bytes  {:.2} bytes/sec\n\
         total size is {}  speedup is {:.2}\n",
        n(r.files_total + r.dirs_total),
        n(r.files_total),
        n(r.dirs_total),
        n(r.files_deleted),
        n(r.files_transferred),
        n(r.bytes_total),
        n(r.bytes_transferred),
        n(r.bytes_written),
        n(r.bytes_matched),
        n(r.bytes_resumed),
        n(r.bytes_wire),
        n(r.bytes_wire),
        rate,
        n(r.bytes_total),
        speedup,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_as_rsync_has_them() {
        assert_eq!(rsync_number(exit::OK, false), 0);
        assert_eq!(rsync_number(exit::PARTIAL, false), 23);
        assert_eq!(rsync_number(exit::IO, false), 11);
        assert_eq!(rsync_number(exit::PROTOCOL, false), 12);
        assert_eq!(rsync_number(exit::CONNECTION, false), 12);
        assert_eq!(rsync_number(exit::CONNECTION, true), 30);
        assert_eq!(rsync_number(exit::INTERRUPTED, false), 20);
        // Mapping twice changes nothing.
        for c in [0, 1, 2, 3, 4, 5, 6, 7, 130] {
            let once = rsync_number(c, false);
            assert_eq!(rsync_number(once, false), once, "{c}");
        }
        assert_eq!(n(1234567), "1,234,567");
        assert_eq!(n(12), "12");
    }
}
