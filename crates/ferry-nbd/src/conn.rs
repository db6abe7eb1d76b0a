//! One NBD connection: the handshake, then a transmission phase with many
//! requests in flight.
//!
//! Design: submitters take a writer mutex to send a request; a dedicated
//! reader thread decodes every reply and hands it, by cookie, to the
//! [`Ticket`] of the request it answers. READ payloads are read straight
//! from the socket into the request's buffer. When the connection fails
//! (EOF, I/O error, protocol violation, timeout) every request in flight and
//! every later one fails with an error; nothing waits forever.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::proto::{self, *};
use crate::uri::{Endpoint, NbdUri};

/// Knobs of a connection.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// How long to wait for the TCP/unix connect and for each handshake reply.
    pub connect_timeout: Duration,
    /// How long requests may be in flight with no byte arriving from the
    /// server before the connection is declared dead.
    pub io_timeout: Duration,
    /// Most requests in flight on this connection (submitters block beyond).
    pub max_in_flight: usize,
    /// Negotiate structured replies (and with them `base:allocation`).
    pub structured_replies: bool,
    /// Negotiate the `base:allocation` metadata context.
    pub block_status: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            connect_timeout: Duration::from_secs(30),
            io_timeout: Duration::from_secs(120),
            max_in_flight: 64,
            structured_replies: true,
            block_status: true,
        }
    }
}

/// What the handshake established.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    /// Export name as requested.
    pub export: String,
    /// Export size in bytes.
    pub size: u64,
    /// Transmission flags (`NBD_FLAG_*`).
    pub flags: u16,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// Id of the `base:allocation` context, if negotiated.
    pub base_allocation: Option<u32>,
    /// Block size constraints (min, preferred, max payload) if the server sent them.
    pub block_size: Option<(u32, u32, u32)>,
    /// Export description if the server sent one.
    pub description: Option<String>,
}

impl ExportInfo {
    fn has(&self, f: u16) -> bool {
        self.flags & f != 0
    }
    pub fn read_only(&self) -> bool {
        self.has(FLAG_READ_ONLY)
    }
    pub fn can_flush(&self) -> bool {
        self.has(FLAG_SEND_FLUSH)
    }
    pub fn can_fua(&self) -> bool {
        self.has(FLAG_SEND_FUA)
    }
    pub fn can_trim(&self) -> bool {
        self.has(FLAG_SEND_TRIM)
    }
    pub fn can_zero(&self) -> bool {
        self.has(FLAG_SEND_WRITE_ZEROES)
    }
    pub fn can_fast_zero(&self) -> bool {
        self.has(FLAG_SEND_FAST_ZERO) && self.can_zero()
    }
    pub fn can_multi_conn(&self) -> bool {
        self.has(FLAG_CAN_MULTI_CONN)
    }
    pub fn has_block_status(&self) -> bool {
        self.base_allocation.is_some()
    }
    /// Largest READ/WRITE payload to use with this server.
    pub fn max_payload(&self) -> u32 {
        match self.block_size {
            Some((_, _, max)) if max >= 512 => max.min(MAX_PAYLOAD),
            _ => MAX_PAYLOAD,
        }
    }
}

// ---------------------------------------------------------------------------
// Socket
// ---------------------------------------------------------------------------

enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
        })
    }
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_read_timeout(d),
            Sock::Unix(s) => s.set_read_timeout(d),
        }
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_write_timeout(d),
            Sock::Unix(s) => s.set_write_timeout(d),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(Shutdown::Both),
            Sock::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(b),
            Sock::Unix(s) => s.read(b),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(b),
            Sock::Unix(s) => s.write(b),
        }
    }
    fn write_vectored(&mut self, b: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write_vectored(b),
            Sock::Unix(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn open_socket(uri: &NbdUri, timeout: Duration) -> Result<Sock> {
    match &uri.endpoint {
        Endpoint::Unix { path } => {
            let s = UnixStream::connect(path).map_err(|e| Error::Connect {
                target: format!("unix socket {}", path.display()),
                source: e,
            })?;
            Ok(Sock::Unix(s))
        }
        Endpoint::Tcp { host, port } => {
            let target = format!("{host}:{port}");
            let addrs = (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(|e| Error::Connect {
                    target: target.clone(),
                    source: e,
                })?;
            let mut last = io::Error::new(io::ErrorKind::NotFound, "host resolved to no address");
            for a in addrs {
                match TcpStream::connect_timeout(&a, timeout) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(Sock::Tcp(s));
                    }
                    Err(e) => last = e,
                }
            }
            Err(Error::Connect {
                target,
                source: last,
            })
        }
    }
}

// ---------------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------------

fn hs_read(s: &mut Sock, buf: &mut [u8], what: &str) -> Result<()> {
    s.read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            Error::Handshake(format!("server closed the connection while sending {what}"))
        } else {
            Error::io(format!("NBD handshake: reading {what}"), e)
        }
    })
}

