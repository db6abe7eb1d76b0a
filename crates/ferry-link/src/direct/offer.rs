//! The lines over ssh that set up a direct connection: the server's offer
//! (its port, and for sync the key) on its stdout, and the client's answer
//! (the way the data goes) on its stdin. Each line is read byte by byte,
//! so nothing after it is taken from the protocol that may follow on the
//! same pipe.
//!
//! | | sync (`serve --stdio --direct`) | pipe (`recv --key-stdin --announce`) |
//! |---|---|---|
//! | client, first | — | the key it made (hex) |
//! | server's offer | `FERRY-DIRECT <port> <key>` | `FERRY-PORT <port>` |
//! | client, connected | — | `tcp` |
//! | client, cannot connect | `FERRY-VIA-SSH` | `stdin` |
//!
//! After an answer that chose ssh, the session runs on ssh's pipes.

use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::os::fd::AsFd;
use std::time::Duration;

use ferry_channel::IdleRead;

use super::{connect_offer, ConnectError};

/// Which ferry command's bootstrap: the lines are fixed by the ferrys
/// already installed on other hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// sync's `--direct`: the server makes the key and offers it; the
    /// client answers only when it cannot connect.
    Sync,
    /// `ferry pipe`: the client makes the key and sends it first; it
    /// always answers.
    Pipe,
}

const SYNC_OFFER: &str = "FERRY-DIRECT";
const SYNC_VIA_SSH: &str = "FERRY-VIA-SSH";
const PIPE_OFFER: &str = "FERRY-PORT";
const PIPE_DIRECT: &str = "tcp";
const PIPE_VIA_SSH: &str = "stdin";

/// The longest offer line read (a banner is cut there).
const MAX_OFFER: usize = 256;
/// The longest answer line read.
const MAX_ANSWER: usize = 64;

/// The way the data goes, as the client answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Over the direct connection.
    Direct,
    /// Through ssh's pipes.
    ViaSsh,
}

/// What the server offered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    pub port: u16,
    /// The session's key (sync; pipe's client made its own).
    pub key: Option<String>,
    /// The address ssh reached the server at (`$SSH_CONNECTION`), when it
    /// said: tried after the host's own addresses, and instead of them
    /// when the host is an ssh alias that does not resolve.
    pub addr: Option<IpAddr>,
}

/// The server's offer did not come.
#[derive(Debug, thiserror::Error)]
pub enum OfferError {
    /// Nothing came within the wait.
    #[error("{0}")]
    TimedOut(io::Error),
    /// Reading it failed.
    #[error("{0}")]
    Io(io::Error),
    /// The pipe ended before a line.
    #[error("the remote side closed the connection")]
    Closed,
    /// Another line came (a login banner, an error, another program).
    #[error("the remote side did not offer a direct connection (it said {0:?})")]
    NotOffered(String),
    /// The offer named no valid port.
    #[error("bad direct port {port:?}")]
    BadPort { line: String, port: String },
}

impl OfferError {
    /// The line that came instead of the offer (empty when none did).
    pub fn said(&self) -> &str {
        match self {
            OfferError::NotOffered(line) | OfferError::BadPort { line, .. } => line,
            _ => "",
        }
    }

    /// Whether trying again could help: a slow or cut ssh may do better;
    /// a remote side that says something else will say it again.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            OfferError::TimedOut(_) | OfferError::Io(_) | OfferError::Closed
        )
    }
}

impl Dialect {
    /// The server's offer line, with the address ssh reached it at when
    /// known.
    pub(super) fn offer_line(self, port: u16, key: Option<&str>, addr: Option<IpAddr>) -> String {
        let mut line = match self {
            Dialect::Sync => format!("{SYNC_OFFER} {port} {}", key.unwrap_or_default()),
            Dialect::Pipe => format!("{PIPE_OFFER} {port}"),
        };
        if let Some(a) = addr {
            line.push_str(&format!(" {a}"));
        }
        line
    }

    /// Read the server's offer from `line`.
    pub(super) fn parse_offer(self, line: &str) -> Result<Offer, OfferError> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (port, key, addr) = match (self, words.as_slice()) {
            (Dialect::Sync, [SYNC_OFFER, port, key, rest @ ..]) => {
                (*port, Some(key.to_string()), rest)
            }
            (Dialect::Pipe, [PIPE_OFFER, port, rest @ ..]) => (*port, None, rest),
            _ => return Err(OfferError::NotOffered(line.into())),
        };
        let addr = match addr {
            [] => None,
            [a] => Some(
                a.parse::<IpAddr>()
                    .map_err(|_| OfferError::NotOffered(line.into()))?,
            ),
            _ => return Err(OfferError::NotOffered(line.into())),
        };
        match port.parse() {
            Ok(port) => Ok(Offer { port, key, addr }),
            Err(_) => Err(OfferError::BadPort {
                line: line.into(),
                port: port.into(),
            }),
        }
    }

    /// The client's answer line (sync says nothing when it connected).
    pub(super) fn answer_line(self, a: Answer) -> Option<&'static str> {
        match (self, a) {
            (Dialect::Sync, Answer::Direct) => None,
            (Dialect::Sync, Answer::ViaSsh) => Some(SYNC_VIA_SSH),
            (Dialect::Pipe, Answer::Direct) => Some(PIPE_DIRECT),
            (Dialect::Pipe, Answer::ViaSsh) => Some(PIPE_VIA_SSH),
        }
    }

    pub(super) fn parse_answer(self, line: &str) -> Option<Answer> {
        [Answer::Direct, Answer::ViaSsh]
            .into_iter()
            .find(|a| self.answer_line(*a) == Some(line))
    }
}

