//! The daemon's listener and its sessions.
//!
//! Each connection gets a thread. Handshakes in progress are bounded
//! ([`MAX_HANDSHAKES`]: a new connection beyond them cuts the oldest one
//! short) and each is bounded in time, so strangers that connect and say
//! nothing neither lock clients out nor grow the daemon. A client that proves the key
//! has [`REQUEST_WAIT`] to send its request, bounded in size by the
//! preamble's codec; then the session runs as `serve --stdio` would, with
//! its paths confined to the root.

use std::collections::VecDeque;
use std::io::{self, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use ferry_channel::{ChannelReader, ChannelWriter, Psk, Role};
use ferry_link::daemon::{self as pre, Status};
use ferry_link::direct::{handshake_tcp_join, HANDSHAKE_TIMEOUT};
use ferry_link::stripe::{Conn, ConnRead, ConnWrite, Groups, Joined};
use ferry_link::ReceiverReport;

use super::confine::{confine, printable, Confined};
use super::policy::{self, Refusal};
use super::{DaemonConfig, ParseRequest, Request, Target};
use crate::error::{Error, Result};
use crate::stats::Stats;

/// Connections still in their handshake at once (well above the 16 of
/// one striped session).
pub const MAX_HANDSHAKES: usize = 64;

/// How long a client that proved the key may take to send its request.
pub const REQUEST_WAIT: Duration = Duration::from_secs(30);

/// How long a request waits for the root (a push under way, or pulls
/// under way for a push) before it is answered "busy".
pub const LOCK_WAIT: Duration = Duration::from_secs(30);

/// Strangers are logged at most [`REFUSALS_LOGGED`] a minute (a flood of
/// them must not flood the log); the rest are not.
#[derive(Default)]
struct Refusals(Mutex<(Option<std::time::Instant>, u64)>);

const REFUSALS_LOGGED: u64 = 10;

impl Refusals {
    /// Whether to log this refusal; also says how many were not logged.
    fn note(&self) -> bool {
        let Ok(mut g) = self.0.lock() else {
            return false;
        };
        let now = std::time::Instant::now();
        let fresh =
            g.0.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60));
        if fresh {
            *g = (Some(now), 0);
        }
        g.1 += 1;
        g.1 <= REFUSALS_LOGGED
    }
}

/// One session's end: who it was, what it did.
pub struct SessionEnd {
    pub peer: SocketAddr,
    /// What the client asked for (`pull PATHS` or `push to PATH`, as it
    /// named them), or `request refused` with the reason in `result`.
    pub what: String,
    pub result: Result<ReceiverReport>,
}

impl SessionEnd {
    /// One line for the log: who, what, and how it ended.
    pub fn line(&self) -> String {
        printable(&self.raw_line())
    }

    fn raw_line(&self) -> String {
        match &self.result {
            Ok(r) => format!(
                "{}: {}: done: {} files, {} transferred, {} failed, {} deleted; {} bytes written",
                self.peer,
                self.what,
                r.files_total,
                r.files_transferred,
                r.files_failed,
                r.files_deleted,
                r.bytes_written
            ),
            Err(Error::Usage(e)) | Err(Error::Peer { msg: e, .. }) if self.what == REFUSED => {
                format!("{}: {REFUSED}: {e}", self.peer)
            }
            Err(e) => format!("{}: {}: failed: {e}", self.peer, self.what),
        }
    }
}

const REFUSED: &str = "request refused";

/// Lines for the daemon's log (stderr).
pub type Log = dyn Fn(&str) + Send + Sync;

/// Told of each session as it starts (a label: the peer and what it
/// asked, and the session's live counters); what it returns is called
/// when the session ends. The CLI's `--progress=json` prints from it.
pub type Watch = dyn Fn(&str, Arc<Stats>) -> Box<dyn FnOnce() + Send> + Send + Sync;