fn hs_write(s: &mut Sock, b: &[u8], what: &str) -> Result<()> {
    s.write_all(b)
        .map_err(|e| Error::io(format!("NBD handshake: sending {what}"), e))
}

fn read_opt_reply(s: &mut Sock, expect_opt: u32) -> Result<OptReply> {
    let mut h = [0u8; OPT_REPLY_HEADER_LEN];
    hs_read(s, &mut h, "option reply header")?;
    let hdr = parse_opt_reply_header(&h)?;
    if hdr.option != expect_opt {
        return Err(ProtoError::Malformed(format!(
            "reply to option {} while {} was sent",
            hdr.option,
            opt_name(expect_opt)
        ))
        .into());
    }
    let mut p = vec![0u8; hdr.len as usize];
    hs_read(s, &mut p, "option reply payload")?;
    Ok(parse_opt_reply(&hdr, &p)?)
}

fn refused(option: u32, export: &str, reply: u32, message: String) -> Error {
    match reply {
        REP_ERR_UNKNOWN => Error::ExportNotFound {
            export: export.to_string(),
            message,
        },
        REP_ERR_TLS_REQD => Error::TlsRequired {
            export: export.to_string(),
        },
        _ => Error::OptionRefused {
            option: opt_name(option),
            export: export.to_string(),
            reply: rep_name(reply),
            message,
        },
    }
}

fn handshake(s: &mut Sock, export: &str, opts: &ConnectOptions) -> Result<ExportInfo> {
    if export.len() > 4096 {
        return Err(Error::InvalidArgument(
            "export name longer than 4096 bytes".into(),
        ));
    }
    let mut g = [0u8; 18];
    hs_read(s, &mut g, "greeting")?;
    let greeting = parse_greeting(&g)?;
    if greeting.handshake_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(Error::Handshake(
            "server does not support fixed newstyle negotiation".into(),
        ));
    }
    let no_zeroes = greeting.handshake_flags & FLAG_NO_ZEROES != 0;
    let mut cflags = FLAG_C_FIXED_NEWSTYLE;
    if no_zeroes {
        cflags |= FLAG_C_NO_ZEROES;
    }
    hs_write(s, &cflags.to_be_bytes(), "client flags")?;

    let mut info = ExportInfo {
        export: export.to_string(),
        size: 0,
        flags: 0,
        structured: false,
        base_allocation: None,
        block_size: None,
        description: None,
    };

    if opts.structured_replies {
        hs_write(
            s,
            &encode_option(OPT_STRUCTURED_REPLY, &[]),
            "NBD_OPT_STRUCTURED_REPLY",
        )?;
        match read_opt_reply(s, OPT_STRUCTURED_REPLY)? {
            OptReply::Ack => info.structured = true,
            OptReply::Error { reply, message } => {
                if reply == REP_ERR_TLS_REQD {
                    return Err(refused(OPT_STRUCTURED_REPLY, export, reply, message));
                }
            }
            other => {
                return Err(ProtoError::Malformed(format!(
                    "unexpected reply {other:?} to NBD_OPT_STRUCTURED_REPLY"
                ))
                .into())
            }
        }
    }

    if info.structured && opts.block_status {
        let data = encode_meta_context_data(export, &[META_BASE_ALLOCATION]);
        hs_write(
            s,
            &encode_option(OPT_SET_META_CONTEXT, &data),
            "NBD_OPT_SET_META_CONTEXT",
        )?;
        let mut id = None;
        // A bounded number of replies: one per selected context then ACK.
        for _ in 0..1024 {
            match read_opt_reply(s, OPT_SET_META_CONTEXT)? {
                OptReply::MetaContext { id: i, name } => {
                    if name == META_BASE_ALLOCATION {
                        id = Some(i);
                    }
                }
                OptReply::Ack => {
                    info.base_allocation = id;
                    break;
                }
                OptReply::Error { reply, message } => {
                    if reply == REP_ERR_UNKNOWN || reply == REP_ERR_TLS_REQD {
                        return Err(refused(OPT_SET_META_CONTEXT, export, reply, message));
                    }
                    // No block status; fall back to "all data".
                    break;
                }
                other => {
                    return Err(ProtoError::Malformed(format!(
                        "unexpected reply {other:?} to NBD_OPT_SET_META_CONTEXT"
                    ))
                    .into())
                }
            }
        }
    }

    // NBD_OPT_GO. We do not request NBD_INFO_BLOCK_SIZE (which would bind us
    // to the server's minimum block size for every request) but honour the
    // maximum payload if the server volunteers it.
    let data = encode_go_data(export, &[]);
    hs_write(s, &encode_option(OPT_GO, &data), "NBD_OPT_GO")?;
    let mut got_export = false;
    for _ in 0..1024 {
        match read_opt_reply(s, OPT_GO)? {
            OptReply::Info(Info::Export { size, flags }) => {
                info.size = size;
                info.flags = flags;
                got_export = true;
            }
            OptReply::Info(Info::BlockSize {
                min,
                preferred,
                max,
            }) => {
                info.block_size = Some((min, preferred, max));
            }
            OptReply::Info(Info::Description(d)) => info.description = Some(d),
            OptReply::Info(_) => {}
            OptReply::Ack => {
                if !got_export {
                    return Err(ProtoError::Malformed(
                        "NBD_OPT_GO succeeded without NBD_INFO_EXPORT".into(),
                    )
                    .into());
                }
                return Ok(info);
            }
            OptReply::Error { reply, .. } if reply == REP_ERR_UNSUP => {
                return export_name_fallback(s, info, no_zeroes);
            }
            OptReply::Error { reply, message } => {
                return Err(refused(OPT_GO, export, reply, message));
            }
            other => {
                return Err(ProtoError::Malformed(format!(
                    "unexpected reply {other:?} to NBD_OPT_GO"
                ))
                .into())
            }
        }
    }
    Err(ProtoError::Malformed("too many replies to NBD_OPT_GO".into()).into())
}

