//! Printing that never panics. `println!` panics when stdout is a closed
//! pipe (`ferry sync -v … | head -1`); these macros drop what cannot be
//! written instead, so the run ends with its own exit code.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

/// Write one line to stdout, unless stdout is gone.
pub fn line(args: std::fmt::Arguments<'_>) {
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut o = std::io::stdout().lock();
    if o.write_fmt(args)
        .and_then(|_| o.write_all(b"\n"))
        .and_then(|_| o.flush())
        .is_err()
    {
        STDOUT_GONE.store(true, Ordering::Relaxed);
    }
}

/// Write one line to stderr; a closed stderr is ignored.
pub fn err_line(args: std::fmt::Arguments<'_>) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_fmt(args).and_then(|_| e.write_all(b"\n"));
}

/// `println!` that never panics.
macro_rules! outln {
    ($($t:tt)*) => { $crate::out::line(format_args!($($t)*)) };
}

/// `eprintln!` that never panics.
macro_rules! errln {
    ($($t:tt)*) => { $crate::out::err_line(format_args!($($t)*)) };
}
