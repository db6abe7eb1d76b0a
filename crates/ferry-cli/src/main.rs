//! `ferry`: the command-line front end. It parses arguments, owns the
//! terminal (progress, summaries, JSON, exit codes) and calls the engines:
//! `ferry-core` for sync, `ferry-stream` for streams (and `ferry-link` to
//! start `pipe`'s remote side); it holds no transfer logic of its own.

#[macro_use]
mod out;
mod alloc;
mod daemon_cmd;
mod demo;
mod docs_cmd;
mod engine_args;
mod filter_args;
mod human;
mod key;
mod keygen_cmd;
mod log_file;
mod progress;
mod rsync_codes;
mod rsync_flags;
mod serve_cmd;
mod stream_cmd;
mod sync_cmd;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[global_allocator]
static ALLOC: alloc::Split = alloc::Split;

/// Exit codes, documented in `ferry --help` and README.md.
pub mod exit {
    pub const OK: i32 = 0;
    pub const USAGE: i32 = 1;
    pub const PARTIAL: i32 = 2;
    pub const IO: i32 = 3;
    pub const PROTOCOL: i32 = 4;
    pub const CONNECTION: i32 = 5;
    /// `pipe`: ssh failed or the remote ferry did not start.
    pub const REMOTE: i32 = 6;
    /// `send`/`recv`/`pipe`: the peer did not prove the same key.
    pub const AUTH: i32 = 7;
    /// `sync`: everything else was synced, but files vanished or changed
    /// while they were read (rsync's number for it).
    pub const VANISHED: i32 = 24;
    pub const INTERRUPTED: i32 = 130;
}

const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    usage error (bad arguments, --deploy to another OS or architecture);
       nothing was changed
  2    partial transfer: some entries failed (listed on stderr), the rest were synced
  3    I/O error: missing source (one missing of several: 2), unwritable
       destination, disk full
  4    protocol error: the peer sent garbage or speaks another version, or
       data failed verification
  5    connection error: could not reach the peer, the link dropped, or
       the host has no ferry (try --deploy)
  6    (pipe) ssh failed or the remote ferry did not start; pipe otherwise
       returns the remote command's own exit status
  7    authentication failed: the peer holds another key (send, recv,
       pipe, and sync with a ferry:// daemon)
  24   (sync) the rest was synced, but files vanished or changed while
       they were read (listed on stderr; their old copies were kept)
  130  interrupted (temporary files were removed; partial files of large
       files are kept, and the next run resumes them)
sync --rsync-exit-codes uses rsync's numbers instead: 23 partial, 11 I/O,
12 protocol or link lost, 30 timeout, 20 interrupted, 1 usage.";

#[derive(Parser)]
#[command(
    name = "ferry",
    version,
    about = "Move data between hosts: trees, large files, sparse images, streams.",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Copy and re-sync files, directory trees and sparse images.
    #[command(after_help = sync_cmd::SYNC_HELP, override_usage = "ferry sync [OPTIONS] SRC... DST")]
    Sync(sync_cmd::SyncArgs),
    /// Build a small sample in a temp dir, sync it, change it, re-sync it,
    /// and show what each run did.
    Demo(demo::DemoArgs),
    /// Send a byte stream (stdin or FILE) to `ferry recv` on another host,
    /// authenticated and encrypted, compressed when that pays.
    Send(stream_cmd::SendArgs),
    /// Receive a stream from `ferry send`; write it to stdout, FILE or
    /// `-- COMMAND`.
    Recv(stream_cmd::RecvArgs),
    /// Pipe stdin into COMMAND on [user@]host: ssh starts the remote side,
    /// the data goes over a direct encrypted TCP connection (or ssh with
    /// --via-ssh); returns COMMAND's exit status.
    Pipe(stream_cmd::PipeArgs),
    /// Write a random 256-bit key for send/recv/pipe to FILE (mode 0600).
    Keygen(keygen_cmd::KeygenArgs),
    /// Print shell completions (bash, zsh, fish, elvish, powershell).
    Completions(docs_cmd::CompletionsArgs),
    /// Print the man page of ferry, or of one command (roff).
    Man(docs_cmd::ManArgs),
    /// Serve syncs: as a daemon that `ferry://HOST:PORT/PATH` clients reach
    /// with a pre-shared key (--listen; containers, Kubernetes Jobs), or as
    /// the remote side that ssh starts (--stdio, internal)
    Serve(serve_cmd::ServeArgs),
}

