//! `ferry sync`.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use ferry_core::itemize::{self, Listed};
use ferry_core::{Class, Error, Stats};
use serde::Serialize;

use crate::engine_args::EngineArgs;
use crate::exit;
use crate::human;
use crate::progress::{Progress, SyncMeter};

pub const SYNC_HELP: &str = "\
Paths follow rsync's trailing-slash rule:
  ferry sync src/ dst     copies the contents of src into dst
  ferry sync src dst      copies the directory itself, as dst/src
  ferry sync a.img b.img  copies a file to a file; to an existing directory it goes inside
  ferry sync a.img /dev/sdX   writes the image onto the block device, in place

Unchanged files (same size and modification time, or same BLAKE3 content with
--checksum) are skipped. Holes and all-zero blocks are never read as data nor
written: the destination gets holes. Changed files are written to a temporary
file beside the destination and renamed into place, so an interrupted run leaves
the old file or the new one, never a mix (--inplace trades that for less space).
Across hosts and for every delta, each segment written is verified against a
BLAKE3 digest of what the sender read. A file's data is on the disk before its
rename (fdatasync; small files on a local filesystem in batches: write-back
waited for, then one syncfs) and changed directories are fsync'd at the end
(--no-fsync turns this off).
--verify reads each file back from the disk once it is there and checks it
against the sender's digests again.

--json prints one object on stdout: files_total, files_transferred, files_delta,
files_deleted, files_failed, bytes_total, bytes_transferred, bytes_wire,
bytes_written, bytes_matched, bytes_resumed, reconnects, nbd_connections,
direct_connections (the TCP connections of --direct; 0 over ssh), seconds,
errors, notices (e.g. a --direct run that fell back to ssh).

A large file (32 MiB or more) is received into .NAME.ferry-partial beside its
destination, with a journal .NAME.ferry-journal of the parts that are on the
disk. When a run is killed, cut off or interrupted, both stay; the next run
re-hashes what the partial file holds, keeps the parts the sender confirms,
and sends only the rest. --no-partial removes them instead. With --retries
(default 3) a dropped link is reconnected within the same run; give --timeout
too when a dead link could stay silent rather than fail.

A host without ferry: --deploy uploads this ferry (or --deploy=PATH, e.g. a
static musl build) over ssh into the host's ~/.cache/ferry, checked by hash
and cksum, reused by later runs, for a host of the same OS and architecture
only; a note says when it was uploaded.";

#[derive(Args, Debug)]
#[command(disable_help_flag = true)]
pub struct SyncArgs {
    /// Sources, then the destination (at least two paths).
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    paths: Vec<String>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Remote shell for host:path endpoints (split on spaces), like rsync's -e.
    ///
    /// Where COMMAND is OpenSSH's ssh and neither it (`-c`, `-o Ciphers`)
    /// nor an ssh_config chooses the ciphers, and this CPU has AES
    /// instructions, ferry passes ssh its default cipher list with AES-GCM
    /// first (nothing added or removed; the server still picks what it
    /// allows): faster than the default ChaCha20-Poly1305 there. It finds
    /// out with `ssh -V` and `ssh -G` (which run ssh_config's `Match exec`
    /// tests once more), and only when every word after `ssh` is an ssh
    /// option. For a server without AES instructions, choose with `-c`.
    #[arg(
        short = 'e',
        long = "rsh",
        value_name = "COMMAND",
        default_value = "ssh"
    )]
    rsh: String,
    /// Path of ferry on the remote host.
    #[arg(long, value_name = "PATH", default_value = "ferry")]
    remote_ferry: String,
    /// For a host with no ferry (or another version): upload this ferry
    /// (or the binary at PATH, e.g. a static build) over ssh into the
    /// host's ~/.cache/ferry (or $XDG_CACHE_HOME/ferry), named by its
    /// hash and reused by later runs, and run it from there. Only for a
    /// host of the same OS and architecture.
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true,
          conflicts_with = "remote_ferry")]
    deploy: Option<Option<std::path::PathBuf>>,
    /// With host:path, carry the data over a direct TCP connection,
    /// authenticated and encrypted with a fresh key agreed over ssh
    /// (ssh only starts the remote side). Faster than ssh's own channel
    /// on fast or long links.
    #[arg(long)]
    direct: bool,
    /// With --direct: stripe the session over N TCP connections (1 to 16),
    /// for links where one TCP flow cannot fill the pipe (a long round
    /// trip, loss). auto: 1 below 5 ms round trip, 4 below 20 ms, else 8.
    #[arg(long, default_value = "auto", value_name = "N")]
    streams: ferry_link::stripe::Streams,
    /// The key of a daemon reached at ferry://HOST:PORT/PATH (from `ferry
    /// keygen`). Default: $FERRY_KEY_FILE, else $FERRY_KEY.
    #[arg(long, value_name = "FILE")]
    key_file: Option<std::path::PathBuf>,
    /// When the link drops or --timeout expires, reconnect up to N times
    /// (waiting 1, 2, 4, ... up to 30 seconds between) and go on from
    /// where it stopped: files already there are skipped, partial files
    /// resumed. Errors a retry cannot fix are not retried. 0: never.
    #[arg(long, value_name = "N", default_value_t = 3)]
    retries: u32,
    /// Show progress even when stderr is not a terminal (a line a second);
    /// `--progress=json`: one JSON object a second on stderr (bytes done
    /// and in all, rate, ETA, phase, files), with --json too.
    #[arg(long, value_name = "FORMAT", num_args = 0..=1, require_equals = true,
          default_missing_value = "lines", value_parser = ["lines", "json"])]
    progress: Option<String>,
    /// Print one JSON object of statistics on stdout at the end.
    #[arg(long)]
    json: bool,
    /// List every change on stdout.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Print nothing but errors.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Append what the run does (each change, errors, the summary) to
    /// FILE, each line stamped with the time and the process id.
    #[arg(long, value_name = "FILE")]
    log_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    rsync: crate::rsync_flags::RsyncArgs,
}

