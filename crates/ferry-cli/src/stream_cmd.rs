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

use std::fs::File;
use std::io::{self, IsTerminal, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ferry_channel::Psk;
use ferry_stream::{ErrorKind, FileOut, Mode, Options, RecvHooks, Stats, StreamError, Summary};

use crate::exit as code;

/// Options shared by the three commands.
#[derive(clap::Args, Debug, Clone)]
pub struct StreamOpts {
    /// Read the pre-shared key from this file (at least 16 bytes after
    /// trimming whitespace, e.g. 32 hex digits). Default: $FERRY_KEY.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Compression: auto (chosen per block from measured CPU and link
    /// speed), none, lz4, zstd or zstd:LEVEL.
    #[arg(long, default_value = "auto", value_name = "MODE")]
    pub compress: String,
    /// Memory buffer on each side (e.g. 256M, 1G).
    #[arg(short = 'm', long, default_value = "256M", value_name = "SIZE")]
    pub buffer: String,
    /// Block size (4K to 1M): the unit of compression and framing.
    #[arg(long, default_value = "1M", value_name = "SIZE")]
    pub block_size: String,
    /// Show the status line even when stderr is not a terminal.
    #[arg(long)]
    pub progress: bool,
    /// Print one JSON object with the result at the end.
    #[arg(long)]
    pub json: bool,
    /// A peer that sends nothing, not even a keepalive (each side sends one
    /// after 1 s with nothing to say), for this many seconds is dead (exit
    /// 5); at least 2. recv also waits at most this long for a sender that
    /// proves the key. Default: no limit.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
}

/// `producer | ferry send HOST:PORT [FILE]`
#[derive(clap::Args, Debug)]
pub struct SendArgs {
    /// The receiver (`ferry recv --listen ...`), as HOST:PORT.
    pub dest: String,
    /// Read this file instead of stdin.
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub o: StreamOpts,
}

/// `ferry recv --listen ADDR:PORT [FILE] | consumer`
#[derive(clap::Args, Debug)]
pub struct RecvArgs {
    /// Address to listen on, e.g. 0.0.0.0:9000 (port 0: any free port).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: String,
    /// Write the stream to this file instead of stdout.
    #[arg(conflicts_with = "command")]
    pub file: Option<PathBuf>,
    /// Read the key as the first line of stdin (used by `ferry pipe`).
    #[arg(long, hide = true)]
    pub key_stdin: bool,
    /// Print `FERRY-PORT <port>` on stdout once listening, then read the
    /// transport (`tcp` or `stdin`) as a line from stdin (used by `ferry pipe`).
    #[arg(long, hide = true)]
    pub announce: bool,
    /// Run COMMAND with the stream as its stdin; exit with its status.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
    #[command(flatten)]
    pub o: StreamOpts,
}

/// `producer | ferry pipe [user@]host -- COMMAND ARGS...`
#[derive(clap::Args, Debug)]
pub struct PipeArgs {
    /// Where to run COMMAND, as for ssh: [user@]host.
    pub target: String,
    /// The command that reads the stream on the remote host.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
    /// Read this file instead of stdin.
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Remote shell used to start the remote side.
    #[arg(short = 'e', long, default_value = "ssh", value_name = "COMMAND")]
    pub rsh: String,
    /// Path of ferry on the remote host.
    #[arg(long, default_value = "ferry", value_name = "PATH")]
    pub remote_ferry: String,
    /// Carry the data through ssh instead of a direct TCP connection.
    #[arg(long)]
    pub via_ssh: bool,
    /// Address the remote side listens on for the direct connection.
    #[arg(long, default_value = "0.0.0.0", value_name = "ADDR")]
    pub remote_listen: String,
    #[command(flatten)]
    pub o: StreamOpts,
}

// ---------------------------------------------------------------- helpers

/// Parse `123`, `64K`, `256M`, `1G`, `1MiB`, `2GB` (binary multiples).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("bad size {s:?}: use a number with K, M or G")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} too large"))
}

fn read_key(o: &StreamOpts) -> Result<Psk, String> {
    let raw = if let Some(f) = &o.key_file {
        std::fs::read(f).map_err(|e| format!("cannot read key file {}: {e}", f.display()))?
    } else if let Ok(k) = std::env::var("FERRY_KEY") {
        k.into_bytes()
    } else {
        return Err(
            "no key: pass --key-file FILE or set FERRY_KEY (at least 16 bytes, e.g. 32 hex digits)"
                .into(),
        );
    };
    Psk::new(&raw).map_err(|e| e.to_string())
}

