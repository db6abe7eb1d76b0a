//! Errors of the engine, each with the exit status class it maps to.

use std::io;
use std::path::{Path, PathBuf};

use ferry_link::{FatalClass, LinkError, Message};

/// What a failure means for the run as a whole; the CLI maps each class to
/// a documented exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Bad arguments: nothing was done.
    Usage,
    /// Some entries failed, the rest were transferred.
    Partial,
    /// A fatal local I/O error (missing source, unwritable destination,
    /// disk full).
    Io,
    /// The peer spoke garbage, or an incompatible protocol.
    Protocol,
    /// The link to the peer failed (could not connect, dropped).
    Connection,
    /// The peer does not hold the key.
    Auth,
    /// Stopped by a signal.
    Interrupted,
}

/// An engine error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}", line(.path, .source))]
    Io { path: PathBuf, source: io::Error },
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Link(#[from] LinkError),
    /// The peer ended the session with `Fatal`, saying what kind of
    /// failure it was.
    #[error("peer reported: {msg}")]
    Peer { class: FatalClass, msg: String },
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("{failed} of {total} entries failed")]
    Partial { failed: u64, total: u64 },
    #[error("interrupted")]
    Interrupted,
    /// The remote side could not be started at all (no ferry there): the
    /// link's class, but another connection would not help.
    #[error("{0}")]
    NoRemote(String),
    /// The peer does not hold our key (a daemon's channel handshake
    /// failed): another try with the same key fails the same way.
    #[error("{0}")]
    Auth(String),
    /// A daemon answered that it is busy (as many sessions as it allows,
    /// or the root held by another session): later it may not be.
    #[error("{0}")]
    Busy(String),
    /// The remote shell found no ferry to run (it exited 127) or could not
    /// run the one it found (126): another connection would not help;
    /// `--deploy` would.
    #[error("{}", no_ferry_line(.host, .ferry, *.found, *.deployed, .said))]
    NoFerry {
        host: String,
        /// What was run (`--remote-ferry`, or the deployed path).
        ferry: String,
        /// 126: it is there but could not be executed.
        found: bool,
        /// It was the copy `--deploy` put there.
        deployed: bool,
        /// The remote side's last words on stderr.
        said: String,
    },
    /// ssh itself failed (it exited 255: the host unreachable, the login
    /// refused, the connection cut), with its last words: the link's
    /// class, and a new connection may help.
    #[error("ssh to {host} failed: {said}")]
    Ssh { host: String, said: String },
    /// The peer's Hello names another protocol version.
    #[error(
        "protocol error: peer speaks protocol version {peer}, this ferry speaks {}",
        ferry_link::PROTOCOL_VERSION
    )]
    PeerVersion { peer: u32 },
    /// The ferry started on `host` over ssh speaks another version (a
    /// [`Error::PeerVersion`] or a framing [`LinkError::Version`]).
    #[error("{}", remote_version_line(.host, .source, *.deployed))]
    RemoteVersion {
        host: String,
        #[source]
        source: Box<Error>,
        deployed: bool,
    },
    /// `--deploy` cannot serve this host with this binary (another OS or
    /// architecture, not an executable for it, a `ferry://` daemon):
    /// nothing was uploaded.
    #[error("{0}")]
    DeployRefused(String),
}

/// The line of an [`Error::NoFerry`].
fn no_ferry_line(host: &str, ferry: &str, found: bool, deployed: bool, said: &str) -> String {
    let said = if said.is_empty() {
        String::new()
    } else {
        format!(" ({said})")
    };
    match (found, deployed) {
        (false, false) => {
            let at = if ferry == "ferry" {
                "(not on its PATH)".to_string()
            } else {
                format!("at {ferry}")
            };
            format!(
                "ferry is not installed on {host} {at}: run with --deploy to copy this ferry there, or give its path with --remote-ferry{said}"
            )
        }
        (true, false) => format!(
            "the ferry on {host} ({ferry}) could not be run: run with --deploy to copy this ferry there{said}"
        ),
        (_, true) => format!(
            "the ferry deployed to {host}:{ferry} could not be run (a cache directory mounted noexec? set XDG_CACHE_HOME there to another place){said}"
        ),
    }
}

/// The line of an [`Error::RemoteVersion`].
fn remote_version_line(host: &str, source: &Error, deployed: bool) -> String {
    if deployed {
        format!("the ferry deployed to {host} is another version ({source}): --deploy=PATH must name a build of this same ferry")
    } else {
        format!("the ferry on {host} is another version ({source}): run with --deploy to use this ferry there, or install the same version on both hosts")
    }
}

impl Error {
    /// An I/O error at `path` while doing `op`.
    pub fn io_op(op: &'static str, path: impl AsRef<Path>, source: io::Error) -> Self {
        Self::io(path, with_op(op, source))
    }