/// Raise the soft limit on open files to the hard one, as Go programs do
/// by themselves: a receiver keeps a temp file (and its `O_DIRECT` twin)
/// open for every file in flight, and the usual soft limit of 1024 is far
/// below what a large tree needs (the hard limit is commonly 512Ki).
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: lim.maximum,
                maximum: lim.maximum,
            },
        );
    }
}

/// Parse the command line; the include/exclude options also get their
/// order, which only the matches know.
fn parse() -> Result<Cli, clap::Error> {
    let m = Cli::command().try_get_matches()?;
    let mut cli = Cli::from_arg_matches(&m)?;
    if let Some((_, sub)) = m.subcommand() {
        match &mut cli.cmd {
            Cmd::Sync(a) => a.engine.order_rules(sub),
            Cmd::Serve(a) => a.engine.order_rules(sub),
            _ => {}
        }
    }
    Ok(cli)
}

/// glibc's malloc raises its mmap threshold each time a large block is
/// freed, after which the 1 MiB blocks of a stream or a copy come from
/// per-thread arenas that keep what was freed: a stream's sender with a
/// 256 MiB buffer peaked at 467 MiB of RSS, 340 MiB with the threshold
/// fixed (measured with a consumer at 100 MB/s). Fixing it keeps large
/// blocks mapped and returned when freed; the pools reuse them, so no copy
/// measured slower (1 GiB local copy 1.46-1.64 s either way).
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a parameter of the allocator; called first
    // thing in main, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}

fn main() {
    tune_allocator();
    let cli = match parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::{ContextKind, ContextValue, ErrorKind};
            if e.kind() == ErrorKind::UnknownArgument {
                if let Some(ContextValue::String(flag)) = e.get(ContextKind::InvalidArg) {
                    // `--info=progress2`: the flag's name is what counts.
                    let name = flag.split('=').next().unwrap_or(flag);
                    errln!("{}", rsync_flags::unknown_option(name));
                    std::process::exit(exit::USAGE);
                }
            }
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    raise_open_file_limit();
    // An interrupted run must not leave temporary files behind, and
    // records in each partial file's journal what it completed (a sync of
    // its data first, which a second interrupt cuts short).
    let _ = ctrlc::set_handler(|| {
        use std::sync::atomic::{AtomicBool, Ordering};
        static AGAIN: AtomicBool = AtomicBool::new(false);
        let last = || {
            ferry_core::fsutil::remove_temp_files();
            std::process::exit(rsync_codes::interrupted());
        };
        if AGAIN.swap(true, Ordering::SeqCst) {
            last();
        }
        // Nothing more changes in the destination from here on.
        ferry_core::interrupt::stop();
        let record = std::thread::Builder::new().spawn(move || {
            ferry_core::interrupt::record();
            last();
        });
        if record.is_err() {
            last();
        }
        // After the spawn: a blocked stderr holds up only this line.
        errln!("ferry: interrupted");
    });
    let code = match cli.cmd {
        Cmd::Sync(a) => sync_cmd::run(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Serve(a) => serve_cmd::run(a),
        Cmd::Send(a) => stream_cmd::run_send(a),
        Cmd::Recv(a) => stream_cmd::run_recv(a),
        Cmd::Pipe(a) => stream_cmd::run_pipe(a),
        Cmd::Keygen(a) => keygen_cmd::run(a),
        Cmd::Completions(a) => docs_cmd::completions(a, Cli::command()),
        Cmd::Man(a) => docs_cmd::man(a, Cli::command()),
    };
    if ferry_core::interrupt::stopping() {
        // The interrupt's thread records the partial files and exits.
        loop {
            std::thread::park();
        }
    }
    std::process::exit(code);
}