fn export_name_fallback(s: &mut Sock, mut info: ExportInfo, no_zeroes: bool) -> Result<ExportInfo> {
    let export = info.export.clone();
    hs_write(
        s,
        &encode_option(OPT_EXPORT_NAME, export.as_bytes()),
        "NBD_OPT_EXPORT_NAME",
    )?;
    let mut b = [0u8; 10 + 124];
    let n = if no_zeroes { 10 } else { 134 };
    s.read_exact(&mut b[..n]).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            // The only way a server can refuse NBD_OPT_EXPORT_NAME.
            Error::ExportNotFound {
                export: export.clone(),
                message: "server closed the connection after NBD_OPT_EXPORT_NAME".into(),
            }
        } else {
            Error::io("NBD handshake: reading export info", e)
        }
    })?;
    info.size = u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    info.flags = u16::from_be_bytes([b[8], b[9]]);
    Ok(info)
}

// ---------------------------------------------------------------------------
// Transmission
// ---------------------------------------------------------------------------

/// The result of a completed request.
#[derive(Debug)]
pub enum Reply {
    /// Command succeeded (no payload).
    Done,
    /// READ data (the buffer given to [`Connection::submit_read`], filled).
    Data(Vec<u8>),
    /// BLOCK_STATUS descriptors of `base:allocation` as (length, flags).
    Extents(Vec<(u32, u32)>),
}