#[derive(Serialize)]
struct JsonOut<'a> {
    #[serde(flatten)]
    report: &'a ferry_core::Report,
    dry_run: bool,
    exit_code: i32,
}

/// How a change is listed: rsync's itemized line with -i, else ferry's
/// `-v` line (`would ...` in a dry run); `None` for what -v leaves out.
fn change_line(l: Listed<'_>, itemize: bool, dry: bool, sending: bool) -> Option<String> {
    let line = match l {
        Listed::Change(c) if itemize => return Some(itemize::itemized(c, sending)),
        Listed::Change(c) => itemize::verbose(c)?,
        Listed::Line(s) => itemize::escaped(s.as_bytes()),
    };
    Some(if dry { format!("would {line}") } else { line })
}

pub fn class_code(c: Class) -> i32 {
    match c {
        Class::Usage => exit::USAGE,
        Class::Partial => exit::PARTIAL,
        Class::Io => exit::IO,
        Class::Protocol => exit::PROTOCOL,
        Class::Connection => exit::CONNECTION,
        Class::Auth => exit::AUTH,
        Class::Interrupted => exit::INTERRUPTED,
    }
}

type Remotes = (
    Option<ferry_core::remote::RemotePath>,
    Vec<ferry_core::remote::RemotePath>,
);

/// The remote destination or sources: `host:path` (through ssh) or
/// `ferry://host:port/path` (a daemon).
fn remotes(paths: &[String], dest: &str) -> Result<Remotes, String> {
    use ferry_core::remote::{daemon::parse_url, parse_remote, RemotePath};
    let one = |p: &str| -> Result<Option<RemotePath>, String> {
        match parse_url(p) {
            Some(u) => Ok(Some(u?.into())),
            None => Ok(parse_remote(p)),
        }
    };
    let d = one(dest)?;
    let mut srcs = Vec::new();
    for p in paths {
        if let Some(r) = one(p)? {
            srcs.push(r);
        }
    }
    Ok((d, srcs))
}

pub fn run(a: SyncArgs) -> i32 {
    crate::rsync_codes::set(a.rsync.rsync_exit_codes);
    // Every way out, early ones included, in rsync's numbers when asked
    // (a number already mapped maps to itself).
    crate::rsync_codes::code(run_inner(a), None)
}