    pub fn io(path: impl AsRef<Path>, source: io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    /// Whether running the session again (a new connection, the same
    /// data) could succeed: the link dropped or timed out, here or at the
    /// peer. Bad input, a protocol break, a local I/O error (a full disk, a
    /// missing source) and an interrupt are not retried.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Link(e) => e.retryable(),
            Error::Busy(_) | Error::Ssh { .. } => true,
            Error::Peer { class, .. } => *class == FatalClass::Connection,
            Error::Io { .. }
            | Error::Usage(_)
            | Error::Protocol(_)
            | Error::Partial { .. }
            | Error::NoRemote(_)
            | Error::NoFerry { .. }
            | Error::PeerVersion { .. }
            | Error::RemoteVersion { .. }
            | Error::DeployRefused(_)
            | Error::Auth(_)
            | Error::Interrupted => false,
        }
    }

    /// The exit class of this error.
    pub fn class(&self) -> Class {
        match self {
            Error::Io { .. } => Class::Io,
            Error::Usage(_) => Class::Usage,
            Error::Link(
                LinkError::Decode(_)
                | LinkError::BadMagic(_)
                | LinkError::Version(_)
                | LinkError::FrameTooLarge(_)
                | LinkError::Corrupt(_)
                | LinkError::Checksum,
            ) => Class::Protocol,
            Error::Link(_)
            | Error::NoRemote(_)
            | Error::NoFerry { .. }
            | Error::Busy(_)
            | Error::Ssh { .. } => Class::Connection,
            Error::PeerVersion { .. } | Error::RemoteVersion { .. } => Class::Protocol,
            Error::DeployRefused(_) => Class::Usage,
            Error::Peer { class, .. } => match class {
                FatalClass::Io => Class::Io,
                FatalClass::Protocol => Class::Protocol,
                FatalClass::Usage => Class::Usage,
                // The peer's own link failed, or it was stopped: for this
                // side, the session was cut.
                FatalClass::Connection | FatalClass::Interrupted => Class::Connection,
            },
            Error::Protocol(_) => Class::Protocol,
            Error::Partial { .. } => Class::Partial,
            Error::Interrupted => Class::Interrupted,
            Error::Auth(_) => Class::Auth,
        }
    }
}

/// The `Fatal` message that tells the peer about `e`.
pub fn fatal(e: &Error) -> Message {
    let class = match e.class() {
        Class::Usage => FatalClass::Usage,
        Class::Partial | Class::Io => FatalClass::Io,
        Class::Protocol => FatalClass::Protocol,
        Class::Connection | Class::Auth => FatalClass::Connection,
        Class::Interrupted => FatalClass::Interrupted,
    };
    Message::Fatal {
        class,
        error: e.to_string(),
    }
}

/// What a peer's `Fatal` means here.
pub fn from_fatal(class: FatalClass, msg: String) -> Error {
    // The peer's words, on one line and harmless to a terminal.
    let msg = crate::itemize::escaped(msg.as_bytes());
    Error::Peer { class, msg }
}

/// An I/O error with the operation that failed (`create`, `rename`, ...),
/// so that an error line can say what ferry was doing, not only why it
/// failed. Keeps the inner error's kind.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {}", describe(.source))]
pub struct OpError {
    pub op: &'static str,
    #[source]
    pub source: io::Error,
}

/// Name the operation of an I/O result's error (the innermost name wins).
pub trait IoOp<T> {
    fn op(self, op: &'static str) -> io::Result<T>;
}

impl<T> IoOp<T> for io::Result<T> {
    fn op(self, op: &'static str) -> io::Result<T> {
        self.map_err(|e| with_op(op, e))
    }
}

/// `e` with `op` named, unless it names one already.
pub fn with_op(op: &'static str, e: io::Error) -> io::Error {
    if op_of(&e).is_some() {
        return e;
    }
    io::Error::new(e.kind(), OpError { op, source: e })
}

/// The operation an I/O error names, if any.
pub fn op_of(e: &io::Error) -> Option<&'static str> {
    e.get_ref()
        .and_then(|i| i.downcast_ref::<OpError>())
        .map(|o| o.op)
}

/// One error line: `rename /dst/f: permission denied`, or `/dst/f: ...`
/// when the operation is not known.
pub fn line(path: &Path, e: &io::Error) -> String {
    match op_of(e) {
        Some(op) => format!("{op} {}: {}", path.display(), describe(e)),
        None => format!("{}: {}", path.display(), describe(e)),
    }
}

