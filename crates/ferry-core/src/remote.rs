//! Sessions across hosts over ssh.
//!
//! A remote path is `[user@]host:path` (a `:` before any `/`, as in rsync).
//! ferry runs `ferry serve --stdio --send|--receive [OPTIONS] -- PATHS` on
//! the other host through ssh (or the `-e` command) and plays the other role
//! here, over ssh's stdin and stdout: the same sender and receiver as a
//! local run, over [`ferry_proto::stream_link`] instead of the in-process
//! link. Options travel on the serve command line; [`serve_args`] writes
//! them and the CLI's `serve` parses them.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferry_proto::{Endpoint, LinkError, ReceiverReport};

use crate::error::{Error, Result};
use crate::plan::{self, Dest};
use crate::stats::{Report, Stats};
use crate::{receiver, sender, DeltaMode, SyncOptions};

/// `[user@]host:path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemotePath {
    pub host: String,
    pub path: String,
}

/// Parse `[user@]host:path`; `None` for a local path (no `:` before the
/// first `/`).
pub fn parse_remote(s: &str) -> Option<RemotePath> {
    let colon = s.find(':')?;
    // `scheme://` is a URI (nbd://, nbd+unix://), not host:path.
    if colon == 0 || s.find('/').is_some_and(|sl| sl < colon) || s[colon..].starts_with("://") {
        return None;
    }
    let path = &s[colon + 1..];
    Some(RemotePath {
        host: s[..colon].to_string(),
        path: if path.is_empty() {
            ".".into()
        } else {
            path.into()
        },
    })
}

/// How to reach the other host.
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// The remote shell command, split on white space (`-e`, default `ssh`).
    pub rsh: String,
    /// The ferry binary on the other host (`--remote-ferry`).
    pub remote_ferry: String,
    /// Carry the data over a direct TCP connection, authenticated and
    /// encrypted with a fresh key agreed over ssh (`--direct`), instead of
    /// through ssh itself.
    pub direct: bool,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            rsh: "ssh".into(),
            remote_ferry: "ferry".into(),
            direct: false,
        }
    }
}

/// The line a direct-mode server prints on stdout (over ssh): its port
/// and the hex key for this one session.
const DIRECT_HELLO: &str = "FERRY-DIRECT";

/// The line a `--direct` client sends over ssh when it cannot connect: the
/// server then speaks the protocol over ssh after all.
const DIRECT_FALLBACK: &str = "FERRY-VIA-SSH";

/// How long a direct-mode server waits for its client.
const DIRECT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

fn chan_err(e: ferry_channel::ChannelError) -> Error {
    match e {
        ferry_channel::ChannelError::Io(io) => {
            Error::Link(LinkError::Io(format!("direct channel: {io}")))
        }
        other => Error::Protocol(format!("direct channel: {other}")),
    }
}

/// An endpoint over an authenticated, encrypted channel on `stream`.
fn channel_link(
    stream: std::net::TcpStream,
    psk: &ferry_channel::Psk,
    role: ferry_channel::Role,
) -> Result<(Endpoint, ferry_proto::Flushed)> {
    let _ = stream.set_nodelay(true);
    let mut r = stream
        .try_clone()
        .map_err(|e| Error::Link(LinkError::Io(e.to_string())))?;
    let mut w = stream
        .try_clone()
        .map_err(|e| Error::Link(LinkError::Io(e.to_string())))?;
    let session = ferry_channel::handshake(&mut r, &mut w, psk, role).map_err(chan_err)?;
    // The handshake's timeout is for the handshake only: a session may be
    // quiet for long (a sender walking a large tree, a receiver signing a
    // large old copy).
    stream
        .set_read_timeout(None)
        .map_err(|e| Error::Link(LinkError::Io(e.to_string())))?;
    let reader = ferry_channel::ChannelReader::new(r, &session);
    // Small messages coalesce into one sealed frame; large ones pass.
    let writer =
        std::io::BufWriter::with_capacity(1 << 20, ferry_channel::ChannelWriter::new(w, &session));
    Ok(ferry_proto::stream_link_flushed(reader, writer))
}

