//! `ferry recv --listen ADDR:PORT [FILE | -- COMMAND] | consumer`: where
//! the stream goes (stdout, FILE, COMMAND), over TCP or, for `pipe
//! --via-ssh`, over our own stdin and stdout.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferry_channel::Psk;
use ferry_link::direct::{self, Answer, Dialect};
use ferry_stream::{ErrorKind, FileOut, Options, RecvHooks, StreamError, Summary};

use super::args::{options, read_key, RecvArgs};
use super::report::{exit_code, json_to, report, JsonTo};
use super::{resolve, stdin_file, stdout_file, usage};
use crate::exit as code;
use crate::progress::{Progress, StreamMeter};

/// Where `recv` writes the stream.
enum Sink {
    Stdout,
    File(PathBuf),
    Command(Vec<String>),
}

pub fn run_recv(a: RecvArgs) -> i32 {
    let key = match recv_key(&a) {
        Ok(k) => k,
        Err(e) => return usage(&e),
    };
    let opts = match options(&a.o, key) {
        Ok(o) => o,
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

    // Transport: a daemon asked for a file (--from), a TCP connection to
    // our listener, or (pipe --via-ssh) our stdin/stdout.
    let listener;
    let via = match (&a.from, &a.listen) {
        (Some(url), _) => match from_daemon(url, &opts.key, opts.streams) {
            Ok(s) => Via::Daemon(s),
            Err(e) => {
                errln!("ferry recv: {e}");
                return crate::sync_cmd::class_code(e.class());
            }
        },
        (None, Some(listen)) => {
            let listen = match resolve(listen) {
                Ok(l) => l,
                Err(e) => return usage(&e),
            };
            listener = match ferry_stream::bind(listen) {
                Ok(l) => l,
                Err(e) => {
                    let c = exit_code(&e, true);
                    report("recv", &Err(e), &opts.stats, cpu0, t0, jt, c);
                    return c;
                }
            };
            match a.announce.then(|| announce(&listener)) {
                Some(Err(c)) => return c,
                Some(Ok(true)) => Via::Stdin,
                _ => Via::Listen(&listener),
            }
        }
        (None, None) => {
            return usage("recv needs --listen ADDR:PORT or --from ferry://HOST:PORT/PATH")
        }
    };

    let p = Progress::start(StreamMeter::new(opts.stats.clone()), a.o.progress, false);
    let res = receive(&opts, via, sink, !a.no_resume);
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

/// The key: from `--key-file` or `$FERRY_KEY`, or with `--key-stdin` as
/// the first line of stdin.
fn recv_key(a: &RecvArgs) -> Result<Psk, String> {
    if a.key_stdin {
        match stdin_file().and_then(|f| direct::read_line(f, 4096)) {
            Ok(k) => Psk::new(k.unwrap_or_default().as_bytes()).map_err(|e| e.to_string()),
            Err(e) => Err(format!("reading the key from stdin: {e}")),
        }
    } else {
        read_key(&a.o)
    }
}

/// `--announce`: offer our port to `ferry pipe` (the bootstrap of
/// `ferry_link::direct`, pipe dialect), and read back the transport it
/// chose. `Ok(true)`: the stream comes on stdin.
fn announce(listener: &std::net::TcpListener) -> Result<bool, i32> {
    let port = listener.local_addr().map(|l| l.port()).unwrap_or(0);
    if direct::offer(Dialect::Pipe, &mut io::stdout(), port, None).is_err() {
        return Err(code::IO);
    }
    match stdin_file().and_then(|f| direct::read_answer(Dialect::Pipe, f)) {
        Ok(Ok(Answer::ViaSsh)) => Ok(true),
        Ok(Ok(Answer::Direct)) => Ok(false),
        Ok(Err(m)) => Err(usage(&format!(
            "unexpected transport {m:?} from ferry pipe"
        ))),
        Err(e) => Err(usage(&format!("reading the transport from stdin: {e}"))),
    }
}

/// Where the stream comes from.
enum Via<'a> {
    /// A sender that dials this listener.
    Listen(&'a std::net::TcpListener),
    /// Our stdin and stdout (`pipe --via-ssh`).
    Stdin,
    /// A daemon that accepted to send a file (`--from`): the session's
    /// connections.
    Daemon(ferry_link::stripe::Conn),
}

/// Ask the daemon at `url` (`ferry://HOST:PORT/PATH`) to send the file
/// PATH as a stream; the session's connections once it has accepted.
fn from_daemon(
    url: &str,
    key: &Psk,
    streams: ferry_link::stripe::Streams,
) -> Result<ferry_link::stripe::Conn, ferry_core::Error> {
    let u = match ferry_core::remote::daemon::parse_url(url) {
        Some(Ok(u)) => u,
        Some(Err(e)) => return Err(ferry_core::Error::Usage(e)),
        None => {
            return Err(ferry_core::Error::Usage(format!(
                "--from {url:?}: not a ferry:// URL"
            )))
        }
    };
    let args: Vec<String> = ["send", "--", &u.path]
        .iter()
        .map(|s| s.to_string())
        .collect();
    ferry_core::remote::daemon::daemon_stream(&u.host, u.port, key, &args, streams)
}

/// Receive one stream into `sink`.
fn receive(opts: &Options, via: Via<'_>, sink: Sink, resume: bool) -> Result<Summary, StreamError> {
    // Our stdout or FILE: a file descriptor either way, written through
    // FileOut (O_DIRECT when it is a regular file).
    // FILE is created (truncated) and COMMAND started only once a sender
    // has proved the key.
    match sink {
        Sink::Stdout => stdout_file()
            .map_err(|e| StreamError::new(ErrorKind::Io, format!("stdout: {e}")))
            .and_then(|f| recv_with(opts, via, ferry_stream::opened(FileOut::new(f)))),
        Sink::File(path) => {
            let open: ferry_stream::Opener<ResumableFile> =
                Box::new(move || ResumableFile::open(&path, resume));
            recv_with(opts, via, open)
        }
        Sink::Command(cmd) => recv_to_command(opts, via, cmd),
    }
}

fn recv_with<W: Write + Send + 'static>(
    opts: &Options,
    via: Via<'_>,
    open: ferry_stream::Opener<W>,
) -> Result<Summary, StreamError> {
    let io = |what: &str, e: io::Error| StreamError::new(ErrorKind::Io, format!("{what}: {e}"));
    let l = match via {
        Via::Listen(l) => l,
        Via::Stdin => {
            let r = stdin_file().map_err(|e| io("stdin", e))?;
            let w = stdout_file().map_err(|e| io("stdout", e))?;
            return ferry_stream::recv_over(opts, r, w, open, None);
        }
        Via::Daemon(conn) => return ferry_stream::recv_conn(opts, &conn, open),
    };
    {
        // A connection that fails the handshake is told on stderr and
        // dropped; recv goes on waiting.
        let refused = |peer: std::net::SocketAddr, e: &StreamError| {
            errln!("ferry recv: refused a connection from {peer}: {e}");
        };
        ferry_stream::recv_on(opts, l, open, &refused)
    }
}

fn recv_to_command(opts: &Options, via: Via<'_>, cmd: Vec<String>) -> Result<Summary, StreamError> {
    let via_stdin = matches!(via, Via::Stdin);
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
            offer: None,
        };
        Ok((stdin, hooks))
    });
    let res = recv_with(opts, via, open);
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