/// `io::Error`'s text without the "(os error N)" noise for common cases;
/// the reason only (an [`OpError`]'s operation is left to [`line`]).
pub fn describe(e: &io::Error) -> String {
    if let Some(o) = e.get_ref().and_then(|i| i.downcast_ref::<OpError>()) {
        return describe(&o.source);
    }
    // An error made with its own words ("vanished or replaced since it was
    // listed") says them, whatever its kind.
    let own = e.raw_os_error().is_none() && e.get_ref().is_some();
    match e.kind() {
        _ if own => without_errno(e.to_string()),
        io::ErrorKind::NotFound => "no such file or directory".into(),
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        io::ErrorKind::StorageFull => "no space left on device".into(),
        io::ErrorKind::AlreadyExists => "already exists".into(),
        _ => without_errno(e.to_string()),
    }
}

/// An OS error's text without its " (os error N)".
fn without_errno(s: String) -> String {
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// True for errors after which no further file can succeed either.
pub fn is_fatal_io(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull
            | io::ErrorKind::QuotaExceeded
            | io::ErrorKind::ReadOnlyFilesystem
    )
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_cut_link_is_worth_a_retry() {
        let link = |e| Error::Link(e);
        assert!(link(LinkError::Closed).retryable());
        assert!(link(LinkError::TimedOut(30)).retryable());
        assert!(link(LinkError::Io("reset".into())).retryable());
        assert!(link(LinkError::Checksum).retryable());
        assert!(!link(LinkError::Version(3)).retryable());
        assert!(!link(LinkError::BadMagic("SSH-2.0".into())).retryable());
        assert!(!link(LinkError::Corrupt("zstd".into())).retryable());
        let peer = |class| Error::Peer {
            class,
            msg: "x".into(),
        };
        assert!(peer(FatalClass::Connection).retryable());
        for c in [
            FatalClass::Io,
            FatalClass::Protocol,
            FatalClass::Usage,
            FatalClass::Interrupted,
        ] {
            assert!(!peer(c).retryable(), "{c:?}");
        }
        let full = io::Error::from_raw_os_error(28);
        assert!(
            !Error::io("/dst/f", full).retryable(),
            "a full disk stays full"
        );
        assert!(!Error::Protocol("bad list".into()).retryable());
        assert!(!Error::Usage("bad flag".into()).retryable());
        assert!(!Error::Interrupted.retryable());
    }

    #[test]
    fn a_missing_or_other_ferry_suggests_deploy_unless_deployed() {
        let nf = |ferry: &str, found, deployed, said: &str| Error::NoFerry {
            host: "me@box".into(),
            ferry: ferry.into(),
            found,
            deployed,
            said: said.into(),
        };
        let e = nf("ferry", false, false, "sh: 1: ferry: not found");
        assert_eq!(
            e.to_string(),
            "ferry is not installed on me@box (not on its PATH): run with --deploy to copy this \
             ferry there, or give its path with --remote-ferry (sh: 1: ferry: not found)"
        );
        assert_eq!(e.class(), Class::Connection);
        assert!(!e.retryable());
        assert!(nf("/opt/f", false, false, "")
            .to_string()
            .contains("me@box at /opt/f: run with --deploy"));
        assert!(nf("/opt/f", true, false, "")
            .to_string()
            .contains("could not be run: run with --deploy"));
        let deployed = nf("/h/.cache/ferry/ferry-ab", true, true, "Permission denied").to_string();
        assert!(
            deployed.contains("noexec") && !deployed.contains("run with --deploy"),
            "{deployed}"
        );
        let v = |deployed| Error::RemoteVersion {
            host: "box".into(),
            source: Box::new(Error::PeerVersion { peer: 99 }),
            deployed,
        };
        assert_eq!(v(false).class(), Class::Protocol);
        assert!(!v(false).retryable());
        let line = v(false).to_string();
        assert!(
            line.contains("protocol version 99") && line.contains("run with --deploy"),
            "{line}"
        );
        assert!(v(true)
            .to_string()
            .contains("--deploy=PATH must name a build"));
        assert_eq!(Error::DeployRefused("x".into()).class(), Class::Usage);
    }

    #[test]
    fn a_fatal_says_the_class_of_its_error() {
        let m = fatal(&Error::Protocol("bad list".into()));
        assert!(matches!(
            m,
            Message::Fatal {
                class: FatalClass::Protocol,
                ..
            }
        ));
        let m = fatal(&Error::io("/d", io::Error::from_raw_os_error(28)));
        assert!(matches!(
            m,
            Message::Fatal {
                class: FatalClass::Io,
                ..
            }
        ));
        let e = from_fatal(FatalClass::Protocol, "refused".into());
        assert_eq!(e.class(), Class::Protocol);
        assert_eq!(
            from_fatal(FatalClass::Interrupted, "^C".into()).class(),
            Class::Connection
        );
    }
}