struct Slot {
    result: Mutex<Option<Result<Reply>>>,
    cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not turn into a second panic here.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Slot {
    fn complete(&self, r: Result<Reply>) {
        let mut g = lock(&self.result);
        if g.is_none() {
            *g = Some(r);
        }
        self.cv.notify_all();
    }
}

/// A request in flight; [`Ticket::wait`] blocks until its reply.
#[must_use = "a ticket must be waited on to learn whether the request succeeded"]
pub struct Ticket {
    slot: Arc<Slot>,
}

impl Ticket {
    /// Waits for the reply. Never blocks forever: a dead connection fails
    /// every outstanding ticket.
    pub fn wait(self) -> Result<Reply> {
        let mut g = lock(&self.slot.result);
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            g = self.slot.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// True if the reply has arrived (wait will not block).
    pub fn is_ready(&self) -> bool {
        lock(&self.slot.result).is_some()
    }
}

#[derive(Clone, Debug)]
enum Dead {
    Closed,
    Eof,
    Io(String),
    Protocol(ProtoError),
    Timeout(u64),
}

impl Dead {
    fn to_error(&self) -> Error {
        match self {
            Dead::Closed => Error::ConnectionLost("connection closed by the client".into()),
            Dead::Eof => Error::ConnectionLost("server closed the connection".into()),
            Dead::Io(s) => Error::ConnectionLost(s.clone()),
            Dead::Protocol(p) => Error::Protocol(p.clone()),
            Dead::Timeout(s) => Error::Timeout { secs: *s },
        }
    }
}

enum PendingKind {
    Read { buf: Vec<u8>, cov: ReadCoverage },
    BlockStatus { extents: Option<Vec<(u32, u32)>> },
    Other,
}

struct Pending {
    req: RequestInfo,
    kind: PendingKind,
    error: Option<Error>,
    slot: Arc<Slot>,
}

struct State {
    pending: HashMap<u64, Pending>,
    in_flight: usize,
    dead: Option<Dead>,
}

struct Shared {
    state: Mutex<State>,
    space: Condvar,
    max_in_flight: usize,
    closing: AtomicBool,
    /// The server answered ESHUTDOWN: no new requests, disconnect softly.
    server_shutdown: AtomicBool,
    /// A clone of the socket used only to shut it down.
    killer: Sock,
}

impl Shared {
    /// Marks the connection dead, shuts the socket, and fails every request.
    fn fail(&self, why: Dead) {
        let drained: Vec<Pending> = {
            let mut st = lock(&self.state);
            if st.dead.is_none() {
                st.dead = Some(why);
            }
            let d: Vec<Pending> = st.pending.drain().map(|(_, p)| p).collect();
            st.in_flight -= d.len();
            d
        };
        self.killer.shutdown();
        let err = lock(&self.state).dead.clone().unwrap_or(Dead::Closed);
        for p in drained {
            p.slot.complete(Err(err.to_error()));
        }
        self.space.notify_all();
    }

    fn finish(&self, p: Pending, r: Result<Reply>) {
        {
            let mut st = lock(&self.state);
            st.in_flight -= 1;
        }
        self.space.notify_all();
        p.slot.complete(r);
    }
}

/// One NBD connection in the transmission phase. Share it between threads
/// with `Arc`; each method submits one request and returns a [`Ticket`].
pub struct Connection {
    info: ExportInfo,
    writer: Mutex<Sock>,
    shared: Arc<Shared>,
    reader: Mutex<Option<JoinHandle<()>>>,
    next_cookie: AtomicU64,
    opts: ConnectOptions,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("info", &self.info)
            .finish()
    }
}

impl Connection {
    /// Connects, negotiates, and starts the reply reader thread.
    pub fn connect(uri: &NbdUri, opts: &ConnectOptions) -> Result<Connection> {
        let mut sock = open_socket(uri, opts.connect_timeout)?;
        let t = Some(opts.connect_timeout.max(Duration::from_millis(1)));
        sock.set_read_timeout(t)
            .and_then(|_| sock.set_write_timeout(t))
            .map_err(|e| Error::io("setting socket timeouts", e))?;
        let info = handshake(&mut sock, &uri.export, opts)?;
        Self::start(sock, info, opts)
    }