fn run_inner(mut a: SyncArgs) -> i32 {
    let mut paths = a.paths.clone();
    let Some(dest) = paths.pop() else {
        errln!("ferry: need at least one source and a destination");
        return exit::USAGE;
    };
    if a.engine.files_from.is_some() {
        // The listed paths are relative to the one source directory,
        // with or without its trailing slash (as in rsync).
        let [src] = &mut paths[..] else {
            errln!("ferry: --files-from takes exactly one source directory");
            return exit::USAGE;
        };
        if !src.ends_with('/') {
            src.push('/');
        }
        a.engine.recursive = a.rsync.recursive;
    }
    let (remote_dest, remote_srcs) = match remotes(&paths, &dest) {
        Ok(v) => v,
        Err(e) => {
            errln!("ferry: {e}");
            return exit::USAGE;
        }
    };
    if !remote_srcs.is_empty() && (remote_dest.is_some() || remote_srcs.len() != paths.len()) {
        errln!("ferry: either the sources or the destination may be remote (host:path), not both, and not a mix");
        return exit::USAGE;
    }
    let mut opts = match a.engine.options() {
        Ok(o) => o,
        Err(e) => {
            errln!("ferry: {e}");
            return exit::USAGE;
        }
    };
    a.rsync.select(
        &mut opts,
        a.engine.files_from.is_some(),
        a.engine.no_specials,
    );
    let progress_asked = match a.rsync.progress() {
        Ok(p) => a.progress.as_deref() == Some("lines") || p,
        Err(e) => {
            errln!("ferry: {e}");
            return exit::USAGE;
        }
    };
    // The host --deploy puts ferry on (reached through ssh).
    let deploy_to = match (&a.deploy, remote_dest.iter().chain(&remote_srcs).next()) {
        (None, _) => None,
        (Some(_), Some(r)) if r.port.is_none() => Some(r.host.clone()),
        (Some(_), Some(_)) => {
            errln!(
                "ferry: --deploy reaches a host through ssh; a ferry:// daemon runs its own ferry"
            );
            return exit::USAGE;
        }
        (Some(_), None) => {
            errln!("ferry: --deploy needs a host:path source or destination");
            return exit::USAGE;
        }
    };
    let daemon = remote_dest
        .iter()
        .chain(&remote_srcs)
        .any(|r| r.port.is_some());
    let key = if daemon {
        match crate::key::read_key(a.key_file.as_deref()) {
            Ok(k) => Some(k),
            Err(e) => {
                errln!("ferry: {e}");
                return exit::USAGE;
            }
        }
    } else {
        None
    };
    let mut ropts = ferry_core::remote::RemoteOptions {
        rsh: a.rsh.clone(),
        remote_ferry: a.remote_ferry.clone(),
        direct: a.direct,
        streams: a.streams,
        key,
        deployed: false,
    };
    let plan = if remote_dest.is_none() && remote_srcs.is_empty() {
        match ferry_core::plan_local(&paths, &dest, opts.force) {
            Ok(p) => Some(p),
            Err(e) => {
                errln!("ferry: {e}");
                return class_code(e.class());
            }
        }
    } else {
        None
    };
    let log = match a.log_file.as_deref().map(crate::log_file::LogFile::open) {
        None => None,
        Some(Ok(l)) => Some(Arc::new(l)),
        Some(Err(e)) => {
            errln!(
                "ferry: --log-file {}: {e}",
                a.log_file.unwrap_or_default().display()
            );
            return exit::USAGE;
        }
    };
    if let Some(l) = &log {
        l.line(&format!("sync {}", a.paths.join(" ")));
    }
    let stats = Arc::new(Stats::default());
    let start = std::time::Instant::now();
    // -v, -i and -n list each change as it happens, not at the end.
    let itemize = a.rsync.itemize_changes;
    let listing = (a.engine.dry_run || a.verbose || itemize) && !a.json;
    if listing || log.is_some() {
        let log = log.clone();
        let dry = a.engine.dry_run;
        // A push lists what the remote receiver reports; rsync marks what
        // it sent with `<`.
        let sending = remote_dest.is_some();
        stats.on_change(move |l| {
            let Some(line) = change_line(l, itemize, dry, sending) else {
                return;
            };
            if listing {
                outln!("{line}");
            }
            if let Some(l) = &log {
                l.line(&line);
            }
        });
        opts.list_changes = remote_dest.is_some();
    }
    // A bar redrawn on the terminal the list is printed to would tear it.
    let bar_in_the_way = listing && std::io::stdout().is_terminal();
    let progress = if a.progress.as_deref() == Some("json") {
        Progress::start_json(SyncMeter(stats.clone()))
    } else {
        Progress::start(
            SyncMeter(stats.clone()),
            progress_asked,
            a.quiet || a.json || bar_in_the_way,
        )
    };
    // What attempts that then failed did (files committed, bytes written
    // and resumed...), added to the last attempt's report.
    let mut earlier = Carried::default();
    // Once for the run: every attempt runs the same deployed ferry.
    let deployed = match &deploy_to {
        Some(host) => deploy(&mut ropts, host, &a.deploy, &stats),
        None => Ok(()),
    };
    let res = match deployed {
        Err(e) => Err(e),
        Ok(()) => loop {
            let res = match (&plan, &remote_dest) {
                (Some(plan), _) => ferry_core::sync_local(plan, &opts, &stats),
                (None, Some(d)) => ferry_core::remote::sync_push(&paths, d, &opts, &ropts, &stats),
                (None, None) => {
                    ferry_core::remote::sync_pull(&remote_srcs, &dest, &opts, &ropts, &stats)
                }
            };
            let done = stats.reconnects.load(Ordering::Relaxed);
            let reached = stats.sessions.load(Ordering::Relaxed) > 0;
            let wait = retry_after(e_of(&res), done, a.retries, reached);
            match (&res, wait) {
                (Err(e), Some(wait)) => {
                    if !a.quiet {
                        errln!(
                            "ferry: {e}; reconnecting in {} (retry {} of {})",
                            human::secs(wait.as_secs_f64()),
                            done + 1,
                            a.retries
                        );
                    }
                    std::thread::sleep(wait);
                    earlier.take(&stats);
                    // --max-delete counts the deletions of every attempt.
                    opts.max_delete = a
                        .engine
                        .max_delete
                        .map(|m| m.saturating_sub(earlier.deleted()));
                    stats.restart();
                    Stats::add(&stats.reconnects, 1);
                }
                _ => break res,
            }
        },
    };
    earlier.give(&stats);
    progress.finish();
    let report = stats.report(start.elapsed().as_secs_f64());
    let code = match &res {
        Ok(_) if report.files_vanished > 0 => exit::VANISHED,
        Ok(_) => exit::OK,
        Err(e) => class_code(e.class()),
    };
    let code = crate::rsync_codes::code(code, e_of(&res));
    let code = crate::rsync_codes::max_delete(code, &report);
    // Each line whole: a peer's text cannot start another.
    let one = |l: &str| itemize::escaped(l.as_bytes());
    for line in &report.notices {
        errln!("ferry: note: {}", one(line));
    }
    for line in &report.errors {
        errln!("ferry: {}", one(line));
    }
    if let Some(l) = &log {
        for line in &report.notices {
            l.line(&format!("note: {line}"));
        }
        for line in &report.errors {
            l.line(&format!("error: {line}"));
        }
        match &res {
            Err(e) if !matches!(e, Error::Partial { .. }) => l.line(&format!("error: {e}")),
            _ => l.line(&summary(&report, a.engine.dry_run)),
        }
        l.line(&format!("exit {code}"));
    }
    // A fatal error is the run's last word: no summary of a run that did
    // not finish (--json still gets its object, with the exit code).
    let fatal = match &res {
        Err(e) if !matches!(e, Error::Partial { .. }) => {
            errln!("ferry: {e}");
            true
        }
        Err(e) if report.errors.is_empty() => {
            errln!("ferry: {e}");
            false
        }
        _ => false,
    };
    if a.json {
        let out = JsonOut {
            report: &report,
            dry_run: a.engine.dry_run,
            exit_code: code,
        };
        match serde_json::to_string(&out) {
            Ok(s) => outln!("{s}"),
            Err(e) => errln!("ferry: cannot encode statistics: {e}"),
        }
    } else if !a.quiet && !fatal {
        if a.rsync.stats {
            outln!("{}", crate::rsync_codes::stats_block(&report));
        }
        outln!("{}", summary(&report, a.engine.dry_run));
    }
    code
}