/// Client side of `--direct`: read the server's port and key from ssh,
/// connect, and prove the key.
/// When the server answered but no connection could be made, the error
/// comes with ssh's stdout, so the session can go on over ssh.
fn direct_connect(
    host: &str,
    stdout: std::process::ChildStdout,
) -> std::result::Result<Endpoint, (Error, Option<BufReader<std::process::ChildStdout>>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let mut r = BufReader::new(stdout);
        let res = r.read_line(&mut line).map(|_| (line, r));
        let _ = tx.send(res);
    });
    let (line, reader) = match rx.recv_timeout(DIRECT_WAIT) {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return Err((Error::Link(LinkError::Io(e.to_string())), None)),
        Err(_) => {
            return Err((
                Error::Link(LinkError::Io(
                    "the remote ferry did not offer a direct connection".into(),
                )),
                None,
            ))
        }
    };
    let mut words = line.split_whitespace();
    let (Some(DIRECT_HELLO), Some(port), Some(key)) = (words.next(), words.next(), words.next())
    else {
        return if line.is_empty() {
            Err((Error::Link(LinkError::Closed), None))
        } else {
            Err((
                Error::Link(LinkError::BadMagic(line.trim().chars().take(120).collect())),
                None,
            ))
        };
    };
    let port: u16 = port
        .parse()
        .map_err(|_| (Error::Protocol(format!("bad direct port {port:?}")), None))?;
    // Test aid: a port where nothing listens, as behind a firewall.
    #[cfg(feature = "test-hooks")]
    let port = if std::env::var_os("FERRY_TEST_DIRECT_UNREACHABLE").is_some() {
        1
    } else {
        port
    };
    let psk = ferry_channel::Psk::new(key.as_bytes()).map_err(|e| (chan_err(e), None))?;
    let name = host.rsplit('@').next().unwrap_or(host);
    let name = name.trim_start_matches('[').trim_end_matches(']');
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = match (name, port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => {
            let e = Error::Link(LinkError::Io(format!("cannot resolve {name}: {e}")));
            return Err((e, Some(reader)));
        }
    };
    let mut last = None;
    for a in &addrs {
        match std::net::TcpStream::connect_timeout(a, DIRECT_CONNECT_WAIT) {
            Ok(s) => {
                return channel_link(s, &psk, ferry_channel::Role::Initiator)
                    .map(|(ep, _)| ep)
                    .map_err(|e| (e, None))
            }
            Err(e) => last = Some(e),
        }
    }
    let e = Error::Link(LinkError::Io(format!(
        "direct connection to {name}:{port} failed ({})",
        last.map(|e| e.to_string())
            .unwrap_or_else(|| "no address".into())
    )));
    Err((e, Some(reader)))
}

