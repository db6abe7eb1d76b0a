//! The session drivers: a push or a pull run here (the local sender or
//! receiver against the spawned remote side), and `serve --stdio`, the
//! remote side itself.

use std::sync::Arc;
use std::time::Instant;

use ferry_link::ReceiverReport;

use super::command::serve_args_with;
use super::daemon::{daemon_connect, Request};
use super::ssh::{spawn, Remote};
use super::tcp::direct_accept;
use super::{RemoteOptions, RemotePath};
use crate::error::{Error, Result};
use crate::plan::{self, Dest};
use crate::stats::{Report, Stats};
use crate::{receiver, sender, SyncOptions};

/// Copy the receiver's tally into the local counters (push: the receiver
/// is remote).
fn fill(stats: &Stats, r: &ReceiverReport) {
    use std::sync::atomic::Ordering::Relaxed;
    for (c, v) in [
        (&stats.files_total, r.files_total),
        (&stats.dirs_total, r.dirs_total),
        (&stats.delete_skipped, r.delete_skipped),
        (&stats.delta_mismatch, r.delta_mismatch),
        (&stats.files_transferred, r.files_transferred),
        (&stats.files_delta, r.files_delta),
        (&stats.files_deleted, r.files_deleted),
        (&stats.files_failed, r.files_failed),
        (&stats.files_vanished, r.files_vanished),
        (&stats.deletes_held, r.deletes_held),
        (&stats.bytes_total, r.bytes_total),
        (&stats.bytes_transferred, r.bytes_transferred),
        (&stats.bytes_written, r.bytes_written),
        (&stats.bytes_matched, r.bytes_matched),
        (&stats.bytes_resumed, r.bytes_resumed),
    ] {
        c.store(v, Relaxed);
    }
    if let Ok(mut e) = stats.errors.lock() {
        *e = r.errors.clone();
    }
}

fn finish_report(stats: &Stats, ep_wire: u64, start: Instant) -> Result<Report> {
    use std::sync::atomic::Ordering::Relaxed;
    stats.bytes_wire.store(ep_wire, Relaxed);
    crate::finished(stats, start)
}

/// The sender's side of a byte-stream link: rate limit and compression.
fn sending_link(
    mut tx: ferry_link::MsgTx,
    link_rate: &Arc<std::sync::atomic::AtomicU64>,
    opts: &SyncOptions,
) -> ferry_link::MsgTx {
    if let Some(rate) = opts.bwlimit {
        tx = tx.with_rate_limit(rate);
    }
    tx.with_compression(opts.compress, opts.threads, link_rate.clone(), opts.bwlimit)
}

/// The other side of a push or a pull: a ferry started through ssh, or a
/// daemon reached at `ferry://`.
enum Peer {
    Ssh(Remote),
    Daemon(ferry_link::Flushed),
}

/// How long our last messages may take to leave for a daemon.
const DAEMON_FLUSH: std::time::Duration = std::time::Duration::from_secs(30);

impl Peer {
    fn finish<T>(self, res: Result<T>) -> Result<T> {
        match self {
            Peer::Ssh(r) => r.finish(res),
            Peer::Daemon(flushed) => {
                flushed.wait_for(Some(DAEMON_FLUSH));
                res
            }
        }
    }
}

/// Reach the other side of `at` and start `args` there.
fn open_peer(
    at: &RemotePath,
    ropts: &RemoteOptions,
    args: &[String],
    stats: &Stats,
) -> Result<(Peer, ferry_link::Endpoint)> {
    let Some(port) = at.port else {
        let (remote, ep) = spawn(&at.host, ropts, args, stats)?;
        return Ok((Peer::Ssh(remote), ep));
    };
    let key = ropts.key.as_ref().ok_or_else(|| {
        Error::Usage(
            "a ferry:// URL needs the daemon's key: --key-file FILE (or FERRY_KEY_FILE)".into(),
        )
    })?;
    let (ep, flushed) =
        daemon_connect(&at.host, port, key, args, ropts.streams).inspect_err(|e| {
            // The daemon is there and asks us to come back: --retries applies.
            if matches!(e, Error::Busy(_)) {
                Stats::add(&stats.sessions, 1);
            }
        })?;
    Ok((Peer::Daemon(flushed), ep))
}