fn options(o: &StreamOpts, key: Psk) -> Result<Options, String> {
    let mut opts = Options::new(key);
    opts.compress = o.compress.parse::<Mode>().map_err(|e| e.to_string())?;
    opts.buffer = parse_size(&o.buffer)?;
    opts.block_size = parse_size(&o.block_size)?;
    if !(ferry_stream::MIN_BLOCK..=ferry_stream::MAX_BLOCK).contains(&opts.block_size) {
        return Err("--block-size must be between 4K and 1M".into());
    }
    if let Some(t) = o.timeout {
        // Keepalives go out after 1 s of silence: a shorter timeout would
        // take a live peer for a dead one.
        if !(2.0..=1e6).contains(&t) {
            return Err("--timeout takes a number of seconds, at least 2".into());
        }
        opts.wait = Some(Duration::from_secs_f64(t));
        opts.idle = Some(Duration::from_secs_f64(t));
    }
    Ok(opts)
}

fn usage(msg: &str) -> i32 {
    errln!("ferry: {msg}");
    code::USAGE
}

fn exit_code(e: &StreamError, receiving: bool) -> i32 {
    match e.kind {
        ErrorKind::Usage => code::USAGE,
        ErrorKind::Io
        | ErrorKind::ConsumerExited
        | ErrorKind::PeerConsumerExited
        | ErrorKind::ProducerFailed => code::IO,
        ErrorKind::Integrity => code::PROTOCOL,
        ErrorKind::PeerKilled if receiving => code::PROTOCOL,
        ErrorKind::WrongKey => code::AUTH,
        ErrorKind::PeerKilled
        | ErrorKind::TimedOut
        | ErrorKind::AddrInUse
        | ErrorKind::Unreachable => code::CONNECTION,
    }
}

fn kind_name(k: ErrorKind) -> &'static str {
    match k {
        ErrorKind::Usage => "usage",
        ErrorKind::WrongKey => "wrong_key",
        ErrorKind::AddrInUse => "address_in_use",
        ErrorKind::Unreachable => "unreachable",
        ErrorKind::ConsumerExited => "consumer_exited",
        ErrorKind::PeerConsumerExited => "peer_consumer_exited",
        ErrorKind::ProducerFailed => "producer_failed",
        ErrorKind::PeerKilled => "peer_lost",
        ErrorKind::Integrity => "integrity",
        ErrorKind::Io => "io",
        ErrorKind::TimedOut => "timeout",
    }
}

fn human(n: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} {}", units[i])
    } else {
        format!("{v:.2} {}", units[i])
    }
}

fn rate(n: f64) -> String {
    format!("{}/s", human(n))
}

/// Draws the mbuffer-like status line until the stream is done.
struct Progress {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Progress {
    fn start(stats: Arc<Stats>, force: bool) -> Progress {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tty = io::stderr().is_terminal();
        if !(tty || force) {
            return Progress { stop, handle: None };
        }
        let s2 = stop.clone();
        let handle = thread::Builder::new()
            .name("ferry-progress".into())
            .spawn(move || {
                let mut last = (Instant::now(), 0u64, 0u64);
                let end = if tty { "\r" } else { "\n" };
                while !s2.load(Ordering::Relaxed) && !stats.done.load(Ordering::Relaxed) {
                    thread::sleep(Duration::from_millis(if tty { 500 } else { 1000 }));
                    let now = Instant::now();
                    let i = Stats::get(&stats.plain_in);
                    let o = Stats::get(&stats.plain_out);
                    let dt = now.duration_since(last.0).as_secs_f64().max(1e-3);
                    let line = format!(
                        "in @ {}, out @ {}, {} total, buffer {:3.0}% full, ratio {:.2}",
                        rate((i - last.1) as f64 / dt),
                        rate((o - last.2) as f64 / dt),
                        human(o as f64),
                        stats.fill_pct(),
                        stats.ratio()
                    );
                    last = (now, i, o);
                    let _ = write!(std::io::stderr(), "{line:<90}{end}");
                }
            })
            .ok();
        Progress { stop, handle }
    }

    fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
            if io::stderr().is_terminal() {
                let _ = write!(std::io::stderr(), "{:<90}\r", "");
            }
        }
    }
}

