//! The remote side as a child process, for sync (`ferry serve --stdio`)
//! and `ferry pipe` (`ferry recv`) alike: the command line for the remote
//! shell (`-e`/`--rsh`, default `ssh`) with its quoting, starting it with
//! its stdin and stdout as pipes, and waiting for it at the end.

use std::io::{self, BufRead, BufReader};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The command that runs `words` (the remote ferry and its arguments) on
/// `host`: the `-e`/`--rsh` command split on spaces (as rsync does), the
/// host, then the words as one shell-quoted line (ssh hands it to the
/// remote shell). [`spawn`] sets up the pipes. Where that is OpenSSH with
/// its default ciphers, on a CPU with AES, it prefers AES-GCM: finding out
/// runs `ssh -V` and `ssh -G` (once per command line; see `ssh_cipher`).
pub fn rsh_command<S: AsRef<str>>(
    rsh: &str,
    host: &str,
    words: &[S],
) -> Result<Command, CommandError> {
    let mut rsh = rsh.split_whitespace();
    let prog = rsh.next().ok_or(CommandError::EmptyRsh)?;
    // ssh (and most remote shells) would take it for an option:
    // `-oProxyCommand=...` runs a command here.
    if host.starts_with('-') {
        return Err(CommandError::HostLikeOption(host.to_string()));
    }
    let args: Vec<&str> = rsh.collect();
    let mut c = Command::new(prog);
    // The words after `--` are paths: a leading `~` or `~user` is left
    // for the remote shell to expand, as rsync leaves it.
    let mut paths = false;
    let line: Vec<String> = words
        .iter()
        .map(|w| {
            let w = w.as_ref();
            let q = if paths { quote_path(w) } else { shell_quote(w) };
            paths |= w == "--";
            q
        })
        .collect();
    let line = line.join(" ");
    c.args(&args);
    if let Some(cipher) = crate::ssh_cipher::cipher_args(prog, &args, host, &line) {
        c.args(cipher);
    }
    c.arg(host).arg(line);
    Ok(c)
}

/// Why there is no command line for the remote side.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CommandError {
    #[error("--rsh is empty")]
    EmptyRsh,
    #[error("host {0:?} begins with '-': the remote shell would read it as an option")]
    HostLikeOption(String),
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

/// Quote a path for a POSIX shell, all but a leading `~` or `~user` (a
/// portable user name), which the shell expands to that home directory.
pub fn quote_path(s: &str) -> String {
    let Some(rest) = s.strip_prefix('~') else {
        return shell_quote(s);
    };
    let (user, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if !user
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        || user.starts_with('-')
    {
        return shell_quote(s);
    }
    // The `/` after the prefix must stay unquoted too, or the shell takes
    // the whole word for the prefix and expands nothing.
    match tail.strip_prefix('/') {
        None => format!("~{user}"),
        Some("") => format!("~{user}/"),
        Some(rest) => format!("~{user}/{}", shell_quote(rest)),
    }
}

/// The host name of `[user@]host` (or `[user@][v6addr]`), to connect to.
pub fn host_name(target: &str) -> &str {
    let host = target.rsplit('@').next().unwrap_or(target);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// What becomes of the remote side's stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stderr {
    /// Ours: the user sees it as it comes (`pipe`).
    Inherit,
    /// Kept, its last [`TAIL_LINES`] lines, to say why a session failed
    /// (sync: [`RemoteChild::stderr_tail`]).
    Tail,
}

/// Lines of the remote side's stderr that [`Stderr::Tail`] keeps.
pub const TAIL_LINES: usize = 20;

/// The remote shell could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot run {prog}: {source}")]
pub struct SpawnError {
    /// The program (`ssh`, or the first word of `-e`).
    pub prog: String,
    pub source: io::Error,
}

impl SpawnError {
    /// Whether trying again could help: never, the program is missing or
    /// may not be run.
    pub fn retryable(&self) -> bool {
        false
    }
}

/// A running remote side: killed (and reaped) if still running when
/// dropped.
pub struct RemoteChild {
    child: Child,
    tail: Option<(Lines, JoinHandle<()>)>,
}

/// The last lines of the child's stderr, as the thread reading it keeps them.
type Lines = Arc<Mutex<Vec<String>>>;

/// Start `cmd` (from [`rsh_command`]) with its stdin and stdout as pipes
/// and its stderr as `stderr` says.
pub fn spawn(
    mut cmd: Command,
    stderr: Stderr,
) -> Result<(RemoteChild, ChildStdin, ChildStdout), SpawnError> {
    let prog = cmd.get_program().to_string_lossy().into_owned();
    let err = |source| SpawnError {
        prog: prog.clone(),
        source,
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(match stderr {
            Stderr::Inherit => Stdio::inherit(),
            Stderr::Tail => Stdio::piped(),
        })
        .spawn()
        .map_err(err)?;
    let (stdin, stdout, err_pipe) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    // From here on, a failure kills the child (RemoteChild's drop).
    let mut remote = RemoteChild { child, tail: None };
    let (Some(stdin), Some(stdout)) = (stdin, stdout) else {
        return Err(err(io::Error::other("no pipes")));
    };
    widen_pipe(&stdin);
    widen_pipe(&stdout);
    if let Some(pipe) = err_pipe {
        let lines: Lines = Arc::default();
        let l2 = lines.clone();
        let keep = std::thread::Builder::new()
            .name("ferry-rsh-stderr".into())
            .spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(|l| l.ok()) {
                    if let Ok(mut g) = l2.lock() {
                        if g.len() >= TAIL_LINES {
                            g.remove(0);
                        }
                        g.push(line);
                    }
                }
            })
            .map_err(err)?;
        remote.tail = Some((lines, keep));
    }
    Ok((remote, stdin, stdout))
}