/// How long a `--direct` client tries to connect before it falls back.
const DIRECT_CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Server side of `--direct`: listen where the ssh connection arrived,
/// announce port and a fresh key on stdout, and take the first client that
/// proves the key. Nobody else gets in: the key never leaves ssh.
fn direct_accept() -> Result<(Endpoint, ferry_proto::Flushed)> {
    let ip = std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2).map(str::to_string))
        .unwrap_or_else(|| "0.0.0.0".into());
    let io = |e: std::io::Error| Error::Link(LinkError::Io(format!("direct listener: {e}")));
    let listener = std::net::TcpListener::bind((ip.as_str(), 0)).map_err(io)?;
    let port = listener.local_addr().map_err(io)?.port();
    let key = ferry_channel::Psk::generate_hex().map_err(chan_err)?;
    let psk = ferry_channel::Psk::new(key.as_bytes()).map_err(chan_err)?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{DIRECT_HELLO} {port} {key}").map_err(io)?;
        out.flush().map_err(io)?;
    }
    listener.set_nonblocking(true).map_err(io)?;
    // The client may say over ssh that it cannot connect: then the session
    // runs over ssh. Read byte by byte through std's stdin, so nothing after
    // the line is taken from the protocol that follows it.
    let (fb_tx, fb_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while line.len() < 64 {
            match std::io::stdin().read(&mut b) {
                Ok(1) if b[0] == b'\n' => break,
                Ok(1) => line.push(b[0]),
                _ => return,
            }
        }
        if line == DIRECT_FALLBACK.as_bytes() {
            let _ = fb_tx.send(());
        }
    });
    let deadline = Instant::now() + DIRECT_WAIT;
    // Each connection proves the key on a thread of its own, so one that
    // connects and says nothing cannot hold up our client (at most 8 at
    // once, 10 s each); the first that proves it is the session.
    let (won_tx, won_rx) = std::sync::mpsc::channel();
    let pending = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut last_err = None;
    loop {
        if fb_rx.try_recv().is_ok() {
            drop(listener);
            return Ok(ferry_proto::stream_link_flushed(
                std::io::stdin(),
                std::io::stdout(),
            ));
        }
        while let Ok(r) = won_rx.try_recv() {
            match r {
                Ok(x) => return Ok(x),
                // Not our client (or a wrong key): keep waiting.
                Err(e) => last_err = Some(e),
            }
        }
        match listener.accept() {
            Ok((s, _)) if pending.load(std::sync::atomic::Ordering::SeqCst) < 8 => {
                s.set_nonblocking(false).map_err(io)?;
                let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                let (tx, psk, n) = (won_tx.clone(), psk.clone(), pending.clone());
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                std::thread::spawn(move || {
                    let _ = tx.send(channel_link(s, &psk, ferry_channel::Role::Responder));
                    n.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => return Err(io(e)),
        }
        if Instant::now() >= deadline {
            return Err(last_err.unwrap_or_else(|| {
                Error::Link(LinkError::Io("no direct connection from the client".into()))
            }));
        }
    }
}

/// The `ferry serve` arguments that carry `opts` to the other side.
pub fn serve_args(
    opts: &SyncOptions,
    send: bool,
    file_or_dir: bool,
    paths: &[String],
) -> Vec<String> {
    serve_args_with(opts, send, file_or_dir, false, paths)
}

fn serve_args_with(
    opts: &SyncOptions,
    send: bool,
    file_or_dir: bool,
    direct: bool,
    paths: &[String],
) -> Vec<String> {
    let mut a: Vec<String> = vec!["serve".into(), "--stdio".into()];
    if direct {
        a.push("--direct".into());
    }
    a.push(if send { "--send" } else { "--receive" }.into());
    let flags = [
        (file_or_dir, "--file-or-dir"),
        (opts.delete, "--delete"),
        (opts.force, "--force"),
        (opts.ignore_errors, "--ignore-errors"),
        (!opts.fsync, "--no-fsync"),
        (opts.verify, "--verify"),
        (opts.checksum, "--checksum"),
        (opts.dry_run, "--dry-run"),
        (opts.inplace, "--inplace"),
        (opts.xattrs, "--xattrs"),
        (opts.delta == DeltaMode::Delta, "--delta"),
        (opts.delta == DeltaMode::Whole, "--whole-file"),
        (!opts.direct_io, "--buffered-io"),
    ];
    a.extend(
        flags
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, f)| f.to_string()),
    );
    a.push(format!("--threads={}", opts.threads));
    for p in opts.excludes.patterns() {
        a.push(format!("--exclude={p}"));
    }
    if let Some(r) = opts.bwlimit {
        a.push(format!("--bwlimit={r}"));
    }
    if let Some(t) = opts.timeout {
        a.push(format!("--timeout={}", t.as_secs_f64()));
    }
    a.push(format!("--compress={}", opts.compress));
    if let Some(d) = &opts.sig_cache {
        a.push(format!("--sig-cache={}", d.display()));
    }
    a.push("--".into());
    a.extend(paths.iter().cloned());
    a
}

/// Quote one word for a POSIX shell (ssh runs the command through one).
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./:=@%+,-".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A running remote side.
struct Remote {
    host: String,
    /// Held open in direct mode, closed when the session ends.
    stdin: Option<std::process::ChildStdin>,
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
    stderr_thread: Option<std::thread::JoinHandle<()>>,
}

fn spawn(
    host: &str,
    ropts: &RemoteOptions,
    args: &[String],
    stats: &Stats,
) -> Result<(Remote, Endpoint)> {
    let mut words = ropts.rsh.split_whitespace();
    let prog = words
        .next()
        .ok_or_else(|| Error::Usage("empty --rsh command".into()))?;
    let mut remote_cmd = shell_quote(&ropts.remote_ferry);
    for a in args {
        remote_cmd.push(' ');
        remote_cmd.push_str(&shell_quote(a));
    }
    let mut child = Command::new(prog)
        .args(words)
        .arg(host)
        .arg(remote_cmd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            Error::Link(LinkError::Io(format!(
                "cannot run {prog}: {}",
                crate::error::describe(&e)
            )))
        })?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(Error::Link(LinkError::Io(format!("{prog}: no pipes"))));
    };
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let l2 = lines.clone();
    let stderr_thread = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            if let Ok(mut g) = l2.lock() {
                if g.len() >= 20 {
                    g.remove(0);
                }
                g.push(line);
            }
        }
    });
    let remote = Remote {
        host: host.to_string(),
        child,
        stderr: lines,
        stderr_thread: Some(stderr_thread),
        stdin: None,
    };
    if ropts.direct {
        // ssh stays up (its stdin open) while the data goes direct.
        let mut remote = remote;
        remote.stdin = Some(stdin);
        return match direct_connect(host, stdout) {
            Ok(ep) => Ok((remote, ep)),
            Err((e, Some(reader))) => {
                // The server is up and listening but unreachable (a
                // firewall, NAT): carry on over ssh, and say so.
                use std::io::Write;
                let told = remote.stdin.as_mut().is_some_and(|w| {
                    writeln!(w, "{DIRECT_FALLBACK}")
                        .and_then(|_| w.flush())
                        .is_ok()
                });
                if !told {
                    return Err(remote
                        .finish::<()>(Err(e))
                        .err()
                        .unwrap_or(Error::Link(LinkError::Closed)));
                }
                stats.notice(format!("{e}; sending through ssh instead of --direct"));
                let stdin = remote.stdin.take();
                match stdin {
                    Some(w) => {
                        let ep = ferry_proto::stream_link(reader, w);
                        Ok((remote, ep))
                    }
                    None => Err(Error::Link(LinkError::Closed)),
                }
            }
            Err((e, None)) => Err(remote
                .finish::<()>(Err(e))
                .err()
                .unwrap_or(Error::Link(LinkError::Closed))),
        };
    }
    let ep = ferry_proto::stream_link(stdout, stdin);
    Ok((remote, ep))
}

