//! `ferry send`, `ferry recv`, `ferry pipe`: move one byte stream (a `zfs
//! send`, a tar, any pipe) to another host at line rate, authenticated and
//! encrypted. The engine is `ferry-stream`; this module parses arguments,
//! reads the key, draws the status line and maps errors to exit codes.
//!
//! Output conventions:
//! * the status line (`--progress`, or when stderr is a terminal) and the
//!   summary line go to stderr;
//! * `--json` prints one JSON object at the end: on stdout for `send` and
//!   `pipe`, and for `recv` on stdout only when the data goes to a FILE or a
//!   COMMAND, otherwise on stderr (stdout is the data).
//!
//! Exit codes: 0 ok, 1 usage, 3 I/O error (including producer failed and
//! consumer exited early, on either side), 4 protocol/integrity error
//! (stream truncated, frame tampered, digest mismatch), 5 connection error
//! (refused, unreachable, wrong key, port in use, receiver lost), 6 remote
//! command failed to start or ssh failed (`pipe` returns the command's own
//! status when it ran).
//!
//! The parts: `args` (the command lines and the engine options they
//! make), `report` (status line, summary, JSON, exit codes), `send`,
//! `recv` and `pipe` (one command each; `pipe` starts its remote side and
//! connects to it with `ferry_link::rsh` and `ferry_link::direct`, which
//! `recv --key-stdin --announce` answers). This file keeps the few helpers
//! they share.

mod args;
mod daemon;
mod pipe;
mod recv;
mod report;
mod send;

use std::fs::File;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::AsFd;
use std::path::Path;

use crate::exit as code;

pub use args::{PipeArgs, RecvArgs, SendArgs};
pub use daemon::{daemon_receiver, daemon_sender};
pub use pipe::run_pipe;
pub use recv::run_recv;
pub use send::run_send;

fn usage(msg: &str) -> i32 {
    errln!("ferry: {msg}");
    code::USAGE
}

/// The data to send: FILE, or our stdin.
fn open_input(file: Option<&Path>) -> Result<File, String> {
    match file {
        Some(f) => File::open(f).map_err(|e| format!("cannot open {}: {e}", f.display())),
        None => stdin_file().map_err(|e| format!("stdin: {e}")),
    }
}

fn resolve(s: &str) -> Result<SocketAddr, String> {
    s.to_socket_addrs()
        .map_err(|e| format!("cannot resolve {s}: {e}"))?
        .next()
        .ok_or_else(|| format!("cannot resolve {s}"))
}

/// Our stdin / stdout as plain files (no std buffering, no line buffering).
fn stdin_file() -> io::Result<File> {
    Ok(File::from(io::stdin().as_fd().try_clone_to_owned()?))
}
fn stdout_file() -> io::Result<File> {
    Ok(File::from(io::stdout().as_fd().try_clone_to_owned()?))
}
