//! `ferry serve --listen`: a daemon that clients reach at
//! `ferry://host:port/path`, without ssh.
//!
//! Every connection runs the channel handshake with the daemon's
//! pre-shared key first (`ferry-channel`'s Noise pattern, bounded by
//! [`ferry_link::direct::HANDSHAKE_TIMEOUT`]); nothing is read from the
//! client before it has proved the key, and nothing touches the disk
//! before the request has been checked. Inside the channel the client
//! sends its request (a `serve` command line, [`ferry_link::daemon`]'s
//! preamble), the daemon answers, and both speak the sync protocol as
//! over ssh.
//!
//! The parts: [`policy`] decides which client arguments a daemon takes
//! (plain functions), [`confine`] turns a client's path into one beneath
//! the root, [`server`] runs the listener and the sessions, [`client`]
//! connects to a daemon.

mod client;
pub mod confine;
pub mod policy;
mod server;

use std::path::PathBuf;
use std::time::Duration;

pub use client::{daemon_connect, daemon_stream, parse_url, DaemonUrl};
pub use server::{serve_daemon, Hooks, Log, SessionEnd, StreamDone, StreamRecv, StreamSend, Watch};

use crate::SyncOptions;

/// What the daemon serves, as its operator configured it.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    pub target: Target,
    /// Clients may pull (the daemon sends).
    pub allow_send: bool,
    /// Clients may push (the daemon receives).
    pub allow_receive: bool,
    /// Sessions at once; more are answered "busy".
    pub max_sessions: usize,
    /// Exit after the first authenticated session.
    pub once: bool,
    /// A session's link silent this long is dead (the client's own
    /// `--timeout` may only shorten it).
    pub timeout: Option<Duration>,
    /// Where a device's journal lives (`--partial-dir`).
    pub partial_dir: Option<PathBuf>,
}

/// The one thing a daemon serves.
#[derive(Clone, Debug)]
pub enum Target {
    /// Sync to and from paths beneath this directory.
    Root(PathBuf),
    /// This block device or image is the one endpoint.
    Device(PathBuf),
}

/// A client's request, parsed by the CLI's `serve` argument parser.
#[derive(Clone, Debug)]
pub struct Request {
    /// The daemon sends (the client pulls).
    pub send: bool,
    pub file_or_dir: bool,
    pub paths: Vec<String>,
    pub opts: SyncOptions,
    /// A stream pushed into the one file `paths[0]` names (`ferry send
    /// FILE ferry://...`), not a sync; `opts.partial` says whether what
    /// the file holds may be offered for a resume.
    pub stream: bool,
}

/// Turns a request's arguments (already allowed by [`policy::check`])
/// into a [`Request`]; a usage error says why not.
pub type ParseRequest = dyn Fn(&[String]) -> Result<Request, String> + Send + Sync;