/// Pipe capacity asked for on the remote shell's stdin and stdout (and by
/// the remote side on its own, see [`widen_pipe`]).
pub const PIPE_SIZE: usize = 1 << 20;

/// Ask for a [`PIPE_SIZE`] buffer on `fd` if it is a pipe. The default 64
/// KiB makes a data frame of up to 1 MiB cross in many wake-ups of the
/// shell (a 128 MB tree over loopback ssh: 0.86 s with 256 KiB pipes,
/// 0.81 s with 1 MiB). The kernel's per-user pipe budget (64 MiB by
/// default, root exempt) is why the remote side widens only the pipe its
/// data goes through; a refusal (that budget, not a pipe) changes nothing.
pub fn widen_pipe(fd: impl std::os::fd::AsFd) {
    let _ = rustix::pipe::fcntl_setpipe_size(fd, PIPE_SIZE);
}

impl RemoteChild {
    /// Wait for the remote side to exit, killing it if it is still running
    /// after `grace` (`Duration::MAX`: wait for ever).
    pub fn wait_with_grace(&mut self, grace: Duration) -> io::Result<ExitStatus> {
        if grace != Duration::MAX {
            if let Some(st) = self.wait_for(grace)? {
                return Ok(st);
            }
            let _ = self.child.kill();
        }
        self.child.wait()
    }

    /// Wait up to `d` for the remote side to exit, leaving it running if
    /// it does not: its status, or `None`.
    pub fn wait_for(&mut self, d: Duration) -> io::Result<Option<ExitStatus>> {
        let until = Instant::now().checked_add(d);
        while until.is_some_and(|u| Instant::now() < u) {
            if let Some(st) = self.child.try_wait()? {
                return Ok(Some(st));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.try_wait()
    }

    /// With [`Stderr::Tail`], once the child has exited: the last lines it
    /// wrote to stderr, joined by `; `, without ssh's host key notices.
    pub fn stderr_tail(&mut self) -> String {
        let Some((lines, keep)) = self.tail.take() else {
            return String::new();
        };
        let _ = keep.join();
        lines
            .lock()
            .map(|g| {
                g.iter()
                    .filter(|l| !l.starts_with("Warning: Permanently added"))
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default()
    }
}

impl Drop for RemoteChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/a/b-c.d"), "/a/b-c.d");
        assert_eq!(shell_quote("it's here"), r"'it'\''s here'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("*.tmp"), "'*.tmp'");
        // (Not named ssh: no cipher is added, see ssh_cipher.)
        let c = rsh_command("rsh -p 2222", "u@h", &["ferry", "recv", "--", "a b"]).unwrap();
        assert_eq!(c.get_program(), "rsh");
        let args: Vec<_> = c.get_args().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(args, ["-p", "2222", "u@h", "ferry recv -- 'a b'"]);
        assert_eq!(
            rsh_command("  ", "h", &["x"]).err(),
            Some(CommandError::EmptyRsh)
        );
        let e = rsh_command("ssh", "-oProxyCommand=touch x", &["x"]).unwrap_err();
        assert!(matches!(e, CommandError::HostLikeOption(_)), "{e}");
        assert_eq!(shell_quote("pool/ds@snap"), "pool/ds@snap");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(quote_path("~"), "~");
        assert_eq!(quote_path("~/a b"), "~/'a b'");
        assert_eq!(quote_path("~/"), "~/");
        assert_eq!(quote_path("~/x"), "~/x");
        assert_eq!(quote_path("~bob/x"), "~bob/x");
        assert_eq!(quote_path("~b$(id)/x"), "'~b$(id)/x'");
        assert_eq!(quote_path("~;rm/x"), "'~;rm/x'");
        assert_eq!(quote_path("a/~b"), "'a/~b'");
        assert_eq!(quote_path("x y"), "'x y'");
    }

    #[test]
    fn host_names() {
        assert_eq!(host_name("me@box"), "box");
        assert_eq!(host_name("box"), "box");
        assert_eq!(host_name("me@[::1]"), "::1");
        assert_eq!(host_name("a@b@c"), "c");
    }

    #[test]
    fn a_child_is_waited_for_killed_after_its_grace_and_its_stderr_kept() {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "echo one >&2; echo 'Warning: Permanently added x' >&2; echo two >&2; exit 3",
        ]);
        let (mut child, _i, _o) = spawn(c, Stderr::Tail).unwrap();
        assert_eq!(
            child.wait_with_grace(Duration::MAX).unwrap().code(),
            Some(3)
        );
        assert_eq!(child.stderr_tail(), "one; two");
        let mut c = Command::new("sleep");
        c.arg("30");
        let (mut child, _i, _o) = spawn(c, Stderr::Inherit).unwrap();
        let t = Instant::now();
        let st = child.wait_with_grace(Duration::from_millis(100)).unwrap();
        assert!(st.code().is_none() && t.elapsed() < Duration::from_secs(10));
        let e = spawn(Command::new("/nonexistent/ferry-rsh"), Stderr::Inherit)
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with("cannot run /nonexistent/ferry-rsh: "),
            "{e}"
        );
    }
}