/// `--deploy`: put this ferry (or the binary it names) on `host` and run
/// that one there; what it did becomes notices.
fn deploy(
    ropts: &mut ferry_core::remote::RemoteOptions,
    host: &str,
    binary: &Option<Option<std::path::PathBuf>>,
    stats: &Stats,
) -> Result<(), Error> {
    let binary = binary.as_ref().and_then(|b| b.as_deref());
    let d = ferry_core::remote::deploy::deploy(&ropts.rsh, host, binary)?;
    for n in d.notices {
        stats.notice(n);
    }
    ropts.remote_ferry = d.path;
    ropts.deployed = true;
    Ok(())
}

/// The work of attempts that failed: what they committed stays done, so
/// the run's report counts it (the list itself is counted once, by the
/// last attempt). A push learns the remote receiver's counts only from an
/// attempt that finished, so there it is what this side saw.
#[derive(Default)]
struct Carried([u64; 7]);

impl Carried {
    fn counters(s: &Stats) -> [&std::sync::atomic::AtomicU64; 7] {
        [
            &s.files_transferred,
            &s.files_delta,
            &s.files_deleted,
            &s.bytes_written,
            &s.bytes_matched,
            &s.bytes_wire,
            &s.bytes_resumed,
        ]
    }

    /// Add what the attempt that just failed did.
    fn take(&mut self, s: &Stats) {
        for (c, a) in self.0.iter_mut().zip(Self::counters(s)) {
            *c += a.load(Ordering::Relaxed);
        }
    }