/// FILE: opened without truncating it, so that what an interrupted run
/// wrote can be offered to the sender (see `ferry_stream::Offer`). Written
/// through [`FileOut`] once the sender has said where the stream starts:
/// the file is cut there first (at 0 when the sender starts over).
pub(crate) struct ResumableFile {
    file: Option<File>,
    out: Option<FileOut>,
    start: Arc<Mutex<u64>>,
}

impl ResumableFile {
    fn open(path: &std::path::Path, resume: bool) -> Result<(Self, RecvHooks), StreamError> {
        let io_err = |what: &str, e: io::Error| {
            StreamError::new(ErrorKind::Io, format!("{what} {}: {e}", path.display()))
        };
        let rw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path);
        let f = match rw {
            Ok(f) => f,
            // Writable but not readable (mode 0200, /dev/full): nothing
            // to offer, written as before.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                File::create(path).map_err(|e| io_err("cannot create", e))?
            }
            Err(e) => return Err(io_err("cannot create", e)),
        };
        Self::from_file(f, resume, &path.display().to_string())
    }

    /// An open file (read and write) as the output; `shown` names it in
    /// messages.
    pub(crate) fn from_file(
        f: File,
        resume: bool,
        shown: &str,
    ) -> Result<(Self, RecvHooks), StreamError> {
        let io_err = |what: &str, e: io::Error| {
            StreamError::new(ErrorKind::Io, format!("{what} {shown}: {e}"))
        };
        let m = f.metadata().map_err(|e| io_err("cannot stat", e))?;
        let start = Arc::new(Mutex::new(0));
        let mut hooks = RecvHooks::default();
        if resume && m.is_file() && m.len() > 0 {
            let hasher =
                ferry_stream::hash_prefix(&f, m.len()).map_err(|e| io_err("cannot read", e))?;
            let at = start.clone();
            hooks.offer = Some(ferry_stream::Offer {
                have: m.len(),
                hasher,
                on_start: Box::new(move |offset| {
                    if let Ok(mut s) = at.lock() {
                        *s = offset;
                    }
                    Ok(())
                }),
            });
        }
        let w = ResumableFile {
            file: Some(f),
            out: None,
            start,
        };
        Ok((w, hooks))
    }

    /// The output, cut and positioned where the stream starts.
    fn out(&mut self) -> io::Result<&mut FileOut> {
        if let Some(mut f) = self.file.take() {
            use std::io::Seek;
            // A FIFO, a terminal or a device is written as it is.
            if f.metadata()?.is_file() {
                let at = self.start.lock().map(|s| *s).unwrap_or(0);
                f.set_len(at)?;
                f.seek(io::SeekFrom::Start(at))?;
            }
            self.out = Some(FileOut::new(f));
        }
        self.out
            .as_mut()
            .ok_or_else(|| io::Error::other("output already failed"))
    }
}

impl Write for ResumableFile {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.out()?.write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out()?.flush()
    }
}

fn wait_status(child: &Mutex<Child>) -> Option<i32> {
    let mut ch = child.lock().ok()?;
    let st = ch.wait().ok()?;
    use std::os::unix::process::ExitStatusExt;
    Some(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)))
}
