//! Sessions across hosts over ssh.
//!
//! A remote path is `[user@]host:path` (a `:` before any `/`, as in rsync).
//! ferry runs `ferry serve --stdio --send|--receive [OPTIONS] -- PATHS` on
//! the other host through ssh (or the `-e` command) and plays the other role
//! here, over ssh's stdin and stdout: the same sender and receiver as a
//! local run, over [`ferry_link::stream_link`] instead of the in-process
//! link. Options travel on the serve command line; [`serve_args`] writes
//! them and the CLI's `serve` parses them.
//!
//! The parts: `command` writes the remote command line, `ssh` runs it
//! (through [`ferry_link::rsh`]) and reports how it failed, `tcp` carries
//! the data over a direct connection instead (`--direct`: the bootstrap is
//! [`ferry_link::direct`]'s, in its sync dialect), and `session` drives a
//! push, a pull or the remote side's `serve --stdio`. `deploy` puts this
//! ferry on a host that has none (`--deploy`) before a session starts.

mod command;
pub mod daemon;
pub mod deploy;
mod session;
mod ssh;
mod tcp;

pub use command::serve_args;
pub use session::{serve_stdio, sync_pull, sync_push};

/// `[user@]host:path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemotePath {
    pub host: String,
    pub path: String,
    /// A daemon's port (`ferry://host:port/path`); `None`: reached
    /// through ssh.
    pub port: Option<u16>,
}

impl From<daemon::DaemonUrl> for RemotePath {
    fn from(u: daemon::DaemonUrl) -> Self {
        RemotePath {
            host: u.host,
            path: u.path,
            port: Some(u.port),
        }
    }
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
        port: None,
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
    /// How many TCP connections the `--direct` session stripes over
    /// (`--streams`).
    pub streams: ferry_link::stripe::Streams,
    /// The key of a daemon reached at `ferry://` (`--key-file`).
    pub key: Option<ferry_channel::Psk>,
    /// `remote_ferry` is the copy [`deploy::deploy`] put there (`--deploy`):
    /// errors then say so instead of suggesting `--deploy`.
    pub deployed: bool,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            rsh: "ssh".into(),
            remote_ferry: "ferry".into(),
            direct: false,
            streams: ferry_link::stripe::Streams::Auto,
            key: None,
            deployed: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_paths() {
        assert_eq!(
            parse_remote("me@box:/data/x"),
            Some(RemotePath {
                host: "me@box".into(),
                path: "/data/x".into(),
                port: None,
            })
        );
        assert_eq!(parse_remote("box:").unwrap().path, ".");
        assert_eq!(parse_remote("./a:b"), None);
        assert_eq!(parse_remote("/abs/path"), None);
        assert_eq!(parse_remote(":x"), None);
        assert_eq!(parse_remote("nbd+unix:///?socket=/s"), None);
        assert_eq!(parse_remote("nbd://h/x"), None);
    }
}