/// Server: offer `port` (and with [`Dialect::Sync`], `key`) on `out`.
pub fn offer<W: Write>(
    dialect: Dialect,
    out: &mut W,
    port: u16,
    key: Option<&str>,
) -> io::Result<()> {
    write_line(out, &dialect.offer_line(port, key, super::ssh_reached_ip()))
}

/// Server: the client's answer from `r` (the server's stdin), or the line
/// that came instead (empty at the end of the input).
pub fn read_answer<R: Read>(dialect: Dialect, r: R) -> io::Result<Result<Answer, String>> {
    let line = read_line(r, MAX_ANSWER)?.unwrap_or_default();
    Ok(dialect.parse_answer(&line).ok_or(line))
}

/// How the client's side of the bootstrap went.
pub struct Dialled {
    pub offer: Offer,
    pub route: Route,
}

/// The way the data goes, as the client told the server.
pub enum Route {
    /// Over this connection (not yet authenticated).
    Direct(TcpStream),
    /// Through ssh's pipes: `None` when asked to, else why the direct
    /// connection could not be made.
    ViaSsh(Option<ConnectError>),
}

/// The client's side of the bootstrap failed; ssh's pipes are of no use.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// ssh took not the key: it ended before the remote ferry started.
    #[error("ssh exited before the remote ferry started: {0}")]
    KeyNotTaken(io::Error),
    #[error(transparent)]
    Offer(#[from] OfferError),
    /// ssh took not the answer to `offer`. `fell_back`: why the direct
    /// connection had failed, if it had.
    #[error("lost the remote side: {source}")]
    Lost {
        offer: Offer,
        fell_back: Option<ConnectError>,
        source: io::Error,
    },
}

impl DialError {
    /// Whether trying again could help (ssh went away, or was slow).
    pub fn retryable(&self) -> bool {
        match self {
            DialError::Offer(e) => e.retryable(),
            DialError::KeyNotTaken(_) | DialError::Lost { .. } => true,
        }
    }
}

/// The client's side of the bootstrap, over the ssh child's pipes.
pub struct Dial<'a> {
    pub dialect: Dialect,
    /// The server's host name, to connect to (no user, no brackets:
    /// [`crate::rsh::host_name`]).
    pub host: &'a str,
    /// [`Dialect::Pipe`]: the key to hand over first.
    pub key: Option<&'a str>,
    /// How long to wait for the server's offer (`None`: for ever).
    pub wait: Option<Duration>,
    /// Try the direct connection (`false`: through ssh at once).
    pub try_direct: bool,
}

impl Dial<'_> {
    /// Hand over the key (pipe), wait for the server's offer, connect to
    /// the offered port unless told not to, and tell the server the way
    /// the data goes.
    pub fn run<W: Write, R: Read + AsFd>(
        &self,
        ssh_in: &mut W,
        ssh_out: &mut R,
    ) -> Result<Dialled, DialError> {
        let dialect = self.dialect;
        if let (Dialect::Pipe, Some(key)) = (dialect, self.key) {
            write_line(ssh_in, key).map_err(DialError::KeyNotTaken)?;
        }
        let offer = match read_line_within(ssh_out, MAX_OFFER, self.wait) {
            Ok(Some(line)) => dialect.parse_offer(&line)?,
            Ok(None) => return Err(OfferError::Closed.into()),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(OfferError::TimedOut(e).into())
            }
            Err(e) => return Err(OfferError::Io(e).into()),
        };
        let route = match self.try_direct {
            true => connect_offer(self.host, &offer)
                .map_or_else(|e| Route::ViaSsh(Some(e)), Route::Direct),
            false => Route::ViaSsh(None),
        };
        let answer = match route {
            Route::Direct(_) => Answer::Direct,
            Route::ViaSsh(_) => Answer::ViaSsh,
        };
        if let Some(line) = dialect.answer_line(answer) {
            if let Err(source) = write_line(ssh_in, line) {
                let fell_back = match route {
                    Route::ViaSsh(why) => why,
                    Route::Direct(_) => None,
                };
                return Err(DialError::Lost {
                    offer,
                    fell_back,
                    source,
                });
            }
        }
        Ok(Dialled { offer, route })
    }
}

fn write_line<W: Write>(w: &mut W, line: &str) -> io::Result<()> {
    writeln!(w, "{line}").and_then(|_| w.flush())
}

/// Read one line of at most `max` bytes, byte by byte (nothing past the
/// newline is taken), trimmed; `None` when the input ended before any
/// byte.
pub fn read_line<R: Read>(mut r: R, max: usize) -> io::Result<Option<String>> {
    let mut v = Vec::new();
    let mut b = [0u8; 1];
    let mut ended = false;
    while v.len() < max {
        match r.read(&mut b) {
            Ok(0) => {
                ended = true;
                break;
            }
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => v.push(b[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if ended && v.is_empty() {
        return Ok(None);
    }
    Ok(Some(String::from_utf8_lossy(&v).trim().to_string()))
}

/// [`read_line`], waiting at most `wait` for each byte (`None`: for
/// ever); a `TimedOut` error after that.
pub fn read_line_within<R: Read + AsFd>(
    r: &mut R,
    max: usize,
    wait: Option<Duration>,
) -> io::Result<Option<String>> {
    read_line(IdleRead::new(r, wait), max)
}