/// Push local `sources` to `dest` on another host.
pub fn sync_push(
    sources: &[String],
    dest: &RemotePath,
    opts: &SyncOptions,
    ropts: &RemoteOptions,
    stats: &Stats,
) -> Result<Report> {
    push_pass(sources, dest, opts, ropts, stats, Instant::now())
}

fn push_pass(
    sources: &[String],
    dest: &RemotePath,
    opts: &SyncOptions,
    ropts: &RemoteOptions,
    stats: &Stats,
    start: Instant,
) -> Result<Report> {
    crate::endpoint::check_sources_exist(sources)?;
    let specs = plan::source_specs(sources, crate::endpoint::is_dir)?;
    let file_or_dir = sources.len() == 1 && !sources[0].ends_with('/') && !dest.path.ends_with('/');
    let opts = opts.clone();
    let args = serve_args_with(
        &opts,
        false,
        file_or_dir,
        ropts.direct,
        std::slice::from_ref(&dest.path),
    );
    let (remote, mut ep) = open_peer(dest, ropts, &args, stats)?;
    ep.tx = sending_link(ep.tx, &ep.link_rate, &opts);
    let (sent, recv) = (ep.sent.clone(), ep.received.clone());
    let res = sender::run_sender(ep, &specs, &opts, stats, true);
    // Counted even when the attempt fails (a reconnect adds them up).
    let wire = sent.get() + recv.get();
    stats
        .bytes_wire
        .store(wire, std::sync::atomic::Ordering::Relaxed);
    let report = remote.finish(res)?;
    fill(stats, &report);
    finish_report(stats, sent.get() + recv.get(), start)
}

/// Pull `sources` (all on one host) to local `dest`.
pub fn sync_pull(
    sources: &[RemotePath],
    dest: &str,
    opts: &SyncOptions,
    ropts: &RemoteOptions,
    stats: &Stats,
) -> Result<Report> {
    pull_pass(sources, dest, opts, ropts, stats, Instant::now())
}

fn pull_pass(
    sources: &[RemotePath],
    dest: &str,
    opts: &SyncOptions,
    ropts: &RemoteOptions,
    stats: &Stats,
    start: Instant,
) -> Result<Report> {
    let host = &sources[0].host;
    if sources
        .iter()
        .any(|s| s.host != *host || s.port != sources[0].port)
    {
        return Err(Error::Usage(
            "all remote sources must be on the same host".into(),
        ));
    }
    let paths: Vec<String> = sources.iter().map(|s| s.path.clone()).collect();
    // A source with wildcards may name several: the destination is a
    // directory, as for several sources.
    let globbed = paths.iter().any(|p| crate::globs::has_glob(p));
    let single = paths.len() == 1 && !paths[0].ends_with('/') && !dest.ends_with('/') && !globbed;
    let dest = if single {
        Dest::FileOrDir(dest.into())
    } else {
        Dest::Dir(dest.into())
    };
    let mut opts = opts.clone();
    opts.expect_top = expected_names(&paths);
    opts.listed_by_receiver = !opts.listed.is_empty();
    opts.expect_patterns = paths
        .iter()
        .filter_map(|p| {
            crate::globs::NamePattern::new(&String::from_utf8_lossy(
                &crate::plan::basename(p).ok()?,
            ))
        })
        .collect();
    let args = serve_args_with(&opts, true, false, ropts.direct, &paths);
    let (remote, ep) = open_peer(&sources[0], ropts, &args, stats)?;
    let (sent, recv) = (ep.sent.clone(), ep.received.clone());
    let res = receiver::run_receiver(ep, &dest, &opts, stats);
    let wire = sent.get() + recv.get();
    stats
        .bytes_wire
        .store(wire, std::sync::atomic::Ordering::Relaxed);
    remote.finish(res)?;
    finish_report(stats, sent.get() + recv.get(), start)
}

/// What a pull of `paths` may bring: each source's last component, or
/// anything (`None`) when a source's contents were asked for (`dir/`, `.`).
fn expected_names(paths: &[String]) -> Option<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    for p in paths {
        if let Some(own) = crate::endpoint::own_name(p) {
            names.push(own);
            continue;
        }
        let trimmed = p.trim_end_matches('/');
        // Empty for `dir/.`, `.`, `..`, `/`: contents, as the sender reads it.
        let name = crate::plan::basename(p).unwrap_or_default();
        // `~` or `~user` alone: the remote shell names that home, whose
        // last component is not known here.
        let home = p.starts_with('~') && !trimmed.contains('/');
        if p.ends_with('/') || name.is_empty() || home {
            return None;
        }
        // `ARCHIVE#MEMBER` on the other side may be a member, named after
        // itself (whether it is can only be told there).
        if let Some((_, member)) = trimmed.rsplit_once('#') {
            if let Some(base) = member.rsplit('/').find(|c| !c.is_empty()) {
                names.push(base.as_bytes().to_vec());
            }
        }
        names.push(name);
    }
    Some(names)
}

