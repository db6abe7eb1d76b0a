//! The remote side as a child process: starting it through ssh (or the
//! `-e` command), keeping the tail of its stderr, and at the end waiting
//! for it and turning a failed session into an error that names the cause.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};

use ferry_link::{Endpoint, LinkError};

use super::command::rsh_command;
use super::tcp::{direct_connect, DIRECT_FALLBACK};
use super::RemoteOptions;
use crate::error::{Error, Result};
use crate::stats::Stats;

/// A running remote side.
pub(super) struct Remote {
    host: String,
    /// Held open in direct mode, closed when the session ends.
    stdin: Option<std::process::ChildStdin>,
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
    stderr_thread: Option<std::thread::JoinHandle<()>>,
}

/// Start `ferry ARGS` on `host` and connect to it: over ssh's pipes, or
/// with `--direct` over the channel it offers.
pub(super) fn spawn(
    host: &str,
    ropts: &RemoteOptions,
    args: &[String],
    stats: &Stats,
) -> Result<(Remote, Endpoint)> {
    let words: Vec<&str> = std::iter::once(ropts.remote_ferry.as_str())
        .chain(args.iter().map(String::as_str))
        .collect();
    let mut cmd = rsh_command(&ropts.rsh, host, &words)
        .ok_or_else(|| Error::Usage("empty --rsh command".into()))?;
    let prog = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
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
        return go_direct(remote, host, stdin, stdout, stats);
    }
    let ep = ferry_link::stream_link(stdout, stdin);
    Ok((remote, ep))
}

/// `--direct`: connect to the channel the server offers over ssh; when it
/// is up but unreachable, tell it so and go on over ssh.
fn go_direct(
    remote: Remote,
    host: &str,
    stdin: std::process::ChildStdin,
    stdout: std::process::ChildStdout,
    stats: &Stats,
) -> Result<(Remote, Endpoint)> {
    // ssh stays up (its stdin open) while the data goes direct.
    let mut remote = remote;
    remote.stdin = Some(stdin);
    match direct_connect(host, stdout) {
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
                    let ep = ferry_link::stream_link(reader, w);
                    Ok((remote, ep))
                }
                None => Err(Error::Link(LinkError::Closed)),
            }
        }
        Err((e, None)) => Err(remote
            .finish::<()>(Err(e))
            .err()
            .unwrap_or(Error::Link(LinkError::Closed))),
    }
}

impl Remote {
    /// Wait for the remote side and turn a failed session into the error
    /// that names the cause: ssh, a missing remote ferry, a peer that is not
    /// ferry, or the remote's own error.
    pub(super) fn finish<T>(mut self, res: Result<T>) -> Result<T> {
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