    fn start(sock: Sock, info: ExportInfo, opts: &ConnectOptions) -> Result<Connection> {
        let io_timeout = opts.io_timeout.max(Duration::from_millis(10));
        sock.set_write_timeout(Some(io_timeout))
            .map_err(|e| Error::io("setting socket timeouts", e))?;
        let mut rsock = sock
            .try_clone()
            .map_err(|e| Error::io("cloning socket", e))?;
        // The reader wakes up regularly to check for timeouts and close.
        rsock
            .set_read_timeout(Some(io_timeout.min(Duration::from_millis(250))))
            .map_err(|e| Error::io("setting socket timeouts", e))?;
        let killer = sock
            .try_clone()
            .map_err(|e| Error::io("cloning socket", e))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pending: HashMap::new(),
                in_flight: 0,
                dead: None,
            }),
            space: Condvar::new(),
            max_in_flight: opts.max_in_flight.max(1),
            closing: AtomicBool::new(false),
            server_shutdown: AtomicBool::new(false),
            killer,
        });
        let sh = shared.clone();
        let structured = info.structured;
        let ctx = info.base_allocation;
        let handle = std::thread::Builder::new()
            .name("nbd-reader".into())
            .spawn(move || {
                let mut r = Reader {
                    sock: &mut rsock,
                    shared: &sh,
                    structured,
                    ctx,
                    timeout: io_timeout,
                    last_progress: Instant::now(),
                    scratch: Vec::new(),
                };
                let why = r.run();
                sh.fail(why);
            })
            .map_err(|e| Error::io("spawning the NBD reader thread", e))?;
        Ok(Connection {
            info,
            writer: Mutex::new(sock),
            shared,
            reader: Mutex::new(Some(handle)),
            next_cookie: AtomicU64::new(1),
            opts: opts.clone(),
        })
    }

    /// What the handshake established.
    pub fn info(&self) -> &ExportInfo {
        &self.info
    }

    /// The options this connection was opened with.
    pub fn options(&self) -> &ConnectOptions {
        &self.opts
    }

    /// Requests currently in flight.
    pub fn in_flight(&self) -> usize {
        lock(&self.shared.state).in_flight
    }

    /// The error that killed the connection, if it is dead.
    pub fn dead_error(&self) -> Option<Error> {
        lock(&self.shared.state).dead.as_ref().map(Dead::to_error)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.info.size => Ok(()),
            _ => Err(Error::OutOfRange {
                offset,
                len,
                size: self.info.size,
            }),
        }
    }

    fn submit(
        &self,
        flags: u16,
        cmd: u16,
        offset: u64,
        len: u32,
        kind: PendingKind,
        payload: Option<&[u8]>,
    ) -> Result<Ticket> {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let req = RequestInfo { cmd, offset, len };
        let slot = Arc::new(Slot {
            result: Mutex::new(None),
            cv: Condvar::new(),
        });
        {
            let mut st = lock(&self.shared.state);
            loop {
                if let Some(d) = &st.dead {
                    return Err(d.to_error());
                }
                if self.shared.server_shutdown.load(Ordering::SeqCst) {
                    return Err(Error::ConnectionLost(
                        "the server is shutting down (it answered ESHUTDOWN)".into(),
                    ));
                }
                if st.in_flight < self.shared.max_in_flight {
                    break;
                }
                st = self
                    .shared
                    .space
                    .wait(st)
                    .unwrap_or_else(|p| p.into_inner());
            }
            st.in_flight += 1;
            st.pending.insert(
                cookie,
                Pending {
                    req,
                    kind,
                    error: None,
                    slot: slot.clone(),
                },
            );
        }
        let hdr = encode_request(flags, cmd, cookie, offset, len);
        let res = {
            let mut w = lock(&self.writer);
            match payload {
                None => w.write_all(&hdr),
                Some(p) => write_all_vectored(&mut w, &hdr, p),
            }
        };
        if let Err(e) = res {
            let why =
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut {
                    Dead::Timeout(self.opts.io_timeout.as_secs())
                } else {
                    Dead::Io(format!("sending {} request: {e}", cmd_name(cmd)))
                };
            self.shared.fail(why);
        }
        Ok(Ticket { slot })
    }

    /// Submits a READ of `buf.len()` bytes at `offset`; the reply hands the
    /// filled buffer back ([`Reply::Data`]).
    pub fn submit_read(&self, offset: u64, buf: Vec<u8>) -> Result<Ticket> {
        let len = buf.len() as u64;
        if len == 0 || len > u64::from(self.info.max_payload()) {
            return Err(Error::InvalidArgument(format!(
                "READ length {len} must be in 1..={}",
                self.info.max_payload()
            )));
        }
        self.check_range(offset, len)?;
        let req = RequestInfo {
            cmd: CMD_READ,
            offset,
            len: len as u32,
        };
        let cov = ReadCoverage::new(&req);
        self.submit(
            0,
            CMD_READ,
            offset,
            len as u32,
            PendingKind::Read { buf, cov },
            None,
        )
    }

    /// Submits a WRITE; the data is sent before this returns.
    pub fn submit_write(&self, offset: u64, data: &[u8], fua: bool) -> Result<Ticket> {
        let len = data.len() as u64;
        if len == 0 || len > u64::from(self.info.max_payload()) {
            return Err(Error::InvalidArgument(format!(
                "WRITE length {len} must be in 1..={}",
                self.info.max_payload()
            )));
        }
        if self.info.read_only() {
            return Err(Error::Unsupported("export is read-only".into()));
        }
        self.check_range(offset, len)?;
        let flags = if fua && self.info.can_fua() {
            CMD_FLAG_FUA
        } else {
            0
        };
        self.submit(
            flags,
            CMD_WRITE,
            offset,
            len as u32,
            PendingKind::Other,
            Some(data),
        )
    }

    /// Submits WRITE_ZEROES. `fast` sets `NBD_CMD_FLAG_FAST_ZERO` (only if
    /// the server offers it). `NBD_CMD_FLAG_NO_HOLE` is never set, so the
    /// server may punch holes.
    pub fn submit_write_zeroes(&self, offset: u64, len: u32, fast: bool) -> Result<Ticket> {
        if !self.info.can_zero() {
            return Err(Error::Unsupported(
                "server does not support WRITE_ZEROES".into(),
            ));
        }
        if self.info.read_only() {
            return Err(Error::Unsupported("export is read-only".into()));
        }
        self.check_range(offset, len.into())?;
        let flags = if fast && self.info.can_fast_zero() {
            CMD_FLAG_FAST_ZERO
        } else {
            0
        };
        self.submit(
            flags,
            CMD_WRITE_ZEROES,
            offset,
            len,
            PendingKind::Other,
            None,
        )
    }

    /// Submits TRIM (contents afterwards are undefined; not a way to zero).
    pub fn submit_trim(&self, offset: u64, len: u32) -> Result<Ticket> {
        if !self.info.can_trim() {
            return Err(Error::Unsupported("server does not support TRIM".into()));
        }
        self.check_range(offset, len.into())?;
        self.submit(0, CMD_TRIM, offset, len, PendingKind::Other, None)
    }

    /// Submits FLUSH.
    pub fn submit_flush(&self) -> Result<Ticket> {
        if !self.info.can_flush() {
            return Err(Error::Unsupported("server does not support FLUSH".into()));
        }
        self.submit(0, CMD_FLUSH, 0, 0, PendingKind::Other, None)
    }

    /// Submits BLOCK_STATUS for `base:allocation`.
    pub fn submit_block_status(&self, offset: u64, len: u32) -> Result<Ticket> {
        if self.info.base_allocation.is_none() {
            return Err(Error::Unsupported(
                "base:allocation was not negotiated".into(),
            ));
        }
        if len == 0 {
            return Err(Error::InvalidArgument("BLOCK_STATUS of length 0".into()));
        }
        self.check_range(offset, len.into())?;
        self.submit(
            0,
            CMD_BLOCK_STATUS,
            offset,
            len,
            PendingKind::BlockStatus { extents: None },
            None,
        )
    }

    /// Sends NBD_CMD_DISC after the requests in flight completed (waits at
    /// most the I/O timeout for them), then closes the socket. Idempotent.
    pub fn disconnect(&self) {
        if self.shared.closing.swap(true, Ordering::SeqCst) {
            return;
        }
        let deadline = Instant::now() + self.opts.io_timeout;
        {
            let mut st = lock(&self.shared.state);
            while st.in_flight > 0 && st.dead.is_none() && Instant::now() < deadline {
                let (g, _) = self
                    .shared
                    .space
                    .wait_timeout(st, Duration::from_millis(100))
                    .unwrap_or_else(|p| p.into_inner());
                st = g;
            }
        }
        let alive = lock(&self.shared.state).dead.is_none();
        if alive {
            let hdr = encode_request(0, CMD_DISC, 0, 0, 0);
            let _ = lock(&self.writer).write_all(&hdr);
        }
        self.shared.fail(Dead::Closed);
        if let Some(h) = lock(&self.reader).take() {
            let _ = h.join();
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.disconnect();
    }
}

