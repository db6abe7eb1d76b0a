//! The remote side as a child process: starting it through ssh (or the
//! `-e` command) with [`ferry_link::rsh`], which keeps the tail of its
//! stderr, and at the end waiting for it and turning a failed session into
//! an error that names the cause.

use std::process::ChildStdin;
use std::time::Duration;

use ferry_link::rsh::{self, RemoteChild, Stderr};
use ferry_link::{Endpoint, LinkError};

use super::tcp::direct_connect;
use super::RemoteOptions;
use crate::error::{Error, Result};
use crate::stats::Stats;

/// A running remote side.
pub(super) struct Remote {
    host: String,
    /// The remote ferry that was run, and whether `--deploy` put it there.
    ferry: String,
    deployed: bool,
    /// Held open in direct mode, closed when the session ends.
    stdin: Option<ChildStdin>,
    child: RemoteChild,
}

/// Start `ferry ARGS` on `host` and connect to it: over ssh's pipes, or
/// with `--direct` over the channel it offers (or over ssh's pipes after
/// all, when that cannot be reached).
pub(super) fn spawn(
    host: &str,
    ropts: &RemoteOptions,
    args: &[String],
    stats: &Stats,
) -> Result<(Remote, Endpoint)> {
    let words: Vec<&str> = std::iter::once(ropts.remote_ferry.as_str())
        .chain(args.iter().map(String::as_str))
        .collect();
    let cmd =
        rsh::rsh_command(&ropts.rsh, host, &words).map_err(|e| Error::Usage(e.to_string()))?;
    let (child, mut stdin, mut stdout) = rsh::spawn(cmd, Stderr::Tail).map_err(|e| {
        Error::Link(LinkError::Io(format!(
            "cannot run {}: {}",
            e.prog,
            crate::error::describe(&e.source)
        )))
    })?;
    let mut remote = Remote {
        host: host.to_string(),
        ferry: ropts.remote_ferry.clone(),
        deployed: ropts.deployed,
        child,
        stdin: None,
    };
    if ropts.direct {
        match direct_connect(host, ropts.streams, &mut stdin, &mut stdout, stats) {
            // ssh stays up (its stdin open) while the data goes direct.
            Ok(Some(ep)) => {
                remote.stdin = Some(stdin);
                return Ok((remote, ep));
            }
            Ok(None) => {}
            Err(e) => {
                remote.stdin = Some(stdin);
                return Err(remote
                    .finish::<()>(Err(e))
                    .err()
                    .unwrap_or(Error::Link(LinkError::Closed)));
            }
        }
    }
    Ok((remote, ferry_link::stream_link(stdout, stdin)))
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
            Err(Error::Link(LinkError::TimedOut(_))) => Duration::ZERO,
            Err(_) => Duration::from_secs(10),
            Ok(_) => Duration::MAX,
        };
        let status = self.child.wait_with_grace(grace);
        let tail = self.child.stderr_tail();
        let code = status.ok().and_then(|s| s.code());
        match res {
            Ok(v) => Ok(v),
            // Another version of ferry: what --deploy is for.
            Err(e @ (Error::PeerVersion { .. } | Error::Link(LinkError::Version(_)))) => {
                Err(Error::RemoteVersion {
                    host: self.host,
                    source: Box::new(e),
                    deployed: self.deployed,
                })
            }
            Err(Error::Link(LinkError::BadMagic(text))) => Err(Error::Protocol(format!(
                "{} did not answer as ferry (it said {text:?}); is the remote shell printing a banner?",
                self.host
            ))),
            Err(Error::Link(LinkError::Closed)) | Err(Error::Link(LinkError::Io(_))) => {
                let why = match code {
                    Some(255) => {
                        return Err(Error::Ssh {
                            said: or_unknown(&tail).to_string(),
                            host: self.host,
                        })
                    }
                    // The shell's "not found" (127) and "cannot execute"
                    // (126).
                    Some(c @ (126 | 127)) => {
                        return Err(Error::NoFerry {
                            host: self.host,
                            ferry: self.ferry,
                            found: c == 126,
                            deployed: self.deployed,
                            said: tail,
                        })
                    }
                    // Its usage error (an older ferry that lacks an
                    // option): a new connection would get the same.
                    Some(1) => {
                        let hint = if self.deployed {
                            ""
                        } else {
                            " (an older ferry? --deploy runs this one there)"
                        };
                        return Err(Error::NoRemote(format!(
                            "the ferry on {} refused the session{hint}: {}",
                            self.host,
                            or_unknown(&tail)
                        )));
                    }
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

fn or_unknown(s: &str) -> &str {
    if s.is_empty() {
        "no message"
    } else {
        s
    }
}