/// Where `--json` goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum JsonTo {
    Stdout,
    Stderr,
}

fn json_to(json: bool, to: JsonTo) -> Option<JsonTo> {
    json.then_some(to)
}

fn report(
    what: &str,
    res: &Result<Summary, StreamError>,
    stats: &Stats,
    cpu0: Duration,
    t0: Instant,
    json: Option<JsonTo>,
    code: i32,
) {
    let cpu = ferry_stream::cpu_time().saturating_sub(cpu0).as_secs_f64();
    let secs = t0.elapsed().as_secs_f64().max(1e-6);
    let bytes = match res {
        Ok(s) => s.bytes,
        Err(_) => Stats::get(&stats.plain_out),
    };
    let wire = Stats::get(&stats.wire);
    match res {
        Ok(s) => errln!(
            "summary: {} {what} in {:.1} s - average of {}, {} on the wire (ratio {:.2}), cpu {:.1} s, {}",
            human(bytes as f64),
            secs,
            rate(bytes as f64 / secs),
            human(wire as f64),
            stats.ratio(),
            cpu,
            s.suite
        ),
        Err(e) => errln!("ferry {what}: error: {e}"),
    }
    if let Some(to) = json {
        let (ok, err, kind) = match res {
            Ok(_) => (true, None, None),
            Err(e) => (false, Some(e.msg.clone()), Some(kind_name(e.kind))),
        };
        let v = serde_json::json!({
            "command": what,
            "ok": ok,
            "exit_code": code,
            "bytes": bytes,
            "wire_bytes": wire,
            "ratio": stats.ratio(),
            "seconds": secs,
            "bytes_per_second": bytes as f64 / secs,
            "cpu_seconds": cpu,
            "blocks": {
                "raw": Stats::get(&stats.blocks_raw),
                "lz4": Stats::get(&stats.blocks_lz4),
                "zstd": Stats::get(&stats.blocks_zstd),
            },
            "blake3": res.as_ref().ok().map(|s| s.blake3.clone()),
            "cipher": res.as_ref().ok().map(|s| s.suite.clone()),
            "remote_status": match res { Ok(s) => s.remote_status, Err(e) => e.remote_status },
            "error": err,
            "error_kind": kind,
        });
        if to == JsonTo::Stderr {
            errln!("{v}");
        } else {
            outln!("{v}");
        }
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

/// Read one line byte by byte (nothing past the newline is consumed).
fn read_line_raw<R: Read>(r: &mut R, max: usize) -> io::Result<String> {
    let mut v = Vec::new();
    let mut b = [0u8; 1];
    while v.len() < max {
        match r.read(&mut b) {
            Ok(0) => break,
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => v.push(b[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&v).trim().to_string())
}

// ---------------------------------------------------------------- send

pub fn run_send(a: SendArgs) -> i32 {
    let key = match read_key(&a.o) {
        Ok(k) => k,
        Err(e) => return usage(&e),
    };
    let opts = match options(&a.o, key) {
        Ok(o) => o,
        Err(e) => return usage(&e),
    };
    let peer = match resolve(&a.dest) {
        Ok(p) => p,
        Err(e) => {
            errln!("ferry send: {e}");
            return code::CONNECTION;
        }
    };
    let input = match &a.file {
        Some(f) => File::open(f).map_err(|e| format!("cannot open {}: {e}", f.display())),
        None => stdin_file().map_err(|e| format!("stdin: {e}")),
    };
    let input = match input {
        Ok(i) => i,
        Err(e) => {
            errln!("ferry send: {e}");
            return code::IO;
        }
    };
    let (cpu0, t0) = (ferry_stream::cpu_time(), Instant::now());
    let p = Progress::start(opts.stats.clone(), a.o.progress);
    let res = ferry_stream::send(&opts, input, peer);
    p.finish();
    let c = match &res {
        Ok(_) => code::OK,
        Err(e) => exit_code(e, false),
    };
    report(
        "send",
        &res,
        &opts.stats,
        cpu0,
        t0,
        json_to(a.o.json, JsonTo::Stdout),
        c,
    );
    c
}

// ---------------------------------------------------------------- recv

enum Sink {
    Stdout,
    File(PathBuf),
    Command(Vec<String>),
}

pub fn run_recv(a: RecvArgs) -> i32 {
    let key = if a.key_stdin {
        match stdin_file().and_then(|mut f| read_line_raw(&mut f, 4096)) {
            Ok(k) => Psk::new(k.as_bytes()).map_err(|e| e.to_string()),
            Err(e) => Err(format!("reading the key from stdin: {e}")),
        }
    } else {
        read_key(&a.o)
    };
    let key = match key {
        Ok(k) => k,
        Err(e) => return usage(&e),
    };
    let opts = match options(&a.o, key) {
        Ok(o) => o,
        Err(e) => return usage(&e),
    };
    let listen = match resolve(&a.listen) {
        Ok(l) => l,
        Err(e) => return usage(&e),
    };
    let sink = if !a.command.is_empty() {
        Sink::Command(a.command.clone())
    } else if let Some(f) = &a.file {
        Sink::File(f.clone())
    } else {
        Sink::Stdout
    };
    let jt = json_to(
        a.o.json,
        if matches!(sink, Sink::Stdout) {
            JsonTo::Stderr
        } else {
            JsonTo::Stdout
        },
    );
    let (cpu0, t0) = (ferry_stream::cpu_time(), Instant::now());

    let listener = match ferry_stream::bind(listen) {
        Ok(l) => l,
        Err(e) => {
            let c = exit_code(&e, true);
            report("recv", &Err(e), &opts.stats, cpu0, t0, jt, c);
            return c;
        }
    };
    // Transport: a TCP connection, or (pipe --via-ssh) our stdin/stdout.
    let mut via_stdin = false;
    if a.announce {
        let port = listener.local_addr().map(|l| l.port()).unwrap_or(0);
        let mut out = io::stdout();
        if writeln!(out, "FERRY-PORT {port}")
            .and_then(|_| out.flush())
            .is_err()
        {
            return code::IO;
        }
        match stdin_file().and_then(|mut f| read_line_raw(&mut f, 64)) {
            Ok(m) if m == "stdin" => via_stdin = true,
            Ok(m) if m == "tcp" => {}
            Ok(m) => return usage(&format!("unexpected transport {m:?} from ferry pipe")),
            Err(e) => return usage(&format!("reading the transport from stdin: {e}")),
        }
    }

    let p = Progress::start(opts.stats.clone(), a.o.progress);
    // Our stdout or FILE: a file descriptor either way, written through
    // FileOut (O_DIRECT when it is a regular file).
    // FILE is created (truncated) and COMMAND started only once a sender
    // has proved the key.
    let res = match sink {
        Sink::Stdout => stdout_file()
            .map_err(|e| StreamError::new(ErrorKind::Io, format!("stdout: {e}")))
            .and_then(|f| {
                recv_with(
                    &opts,
                    &listener,
                    via_stdin,
                    ferry_stream::opened(FileOut::new(f)),
                )
            }),
        Sink::File(path) => {
            let open: ferry_stream::Opener<FileOut> = Box::new(move || {
                let f = File::create(&path).map_err(|e| {
                    StreamError::new(
                        ErrorKind::Io,
                        format!("cannot create {}: {e}", path.display()),
                    )
                })?;
                Ok((FileOut::new(f), RecvHooks::default()))
            });
            recv_with(&opts, &listener, via_stdin, open)
        }
        Sink::Command(cmd) => recv_to_command(&opts, &listener, via_stdin, cmd),
    };
    p.finish();
    let c = match &res {
        Ok(s) => s.remote_status.unwrap_or(code::OK),
        Err(e) => match e.remote_status {
            Some(s) if s != 0 => s,
            _ => exit_code(e, true),
        },
    };
    report("recv", &res, &opts.stats, cpu0, t0, jt, c);
    c
}

fn recv_with<W: Write + Send + 'static>(
    opts: &Options,
    l: &std::net::TcpListener,
    via_stdin: bool,
    open: ferry_stream::Opener<W>,
) -> Result<Summary, StreamError> {
    if via_stdin {
        let r = stdin_file().map_err(|e| StreamError::new(ErrorKind::Io, format!("stdin: {e}")))?;
        let w =
            stdout_file().map_err(|e| StreamError::new(ErrorKind::Io, format!("stdout: {e}")))?;
        ferry_stream::recv_over(opts, r, w, open, None)
    } else {
        // A connection that fails the handshake is told on stderr and
        // dropped; recv goes on waiting.
        let refused = |peer: std::net::SocketAddr, e: &StreamError| {
            errln!("ferry recv: refused a connection from {peer}: {e}");
        };
        ferry_stream::recv_on(opts, l, open, &refused)
    }
}

fn recv_to_command(
    opts: &Options,
    l: &std::net::TcpListener,
    via_stdin: bool,
    cmd: Vec<String>,
) -> Result<Summary, StreamError> {
    // Filled once the command runs, so a failed stream can kill it.
    let started: Arc<Mutex<Option<Arc<Mutex<Child>>>>> = Arc::default();
    let slot = started.clone();
    let open: ferry_stream::Opener<ChildStdin> = Box::new(move || {
        let mut c = Command::new(&cmd[0]);
        c.args(&cmd[1..]).stdin(Stdio::piped());
        if via_stdin {
            // Our stdout carries the channel: the command's output goes to stderr.
            let fd = io::stderr()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| StreamError::new(ErrorKind::Io, format!("stderr: {e}")))?;
            c.stdout(Stdio::from(fd));
        }
        let mut child = c.spawn().map_err(|e| {
            let mut err = StreamError::new(ErrorKind::Io, format!("cannot run {}: {e}", cmd[0]));
            err.remote_status = Some(if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            });
            err
        })?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| StreamError::new(ErrorKind::Io, "command has no stdin"))?;
        let child = Arc::new(Mutex::new(child));
        if let Ok(mut s) = slot.lock() {
            *s = Some(child.clone());
        }
        let (c1, c2) = (child.clone(), child);
        let hooks = RecvHooks {
            on_complete: Some(Box::new(move || wait_status(&c1))),
            on_abort: Some(Arc::new(move || {
                if let Ok(mut ch) = c2.lock() {
                    let _ = ch.kill();
                }
            })),
        };
        Ok((stdin, hooks))
    });
    let res = recv_with(opts, l, via_stdin, open);
    if res.is_err() {
        // The stream failed: the command must not finish on partial input.
        if let Some(child) = started.lock().ok().and_then(|mut s| s.take()) {
            if let Ok(mut ch) = child.lock() {
                let _ = ch.kill();
                let _ = ch.wait();
            }
        }
    }
    res
}