    /// Entries the failed attempts deleted.
    fn deleted(&self) -> u64 {
        self.0[2]
    }

    fn give(&self, s: &Stats) {
        for (c, a) in self.0.iter().zip(Self::counters(s)) {
            Stats::add(a, *c);
        }
    }
}

/// How long to wait before reconnecting after `e`, when `done` retries
/// were made of the `allowed` and the peer was `reached` at least once in
/// this run: `None` when there is no error, when `e` is not one a new
/// connection could fix, when none are left, or when the peer was never
/// reached (a wrong host, a refused login: trying again would only delay
/// the same answer). 1 s, doubling, at most 30 s.
pub fn retry_after(e: Option<&Error>, done: u64, allowed: u32, reached: bool) -> Option<Duration> {
    let e = e?;
    // An interrupt cut the link too: no new session after it.
    if ferry_core::interrupt::stopping() {
        return None;
    }
    (e.retryable() && reached && done < allowed as u64)
        .then(|| Duration::from_secs((1u64 << done.min(5)).min(30)))
}

fn e_of<T>(r: &Result<T, Error>) -> Option<&Error> {
    r.as_ref().err()
}

/// One line: what the run did. Sizes and rates in binary units; the rate
/// is over the data actually written (holes and zero runs are not), and a
/// dry run, which moves nothing, has none.
pub fn summary(r: &ferry_core::Report, dry_run: bool) -> String {
    let mut failed = if r.files_failed > 0 {
        format!(", {} FAILED", r.files_failed)
    } else {
        String::new()
    };
    if r.files_vanished > 0 {
        failed.push_str(&format!(
            ", {} vanished or changed while read (kept as they were)",
            r.files_vanished
        ));
    }
    let head = if r.dirs_total == 0 {
        human::count(r.files_total, "file", "files")
    } else {
        format!(
            "{}, {}",
            human::count(r.files_total, "file", "files"),
            human::count(r.dirs_total, "directory", "directories"),
        )
    };
    if dry_run {
        return format!(
            "dry run: {head}: {} would be transferred ({}), {} deleted{failed}",
            r.files_transferred,
            human::bytes(r.bytes_transferred),
            r.files_deleted,
        );
    }
    let delta = if r.files_delta > 0 {
        format!(" ({} as delta)", r.files_delta)
    } else {
        String::new()
    };
    let mut resumed = String::new();
    if r.bytes_resumed > 0 {
        resumed = format!(
            ", {} resumed from partial files",
            human::bytes(r.bytes_resumed)
        );
    }
    if r.reconnects > 0 {
        resumed += &format!(
            ", {}",
            human::count(r.reconnects, "reconnect", "reconnects")
        );
    }
    format!(
        "{head}: {} transferred{delta}, {} deleted{failed}; {} of {} written in {} ({}), {} on the wire{resumed}",
        r.files_transferred,
        r.files_deleted,
        human::bytes(r.bytes_written),
        human::bytes(r.bytes_transferred),
        human::secs(r.seconds),
        human::rate(r.bytes_written, r.seconds),
        human::bytes(r.bytes_wire),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_link::LinkError;

    #[test]
    fn only_a_dropped_link_of_a_run_that_reached_its_peer_is_retried() {
        let dropped = Error::Link(LinkError::Closed);
        let s = |n| Some(Duration::from_secs(n));
        assert_eq!(retry_after(Some(&dropped), 0, 3, true), s(1));
        assert_eq!(retry_after(Some(&dropped), 2, 3, true), s(4));
        assert_eq!(retry_after(Some(&dropped), 3, 3, true), None, "none left");
        assert_eq!(retry_after(Some(&dropped), 9, 20, true), s(30), "capped");
        assert_eq!(
            retry_after(Some(&dropped), 0, 3, false),
            None,
            "never reached"
        );
        assert_eq!(retry_after(Some(&dropped), 0, 0, true), None, "--retries 0");
        assert_eq!(retry_after(None, 0, 3, true), None, "no error");
        for e in [
            Error::Usage("bad".into()),
            Error::Protocol("garbage".into()),
            Error::Interrupted,
            Error::NoRemote("no ferry there".into()),
        ] {
            assert_eq!(retry_after(Some(&e), 0, 3, true), None, "{e}");
        }
    }
}