fn write_all_vectored(w: &mut Sock, hdr: &[u8], data: &[u8]) -> io::Result<()> {
    let mut hoff = 0usize;
    let mut doff = 0usize;
    while hoff < hdr.len() || doff < data.len() {
        let bufs = [
            io::IoSlice::new(&hdr[hoff..]),
            io::IoSlice::new(&data[doff..]),
        ];
        let n = match w.write_vectored(&bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let h = n.min(hdr.len() - hoff);
        hoff += h;
        doff += n - h;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Reader thread
// ---------------------------------------------------------------------------

struct Reader<'a> {
    sock: &'a mut Sock,
    shared: &'a Shared,
    structured: bool,
    ctx: Option<u32>,
    timeout: Duration,
    last_progress: Instant,
    scratch: Vec<u8>,
}

enum ReadErr {
    Dead(Dead),
}

impl From<ProtoError> for ReadErr {
    fn from(p: ProtoError) -> Self {
        ReadErr::Dead(Dead::Protocol(p))
    }
}

impl Reader<'_> {
    fn run(&mut self) -> Dead {
        loop {
            match self.one() {
                Ok(()) => {}
                Err(ReadErr::Dead(d)) => return d,
            }
        }
    }

    /// Fills `buf` from the socket. `idle_ok`: at a message boundary, with
    /// nothing in flight, waiting is not a timeout.
    fn fill(&mut self, buf: &mut [u8], idle_ok: bool) -> Result<(), ReadErr> {
        let mut got = 0;
        while got < buf.len() {
            match self.sock.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(ReadErr::Dead(
                        if self.shared.closing.load(Ordering::SeqCst) {
                            Dead::Closed
                        } else {
                            Dead::Eof
                        },
                    ))
                }
                Ok(n) => {
                    got += n;
                    self.last_progress = Instant::now();
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    if self.shared.closing.load(Ordering::SeqCst) {
                        return Err(ReadErr::Dead(Dead::Closed));
                    }
                    if idle_ok && got == 0 && lock(&self.shared.state).in_flight == 0 {
                        self.last_progress = Instant::now();
                        continue;
                    }
                    if self.last_progress.elapsed() >= self.timeout {
                        return Err(ReadErr::Dead(Dead::Timeout(self.timeout.as_secs())));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(ReadErr::Dead(
                        if self.shared.closing.load(Ordering::SeqCst) {
                            Dead::Closed
                        } else {
                            Dead::Io(format!("reading from the NBD server: {e}"))
                        },
                    ))
                }
            }
        }
        Ok(())
    }

    fn take(&self, cookie: u64) -> Result<Pending, ReadErr> {
        lock(&self.shared.state)
            .pending
            .remove(&cookie)
            .ok_or(ReadErr::Dead(Dead::Protocol(ProtoError::UnknownCookie(
                cookie,
            ))))
    }

    fn put_back(&self, cookie: u64, p: Pending) {
        lock(&self.shared.state).pending.insert(cookie, p);
    }

    /// Reads one reply message and applies it to the request it answers
    /// (taken out of the table meanwhile, so no lock is held during socket
    /// reads). On error that request fails too, and the reader's caller
    /// fails the whole connection; entries put back after a concurrent
    /// `fail` are drained by the final `fail` when the reader exits.
    fn one(&mut self) -> Result<(), ReadErr> {
        let mut magic = [0u8; 4];
        self.fill(&mut magic, true)?;
        let hlen = reply_header_len(magic, self.structured)?;
        let mut hbuf = [0u8; STRUCTURED_HEADER_LEN];
        hbuf[..4].copy_from_slice(&magic);
        self.fill(&mut hbuf[4..hlen], false)?;
        let header = parse_reply_header(&hbuf[..hlen], self.structured)?;
        let cookie = header.cookie();
        let mut p = self.take(cookie)?;
        let r = self.handle(header, &mut p);
        match r {
            Ok(true) => {
                let result = finalize(&mut p);
                if matches!(&result, Err(e) if e.server_errno() == Some(ESHUTDOWN)) {
                    // The spec requires a soft disconnect: refuse new
                    // requests; NBD_CMD_DISC goes out on disconnect/drop.
                    self.shared.server_shutdown.store(true, Ordering::SeqCst);
                }
                self.shared.finish(p, result);
                Ok(())
            }
            Ok(false) => {
                self.put_back(cookie, p);
                Ok(())
            }
            Err(ReadErr::Dead(d)) => {
                p.slot.complete(Err(d.to_error()));
                let mut st = lock(&self.shared.state);
                st.in_flight -= 1;
                drop(st);
                Err(ReadErr::Dead(d))
            }
        }
    }

    /// Handles one message for `p`; returns true when the reply is complete.
    fn handle(&mut self, header: ReplyHeader, p: &mut Pending) -> Result<bool, ReadErr> {
        match header {
            ReplyHeader::Simple { error, .. } => {
                let dlen = simple_reply_data_len(error, self.structured, &p.req)?;
                if error != 0 {
                    p.error
                        .get_or_insert(server_error(&p.req, error, String::new(), None));
                } else if dlen > 0 {
                    match &mut p.kind {
                        PendingKind::Read { buf, cov } => {
                            let n = buf.len();
                            // Cannot fail: dlen == request length == buf.len().
                            let b = &mut buf[..n.min(dlen as usize)];
                            self.fill_into(b)?;
                            cov.add(p.req.offset, dlen.into())?;
                        }
                        _ => {
                            return Err(ProtoError::Malformed(
                                "simple reply data for a non-READ".into(),
                            )
                            .into())
                        }
                    }
                }
                Ok(true)
            }
            ReplyHeader::Chunk {
                flags, kind, len, ..
            } => {
                check_chunk_len(kind, len, &p.req)?;
                if kind == REPLY_TYPE_OFFSET_DATA {
                    if len < 9 {
                        return Err(ProtoError::Malformed(
                            "NBD_REPLY_TYPE_OFFSET_DATA shorter than 9 bytes".into(),
                        )
                        .into());
                    }
                    let mut ob = [0u8; 8];
                    self.fill(&mut ob, false)?;
                    let off = u64::from_be_bytes(ob);
                    let dlen = u64::from(len - 8);
                    let PendingKind::Read { buf, cov } = &mut p.kind else {
                        return Err(
                            ProtoError::Malformed("data chunk for a non-READ".into()).into()
                        );
                    };
                    cov.add(off, dlen)?;
                    let start = (off - p.req.offset) as usize;
                    let mut b = std::mem::take(buf);
                    let r = self.fill_into(&mut b[start..start + dlen as usize]);
                    if let PendingKind::Read { buf, .. } = &mut p.kind {
                        *buf = b;
                    }
                    r?;
                } else {
                    let mut scratch = std::mem::take(&mut self.scratch);
                    scratch.clear();
                    scratch.resize(len as usize, 0);
                    let r = self.fill(&mut scratch, false);
                    let res = r.and_then(|_| {
                        let chunk = parse_chunk_payload(flags, kind, &scratch, &p.req)?;
                        self.apply(chunk, p)
                    });
                    if scratch.capacity() <= 1 << 20 {
                        self.scratch = scratch;
                    }
                    res?;
                }
                Ok(flags & REPLY_FLAG_DONE != 0)
            }
        }
    }

    fn fill_into(&mut self, b: &mut [u8]) -> Result<(), ReadErr> {
        self.fill(b, false)
    }

    fn apply(&self, chunk: Chunk<'_>, p: &mut Pending) -> Result<(), ReadErr> {
        match chunk {
            Chunk::None => {}
            // Data chunks are read straight into the READ buffer in `handle`.
            Chunk::OffsetData { .. } => {}
            Chunk::OffsetHole { offset, len } => {
                if let PendingKind::Read { buf, cov } = &mut p.kind {
                    cov.add(offset, len.into())?;
                    let s = (offset - p.req.offset) as usize;
                    buf[s..s + len as usize].fill(0);
                }
            }
            Chunk::BlockStatus {
                context,
                descriptors,
            } => {
                if let PendingKind::BlockStatus { extents } = &mut p.kind {
                    if Some(context) == self.ctx {
                        if extents.is_some() {
                            return Err(ProtoError::Malformed(
                                "two block status chunks for the same context".into(),
                            )
                            .into());
                        }
                        *extents = Some(descriptors);
                    }
                }
            }
            Chunk::Error {
                errno,
                message,
                offset,
                ..
            } => {
                p.error
                    .get_or_insert(server_error(&p.req, errno, message, offset));
            }
        }
        Ok(())
    }
}

fn server_error(req: &RequestInfo, errno: u32, message: String, offset: Option<u64>) -> Error {
    Error::Server {
        command: cmd_name(req.cmd),
        offset: req.offset,
        len: req.len.into(),
        errno,
        errno_name: proto::errno_name(errno),
        message,
        error_offset: offset,
    }
}

fn finalize(p: &mut Pending) -> Result<Reply> {
    if let Some(e) = p.error.take() {
        return Err(e);
    }
    match std::mem::replace(&mut p.kind, PendingKind::Other) {
        PendingKind::Read { buf, cov } => {
            if !cov.complete() {
                return Err(ProtoError::Malformed(format!(
                    "READ at {} length {} reported success without sending all data",
                    p.req.offset, p.req.len
                ))
                .into());
            }
            Ok(Reply::Data(buf))
        }
        PendingKind::BlockStatus { extents } => match extents {
            Some(e) => Ok(Reply::Extents(e)),
            None => Err(ProtoError::Malformed(
                "BLOCK_STATUS reply without base:allocation extents".into(),
            )
            .into()),
        },
        PendingKind::Other => Ok(Reply::Done),
    }
}