fn wait_status(child: &Mutex<Child>) -> Option<i32> {
    let mut ch = child.lock().ok()?;
    let st = ch.wait().ok()?;
    use std::os::unix::process::ExitStatusExt;
    Some(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)))
}

// ---------------------------------------------------------------- pipe

/// Quote one word for the remote shell.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@%+,".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

struct KillOnDrop(Option<Child>);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

pub fn run_pipe(a: PipeArgs) -> i32 {
    let key = match Psk::generate_hex() {
        Ok(k) => k,
        Err(e) => {
            errln!("ferry pipe: {e}");
            return code::IO;
        }
    };
    let psk = match Psk::new(key.as_bytes()) {
        Ok(p) => p,
        Err(e) => return usage(&e.to_string()),
    };
    let opts = match options(&a.o, psk) {
        Ok(o) => o,
        Err(e) => return usage(&e),
    };
    let input = match &a.input {
        Some(f) => File::open(f).map_err(|e| format!("cannot open {}: {e}", f.display())),
        None => stdin_file().map_err(|e| format!("stdin: {e}")),
    };
    let input = match input {
        Ok(i) => i,
        Err(e) => {
            errln!("ferry pipe: {e}");
            return code::IO;
        }
    };
    let rsh: Vec<&str> = a.rsh.split_whitespace().collect();
    if rsh.is_empty() {
        return usage("--rsh is empty");
    }
    let mut remote = vec![
        a.remote_ferry.clone(),
        "recv".into(),
        "--listen".into(),
        format!("{}:0", a.remote_listen),
        "--key-stdin".into(),
        "--announce".into(),
        "--compress".into(),
        a.o.compress.clone(),
        "--buffer".into(),
        a.o.buffer.clone(),
        "--block-size".into(),
        a.o.block_size.clone(),
    ];
    if let Some(t) = a.o.timeout {
        remote.extend(["--timeout".into(), t.to_string()]);
    }
    remote.push("--".into());
    remote.extend(a.command.iter().cloned());
    let remote_line = remote
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ");
    let spawned = Command::new(rsh[0])
        .args(&rsh[1..])
        .arg(&a.target)
        .arg(&remote_line)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    let mut guard = match spawned {
        Ok(c) => KillOnDrop(Some(c)),
        Err(e) => {
            errln!("ferry pipe: cannot run {}: {e}", rsh[0]);
            return code::REMOTE;
        }
    };
    let (mut ssh_in, mut ssh_out) =
        match guard.0.as_mut().map(|c| (c.stdin.take(), c.stdout.take())) {
            Some((Some(i), Some(o))) => (i, o),
            _ => {
                errln!("ferry pipe: ssh has no pipes");
                return code::REMOTE;
            }
        };
    let (cpu0, t0) = (ferry_stream::cpu_time(), Instant::now());
    if writeln!(ssh_in, "{key}")
        .and_then(|_| ssh_in.flush())
        .is_err()
    {
        errln!(
            "ferry pipe: {} exited before the remote ferry started",
            rsh[0]
        );
        return ssh_failed(&mut guard);
    }
    let line = read_line_raw(&mut ssh_out, 256).unwrap_or_default();
    let port: Option<u16> = line
        .strip_prefix("FERRY-PORT ")
        .and_then(|p| p.trim().parse().ok());
    let Some(port) = port else {
        errln!(
            "ferry pipe: the remote side did not start (is {} installed there? it said {line:?})",
            a.remote_ferry
        );
        return ssh_failed(&mut guard);
    };
    let host = a.target.rsplit('@').next().unwrap_or(&a.target);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let direct = if a.via_ssh {
        None
    } else {
        (host, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| it.next())
            .and_then(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok())
    };
    let p = Progress::start(opts.stats.clone(), a.o.progress);
    let res = match direct {
        Some(s) => {
            if writeln!(ssh_in, "tcp")
                .and_then(|_| ssh_in.flush())
                .is_err()
            {
                errln!("ferry pipe: lost the remote side");
                return ssh_failed(&mut guard);
            }
            drop(ssh_in);
            let _ = s.set_nodelay(true);
            // The remote command's own output comes back through ssh.
            let copier = thread::spawn(move || {
                let mut out = io::stdout();
                let _ = io::copy(&mut ssh_out, &mut out);
                let _ = out.flush();
            });
            let res = match (s.try_clone(), s.try_clone()) {
                (Ok(r), Ok(ctl)) => ferry_stream::send_over(
                    &opts,
                    input,
                    r,
                    s,
                    Some(Box::new(move || {
                        let _ = ctl.shutdown(std::net::Shutdown::Both);
                    })),
                ),
                _ => Err(StreamError::new(ErrorKind::Io, "socket clone failed")),
            };
            if res.is_ok() {
                let _ = copier.join();
            }
            res
        }
        None => {
            if !a.via_ssh {
                errln!(
                    "ferry pipe: direct connection to {host}:{port} failed; sending through ssh"
                );
            }
            if writeln!(ssh_in, "stdin")
                .and_then(|_| ssh_in.flush())
                .is_err()
            {
                errln!("ferry pipe: lost the remote side");
                return ssh_failed(&mut guard);
            }
            ferry_stream::send_over(&opts, input, ssh_out, ssh_in, None)
        }
    };
    p.finish();
    let ssh_status = guard.0.take().and_then(|mut c| {
        if res.is_err() {
            // Give the remote a moment to report, then stop waiting.
            thread::sleep(Duration::from_millis(200));
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
        }
        c.wait().ok().and_then(|s| s.code())
    });
    let c = match &res {
        Ok(s) => s.remote_status.or(ssh_status).unwrap_or(code::OK),
        Err(e) => match e.remote_status {
            Some(s) if s != 0 => s,
            _ => exit_code(e, false),
        },
    };
    report(
        "pipe",
        &res,
        &opts.stats,
        cpu0,
        t0,
        json_to(a.o.json, JsonTo::Stdout),
        c,
    );
    c
}

/// The remote side never started: reap ssh and exit with the documented
/// code. ssh's own status (1 from `false`, 255 from ssh) would read as one
/// of ferry's other codes, or as the remote command's.
fn ssh_failed(guard: &mut KillOnDrop) -> i32 {
    if let Some(mut c) = guard.0.take() {
        let _ = c.wait();
    }
    code::REMOTE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("1T").is_err());
        assert!(parse_size("M").is_err());
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("zfs"), "zfs");
        assert_eq!(shell_quote("pool/ds@snap"), "pool/ds@snap");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
