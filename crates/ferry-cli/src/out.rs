//! Printing that never panics. `println!` panics when stdout is a closed
//! pipe (`ferry sync -v … | head -1`); these macros drop what cannot be
//! written instead, so the run ends with its own exit code.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

/// `args` as text fit for a terminal: escape sequences and other unsafe
/// characters, which may come from a peer (a file name, an error it
/// reports), escaped (see `ferry_core::itemize::escaped`); newlines of a
/// multi-line text stay.
pub fn clean(args: std::fmt::Arguments<'_>) -> String {
    let s = match args.as_str() {
        Some(s) => s.to_string(),
        None => args.to_string(),
    };
    if s.chars()
        .any(|c| c != '\n' && ferry_core::itemize::unsafe_char(c))
    {
        ferry_core::itemize::escaped_but(s.as_bytes(), |c| c == '\n')
    } else {
        s
    }
}

/// Write one line to stdout, unless stdout is gone.
pub fn line(args: std::fmt::Arguments<'_>) {
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let text = clean(args);
    let mut o = std::io::stdout().lock();
    if o.write_all(text.as_bytes())
        .and_then(|_| o.write_all(b"\n"))
        .and_then(|_| o.flush())
        .is_err()
    {
        STDOUT_GONE.store(true, Ordering::Relaxed);
    }
}

/// Write one line to stderr; a closed stderr is ignored.
pub fn err_line(args: std::fmt::Arguments<'_>) {
    let text = clean(args);
    let mut e = std::io::stderr().lock();
    let _ = e
        .write_all(text.as_bytes())
        .and_then(|_| e.write_all(b"\n"));
}

/// `println!` that never panics.
macro_rules! outln {
    ($($t:tt)*) => { $crate::out::line(format_args!($($t)*)) };
}

/// `eprintln!` that never panics.
macro_rules! errln {
    ($($t:tt)*) => { $crate::out::err_line(format_args!($($t)*)) };
}