/// Receives a stream a client pushes into `file` (`ferry send ...
/// ferry://`), over the session's bare connection (or connections) once
/// the request was accepted: the stream's own handshake with the daemon's
/// key (fresh session keys), then its data. `resume`: what the file holds
/// may be offered. The bytes written, or why not. The CLI supplies it
/// (`ferry-stream`).
pub type StreamRecv = dyn Fn(std::fs::File, Conn, bool) -> Result<StreamDone> + Send + Sync;

/// What a stream session moved: the stream's length, and of it what was
/// kept from an earlier one (a resume).
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamDone {
    pub bytes: u64,
    pub resumed: u64,
}

/// Sends the file a client asked for (`ferry recv --from ferry://...`) as
/// a stream over the session's bare connection (or connections), the
/// daemon the stream's initiator; the bytes sent, or why not.
pub type StreamSend = dyn Fn(std::fs::File, Conn) -> Result<StreamDone> + Send + Sync;

/// What the daemon's user adds: a watcher of sessions, a stream receiver
/// (without one, stream requests are refused).
#[derive(Clone, Default)]
pub struct Hooks {
    pub watch: Option<Arc<Watch>>,
    pub stream: Option<Arc<StreamRecv>>,
    pub stream_out: Option<Arc<StreamSend>>,
}

struct Shared {
    psk: Psk,
    cfg: DaemonConfig,
    root: Option<OwnedFd>,
    parse: Arc<ParseRequest>,
    log: Arc<Log>,
    hooks: Hooks,
    /// Connections in their handshake, oldest first, by number.
    handshakes: Mutex<VecDeque<(u64, TcpStream)>>,
    sessions: AtomicUsize,
    /// `--once`: the one session has begun.
    taken: AtomicBool,
    /// Pulls share the root, a push has it alone (see [`Hold`]).
    root_lock: RwLock<()>,
    /// Connections that did not prove the key, for the log's rate.
    refusals: Refusals,
    /// Sessions striped over several connections, gathering them.
    groups: Mutex<Groups>,
    ended: mpsc::Sender<SessionEnd>,
}