/// The remote side: speak the protocol on stdin/stdout, or with `direct`
/// over a TCP channel offered on stdout. `paths` are the sources (`send`)
/// or the one destination (`receive`).
pub fn serve_stdio(
    send: bool,
    file_or_dir: bool,
    direct: bool,
    paths: &[String],
    opts: &SyncOptions,
) -> Result<()> {
    // Wildcards in a pull's sources, expanded here as the user's shell
    // would have (the path crossed ssh quoted).
    let paths: Vec<String> = if send {
        paths.iter().flat_map(|p| crate::globs::expand(p)).collect()
    } else {
        paths.to_vec()
    };
    let (ep, flushed) = if direct {
        direct_accept()?
    } else {
        // Only the pipe the data goes through: many sessions of one user
        // (a backup account, a fan-out) share that user's pipe budget.
        if send {
            ferry_link::rsh::widen_pipe(std::io::stdout());
        } else {
            ferry_link::rsh::widen_pipe(std::io::stdin());
        }
        ferry_link::stream_link_flushed(std::io::stdin(), std::io::stdout())
    };
    let req = Request {
        send,
        file_or_dir,
        paths,
        opts: opts.clone(),
        stream: false,
    };
    serve_link(ep, flushed, &req, &Stats::default(), false).map(|_| ())
}

/// The serving side of a session on `ep`: the sender of `req.paths`, or
/// the receiver into the one path, counting into `stats` (a sender its
/// progress too when `count`). The report is the receiver's (the peer's,
/// when this side sends).
pub(super) fn serve_link(
    mut ep: ferry_link::Endpoint,
    flushed: ferry_link::Flushed,
    req: &Request,
    stats: &Stats,
    count: bool,
) -> Result<ReceiverReport> {
    let (opts, paths) = (&req.opts, &req.paths);
    let res = if req.send {
        ep.tx = sending_link(ep.tx, &ep.link_rate, opts);
        match plan::source_specs(paths, crate::endpoint::is_dir) {
            Ok(specs) => sender::run_sender(ep, &specs, opts, stats, count),
            Err(e) => Err(e),
        }
    } else {
        let [dest] = &paths[..] else {
            return Err(Error::Usage("serve --receive takes one destination".into()));
        };
        let dest = if crate::endpoint::Kind::of(dest) == crate::endpoint::Kind::Nbd {
            Dest::Nbd(dest.clone())
        } else if req.file_or_dir {
            Dest::FileOrDir(dest.into())
        } else {
            Dest::Dir(dest.into())
        };
        receiver::run_receiver(ep, &dest, opts, stats)
    };
    // Our last message (the report, or the error) must leave before exit;
    // with --timeout, a peer that stopped reading is not waited for.
    flushed.wait_for(opts.timeout);
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_expects_the_names_it_asked_for() {
        let v = |p: &[&str]| expected_names(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(v(&["notes.txt"]), Some(vec![b"notes.txt".to_vec()]));
        assert_eq!(
            v(&["/a/b/c", "d"]),
            Some(vec![b"c".to_vec(), b"d".to_vec()])
        );
        assert_eq!(v(&["/srv/dir/"]), None);
        assert_eq!(v(&["x", "."]), None);
        assert_eq!(v(&["/srv/dir/."]), None);
        assert_eq!(v(&["~"]), None);
        assert_eq!(v(&["~/notes"]), Some(vec![b"notes".to_vec()]));
        assert_eq!(
            v(&["nbd+unix:///disk?socket=/s"]),
            Some(vec![b"disk".to_vec()])
        );
        assert_eq!(
            v(&["/img/vm.ova#dir/disk1.img"]),
            Some(vec![b"disk1.img".to_vec(), b"disk1.img".to_vec()])
        );
        assert_eq!(
            v(&["vm.ova#disk.img"]),
            Some(vec![b"disk.img".to_vec(), b"vm.ova#disk.img".to_vec()])
        );
    }
}