impl Remote {
    /// Wait for the remote side and turn a failed session into the error
    /// that names the cause: ssh, a missing remote ferry, a peer that is not
    /// ferry, or the remote's own error.
    fn finish<T>(mut self, res: Result<T>) -> Result<T> {
        drop(self.stdin.take());
        // A remote that timed out is not waited for (it may be stopped, or
        // behind a dead link); any other gets a grace period to exit and
        // say why, then ssh is killed.
        let grace = match &res {
            Err(Error::Link(LinkError::TimedOut(_))) => std::time::Duration::ZERO,
            Err(_) => std::time::Duration::from_secs(10),
            Ok(_) => std::time::Duration::MAX,
        };
        let status = wait_with_grace(&mut self.child, grace);
        if let Some(t) = self.stderr_thread.take() {
            let _ = t.join();
        }
        let tail = self
            .stderr
            .lock()
            .map(|g| {
                g.iter()
                    .filter(|l| !l.starts_with("Warning: Permanently added"))
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default();
        let code = status.ok().and_then(|s| s.code());
        match res {
            Ok(v) => Ok(v),
            Err(Error::Link(LinkError::BadMagic(text))) => Err(Error::Protocol(format!(
                "{} did not answer as ferry (it said {text:?}); is the remote shell printing a banner?",
                self.host
            ))),
            Err(Error::Link(LinkError::Closed)) | Err(Error::Link(LinkError::Io(_))) => {
                let why = match code {
                    Some(255) => format!("ssh to {} failed: {}", self.host, or_unknown(&tail)),
                    Some(127) => format!(
                        "ferry is not installed on {} (or not on its PATH; give it with --remote-ferry): {}",
                        self.host,
                        or_unknown(&tail)
                    ),
                    Some(c) => format!(
                        "connection to {} lost; the remote side exited with status {c}: {}",
                        self.host,
                        or_unknown(&tail)
                    ),
                    None => format!("connection to {} lost (remote side killed): {}", self.host, or_unknown(&tail)),
                };
                Err(Error::Link(LinkError::Io(why)))
            }
            Err(e) => Err(e),
        }
    }
}

/// Wait for `child`, killing it if it is still running after `grace`.
fn wait_with_grace(
    child: &mut std::process::Child,
    grace: std::time::Duration,
) -> std::io::Result<std::process::ExitStatus> {
    if grace != std::time::Duration::MAX {
        let until = std::time::Instant::now().checked_add(grace);
        while until.is_some_and(|u| std::time::Instant::now() < u) {
            if let Some(st) = child.try_wait()? {
                return Ok(st);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if child.try_wait()?.is_none() {
            let _ = child.kill();
        }
    }
    child.wait()
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() {
        "no message"
    } else {
        s
    }
}

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
        (&stats.bytes_total, r.bytes_total),
        (&stats.bytes_transferred, r.bytes_transferred),
        (&stats.bytes_written, r.bytes_written),
        (&stats.bytes_matched, r.bytes_matched),
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
    mut tx: ferry_proto::MsgTx,
    link_rate: &Arc<std::sync::atomic::AtomicU64>,
    opts: &SyncOptions,
) -> ferry_proto::MsgTx {
    if let Some(rate) = opts.bwlimit {
        tx = tx.with_rate_limit(rate);
    }
    tx.with_compression(opts.compress, opts.threads, link_rate.clone(), opts.bwlimit)
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
    for s in sources.iter().filter(|s| !crate::source::is_nbd_uri(s)) {
        std::fs::symlink_metadata(s.trim_end_matches('/'))
            .or_else(|_| std::fs::symlink_metadata(s))
            .map_err(|e| Error::io(s, e))?;
    }
    let specs = plan::source_specs(sources, crate::source_is_dir)?;
    let file_or_dir = sources.len() == 1 && !sources[0].ends_with('/') && !dest.path.ends_with('/');
    let opts = opts.clone();
    let args = serve_args_with(
        &opts,
        false,
        file_or_dir,
        ropts.direct,
        std::slice::from_ref(&dest.path),
    );
    let (remote, mut ep) = spawn(&dest.host, ropts, &args, stats)?;
    ep.tx = sending_link(ep.tx, &ep.link_rate, &opts);
    let (sent, recv) = (ep.sent.clone(), ep.received.clone());
    let res = sender::run_sender(ep, &specs, &opts, stats, true);
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
    if sources.iter().any(|s| &s.host != host) {
        return Err(Error::Usage(
            "all remote sources must be on the same host".into(),
        ));
    }
    let paths: Vec<String> = sources.iter().map(|s| s.path.clone()).collect();
    let single = paths.len() == 1 && !paths[0].ends_with('/') && !dest.ends_with('/');
    let dest = if single {
        Dest::FileOrDir(dest.into())
    } else {
        Dest::Dir(dest.into())
    };
    let mut opts = opts.clone();
    opts.expect_top = expected_names(&paths);
    let args = serve_args_with(&opts, true, false, ropts.direct, &paths);
    let (remote, ep) = spawn(host, ropts, &args, stats)?;
    let (sent, recv) = (ep.sent.clone(), ep.received.clone());
    let res = receiver::run_receiver(ep, &dest, &opts, stats);
    remote.finish(res)?;
    finish_report(stats, sent.get() + recv.get(), start)
}

/// What a pull of `paths` may bring: each source's last component, or
/// anything (`None`) when a source's contents were asked for (`dir/`, `.`).
fn expected_names(paths: &[String]) -> Option<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    for p in paths {
        if crate::source::is_nbd_uri(p) {
            names.push(crate::source::nbd_name(p));
            continue;
        }
        let trimmed = p.trim_end_matches('/');
        let name = std::path::Path::new(trimmed)
            .file_name()
            .map(|n| n.as_encoded_bytes().to_vec())
            .unwrap_or_default();
        if p.ends_with('/') || name.is_empty() || name == b".." || name == b"." {
            return None;
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
    let (mut ep, flushed) = if direct {
        direct_accept()?
    } else {
        ferry_proto::stream_link_flushed(std::io::stdin(), std::io::stdout())
    };
    let stats = Stats::default();
    let res = if send {
        ep.tx = sending_link(ep.tx, &ep.link_rate, opts);
        match plan::source_specs(paths, crate::source_is_dir) {
            Ok(specs) => sender::run_sender(ep, &specs, opts, &stats, false).map(|_| ()),
            Err(e) => Err(e),
        }
    } else {
        let [dest] = paths else {
            return Err(Error::Usage("serve --receive takes one destination".into()));
        };
        let dest = if crate::source::is_nbd_uri(dest) {
            Dest::Nbd(dest.clone())
        } else if file_or_dir {
            Dest::FileOrDir(dest.into())
        } else {
            Dest::Dir(dest.into())
        };
        receiver::run_receiver(ep, &dest, opts, &stats).map(|_| ())
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
        assert_eq!(
            v(&["nbd+unix:///disk?socket=/s"]),
            Some(vec![b"disk".to_vec()])
        );
    }

    #[test]
    fn remote_paths() {
        assert_eq!(
            parse_remote("me@box:/data/x"),
            Some(RemotePath {
                host: "me@box".into(),
                path: "/data/x".into()
            })
        );
        assert_eq!(parse_remote("box:").unwrap().path, ".");
        assert_eq!(parse_remote("./a:b"), None);
        assert_eq!(parse_remote("/abs/path"), None);
        assert_eq!(parse_remote(":x"), None);
        assert_eq!(parse_remote("nbd+unix:///?socket=/s"), None);
        assert_eq!(parse_remote("nbd://h/x"), None);
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/a/b-c.d"), "/a/b-c.d");
        assert_eq!(shell_quote("it's here"), r"'it'\''s here'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("*.tmp"), "'*.tmp'");
    }
}