/// Serve clients on `listener` until the process ends; with `cfg.once`,
/// return the first authenticated session's end.
pub fn serve_daemon(
    listener: TcpListener,
    psk: Psk,
    cfg: DaemonConfig,
    parse: Arc<ParseRequest>,
    log: Arc<Log>,
    hooks: Hooks,
) -> Result<SessionEnd> {
    let root = match &cfg.target {
        Target::Root(p) => Some(
            rustix::fs::open(
                p,
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| Error::io_op("open", p, e.into()))?,
        ),
        Target::Device(_) => None,
    };
    let (ended, end) = mpsc::channel();
    let once = cfg.once;
    let say = log.clone();
    let shared = Arc::new(Shared {
        psk,
        cfg,
        root,
        parse,
        log,
        hooks,
        handshakes: Mutex::new(VecDeque::new()),
        sessions: AtomicUsize::new(0),
        taken: AtomicBool::new(false),
        root_lock: RwLock::new(()),
        refusals: Refusals::default(),
        groups: Mutex::new(Groups::new(HANDSHAKE_TIMEOUT)),
        ended,
    });
    let accepting = shared.clone();
    std::thread::spawn(move || accept_loop(listener, accepting));
    loop {
        match end.recv() {
            Ok(e) => {
                say(&e.line());
                if once {
                    return Ok(e);
                }
            }
            Err(_) => return Err(Error::Link(ferry_link::LinkError::Closed)),
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for (n, conn) in listener.incoming().enumerate() {
        let s = match conn {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and the like: wait a little rather than spin.
                (shared.log)(&format!("accept: {e}"));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let peer = s
            .peer_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let id = n as u64;
        if let (Ok(mut pending), Ok(c)) = (shared.handshakes.lock(), s.try_clone()) {
            if pending.len() >= MAX_HANDSHAKES {
                if let Some((_, oldest)) = pending.pop_front() {
                    let _ = oldest.shutdown(std::net::Shutdown::Both);
                }
            }
            pending.push_back((id, c));
        }
        let sh = shared.clone();
        std::thread::spawn(move || connection(s, id, peer, &sh));
    }
}

fn connection(s: TcpStream, id: u64, peer: SocketAddr, sh: &Shared) {
    let hs = handshake_tcp_join(s, &sh.psk, Role::Responder, HANDSHAKE_TIMEOUT, None);
    // A connection pushed out by newer ones may have finished its
    // handshake all the same: its socket is shut, it is nobody's session.
    let cut = match sh.handshakes.lock() {
        Ok(mut pending) => {
            let before = pending.len();
            pending.retain(|(n, _)| *n != id);
            pending.len() == before
        }
        Err(_) => true,
    };
    if cut {
        return;
    }
    let (session, conn) = match hs {
        Ok((session, s, None)) => (session, Conn::single(s)),
        // One of a striped session's connections: the one that completes
        // it runs the session.
        Ok((session, s, Some(join))) => {
            let Ok(mut groups) = sh.groups.lock() else {
                return;
            };
            match groups.add(join, session, s) {
                Joined::Waiting => return,
                Joined::Complete(session, conn) => (session, conn),
                Joined::Refused(why) => {
                    drop(groups);
                    (sh.log)(&format!("{peer}: refused: {why}"));
                    return;
                }
            }
        }
        Err(e) => {
            if sh.refusals.note() {
                (sh.log)(&format!("{peer}: refused: {e}"));
            }
            return;
        }
    };
    let (r, w) = match (conn.reader(None), conn.writer()) {
        (Ok(r), Ok(w)) => (r, w),
        (Err(e), _) | (_, Err(e)) => {
            (sh.log)(&format!("{peer}: {e}"));
            return;
        }
    };
    let reader = ChannelReader::new(r, &session);
    let mut writer = BufWriter::with_capacity(1 << 20, ChannelWriter::new(w, &session));
    let busy = if sh.cfg.once && sh.taken.swap(true, Ordering::SeqCst) {
        Some("this daemon serves one session (--once), and it has begun".to_string())
    } else if sh.sessions.fetch_add(1, Ordering::SeqCst) >= sh.cfg.max_sessions {
        sh.sessions.fetch_sub(1, Ordering::SeqCst);
        Some(format!(
            "busy: {} sessions under way (--max-sessions); try again later",
            sh.cfg.max_sessions
        ))
    } else {
        None
    };
    if let Some(why) = busy {
        (sh.log)(&format!("{peer}: {why}"));
        let _ = answer(&mut writer, Status::Busy, &why);
        return;
    }
    let end = session_run(&conn, reader, writer, peer, sh);
    sh.sessions.fetch_sub(1, Ordering::SeqCst);
    let _ = sh.ended.send(end);
}

fn answer(w: &mut impl Write, status: Status, text: &str) -> io::Result<()> {
    w.write_all(&pre::encode_answer(status, text))?;
    w.flush()
}

/// A parsed request fitted to the daemon, and the paths as the client
/// named them (for the log).
type Parsed = (Request, Vec<String>);

/// Read and check the request; `Err` with the answer to give.
fn request(reader: &mut impl Read, sh: &Shared) -> std::result::Result<Parsed, (Status, String)> {
    let io = |e: io::Error| {
        let why = match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                format!("no whole request within {} s", REQUEST_WAIT.as_secs())
            }
            _ => format!("reading the request: {e}"),
        };
        (Status::Usage, why)
    };
    let mut head = [0u8; pre::REQUEST_HEAD];
    reader.read_exact(&mut head).map_err(io)?;
    let n = pre::request_body_len(&head).map_err(|e| (Status::Usage, e.to_string()))?;
    let mut body = vec![0u8; n];
    reader.read_exact(&mut body).map_err(io)?;
    let args = pre::decode_request_body(&body).map_err(|e| (Status::Usage, e.to_string()))?;
    policy::check(&args).map_err(|e| (Status::Usage, e.to_string()))?;
    let req = if args.first().map(String::as_str) == Some("recv") {
        if sh.hooks.stream.is_none() {
            return Err((Status::Usage, "this daemon takes no streams".into()));
        }
        policy::stream_request(&args).map_err(|e| (Status::Usage, e.to_string()))?
    } else if args.first().map(String::as_str) == Some("send") {
        if sh.hooks.stream_out.is_none() {
            return Err((Status::Usage, "this daemon sends no streams".into()));
        }
        policy::stream_request(&args).map_err(|e| (Status::Usage, e.to_string()))?
    } else {
        (sh.parse)(&args).map_err(|e| (Status::Usage, e))?
    };
    let cores = crate::default_threads();
    let req = policy::fit(req, &sh.cfg, cores).map_err(|e| match e {
        Refusal::Usage(m) | Refusal::Direction(m) => (Status::Usage, m),
    })?;
    let asked = req.paths.clone();
    Ok((req, asked))
}

/// A session's hold on the root: pulls share it, a push has it alone.
/// While a session runs, no other session changes what it walks or writes
/// into: a symlink another client pushes cannot appear under a pull's walk
/// or a push's destination after [`confine`] checked the path.
pub(super) enum Hold<'a> {
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Alone(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// The root for a push (alone) or a pull (shared), waiting at most
/// [`LOCK_WAIT`]: `None` when others hold it that long.
fn hold(lock: &RwLock<()>, push: bool) -> Option<Hold<'_>> {
    use std::sync::TryLockError;
    let until = std::time::Instant::now() + LOCK_WAIT;
    loop {
        let got = if push {
            match lock.try_write() {
                Ok(g) => Some(Hold::Alone(g)),
                Err(TryLockError::Poisoned(p)) => Some(Hold::Alone(p.into_inner())),
                Err(TryLockError::WouldBlock) => None,
            }
        } else {
            match lock.try_read() {
                Ok(g) => Some(Hold::Shared(g)),
                Err(TryLockError::Poisoned(p)) => Some(Hold::Shared(p.into_inner())),
                Err(TryLockError::WouldBlock) => None,
            }
        };
        if got.is_some() || std::time::Instant::now() >= until {
            return got;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The request's paths beneath the root (a root daemon), with the handles
/// they go through.
fn confined(
    req: &mut Request,
    sh: &Shared,
) -> std::result::Result<Vec<Confined>, (Status, String)> {
    let mut held = Vec::new();
    if let (Target::Root(root_path), Some(root)) = (&sh.cfg.target, &sh.root) {
        let rp = root_path.to_string_lossy();
        for p in &mut req.paths {
            let c = confine(root, &rp, p, !req.send).map_err(|e| (Status::Io, e.to_string()))?;
            *p = c.path.clone();
            held.push(c);
        }
    }
    Ok(held)
}

fn refused(peer: SocketAddr, writer: &mut impl Write, status: Status, why: String) -> SessionEnd {
    let _ = answer(writer, status, &why);
    let result = Err(match status {
        Status::Io => Error::Peer {
            class: ferry_link::FatalClass::Io,
            msg: why,
        },
        Status::Busy => Error::Busy(why),
        _ => Error::Usage(why),
    });
    SessionEnd {
        peer,
        what: REFUSED.into(),
        result,
    }
}

/// A stream pushed into one file beneath the root (see [`StreamRecv`]).
fn stream_session(
    sock: &Conn,
    writer: &mut impl Write,
    peer: SocketAddr,
    sh: &Shared,
    req: &Request,
    asked: &[String],
    hold: Hold<'_>,
) -> SessionEnd {
    let Some(root) = &sh.root else {
        let why = "this daemon has no streams".to_string();
        return refused(peer, writer, Status::Usage, why);
    };
    let path = &req.paths[0];
    let file = if req.send {
        super::confine::open_to_read(root, path)
    } else {
        super::confine::open_file(root, path)
    };
    let file = match file {
        Ok(f) => f,
        Err(e) => return refused(peer, writer, Status::Io, e.to_string()),
    };
    // The file is held by its descriptor from here: the root is free for
    // other sessions (a stream may run for hours), and the file is locked
    // instead, so that two streams cannot interleave in it.
    drop(hold);
    let lock = if req.send {
        rustix::fs::FlockOperation::NonBlockingLockShared
    } else {
        rustix::fs::FlockOperation::NonBlockingLockExclusive
    };
    if rustix::fs::flock(&file, lock).is_err() {
        let why = "busy: another stream has this file; try again later".to_string();
        return refused(peer, writer, Status::Busy, why);
    }
    let dir = if req.send { "stream of" } else { "stream into" };
    let what = format!("{dir} {:?}", asked.first().map_or("", String::as_str));
    (sh.log)(&format!("{peer}: {what}"));
    // A client that never starts the stream, or goes silent in it (a live
    // one sends keepalives every second), gives back its slot and the root:
    // the hooks' idle timeout.
    // What the file holds is offered (its size and digest) only by a
    // daemon that would let the client read it anyway.
    let resume = req.opts.partial && sh.cfg.allow_send;
    let run = |conn| match (&sh.hooks.stream, &sh.hooks.stream_out) {
        (_, Some(send)) if req.send => send(file, conn),
        (Some(recv), _) if !req.send => recv(file, conn, resume),
        _ => Err(Error::Usage("this daemon has no such streams".into())),
    };
    let result = match (answer(writer, Status::Accepted, ""), sock.try_clone()) {
        (Ok(()), Ok(conn)) => run(conn).map(|d| ReceiverReport {
            files_total: 1,
            files_transferred: 1,
            bytes_total: d.bytes,
            bytes_transferred: d.bytes,
            bytes_written: if req.send { 0 } else { d.bytes - d.resumed },
            bytes_resumed: d.resumed,
            ..ReceiverReport::default()
        }),
        (Err(e), _) | (_, Err(e)) => Err(Error::Link(ferry_link::LinkError::Io(e.to_string()))),
    };
    sock.shutdown(std::net::Shutdown::Both);
    SessionEnd { peer, what, result }
}

fn session_run(
    conn: &Conn,
    mut reader: ChannelReader<ConnRead>,
    mut writer: BufWriter<ChannelWriter<ConnWrite>>,
    peer: SocketAddr,
    sh: &Shared,
) -> SessionEnd {
    reader.get_mut().set_idle(Some(REQUEST_WAIT));
    let got = request(&mut reader, sh);
    reader.get_mut().set_idle(None);
    let (mut req, asked) = match got {
        Ok(v) => v,
        Err((status, why)) => return refused(peer, &mut writer, status, why),
    };
    let Some(_hold) = hold(&sh.root_lock, !req.send) else {
        let why = if req.send {
            "busy: a push is under way; try again later"
        } else {
            "busy: other sessions are under way and a push has the root to itself; try again later"
        };
        return refused(peer, &mut writer, Status::Busy, why.into());
    };
    if req.stream {
        return stream_session(conn, &mut writer, peer, sh, &req, &asked, _hold);
    }
    let _held = match confined(&mut req, sh) {
        Ok(h) => h,
        Err((status, why)) => return refused(peer, &mut writer, status, why),
    };
    let asked: Vec<String> = asked.iter().map(|p| format!("{p:?}")).collect();
    let mut what = if req.send {
        format!("pull {}", asked.join(" "))
    } else {
        format!("push to {}", asked.join(" "))
    };
    if conn.count() > 1 {
        what += &format!(" over {} connections", conn.count());
    }
    (sh.log)(&format!("{peer}: {what}"));
    if let Err(e) = answer(&mut writer, Status::Accepted, "") {
        return SessionEnd {
            peer,
            what,
            result: Err(Error::Link(ferry_link::LinkError::Io(e.to_string()))),
        };
    }
    let (ep, flushed) = ferry_link::stream_link_flushed(reader, writer);
    let stats = Arc::new(Stats::default());
    let watched = sh
        .hooks
        .watch
        .as_ref()
        .map(|w| w(&format!("{peer}: {what}"), stats.clone()));
    let result = super::super::session::serve_link(ep, flushed, &req, &stats, true);
    if let Some(done) = watched {
        done();
    }
    // The link's threads end with the connection, whatever the client
    // does with its end.
    conn.shutdown(std::net::Shutdown::Both);
    SessionEnd { peer, what, result }
}
