//! Reaching a daemon: `ferry://host:port/path` URLs, the connection, the
//! handshake with the key, the request and its answer.

use std::io::{BufWriter, Read, Write};

use ferry_channel::{ChannelError, ChannelReader, ChannelWriter, Psk};
use ferry_link::daemon::{self as pre, Status};
use ferry_link::direct::{connect, HANDSHAKE_TIMEOUT};
use ferry_link::stripe::{self, Conn, ConnRead, ConnWrite, Streams};
use ferry_link::{Endpoint, FatalClass, Flushed, LinkError};

use crate::error::{Error, Result};

/// How long a client waits for the daemon's answer.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(90);

/// The port a `ferry://` URL without one means.
pub const DEFAULT_PORT: u16 = 7391;

/// `ferry://host[:port]/path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonUrl {
    /// A name, an IPv4 address or a bracketed IPv6 address (brackets
    /// removed).
    pub host: String,
    pub port: u16,
    /// Relative to the daemon's root; `""` for the root itself.
    pub path: String,
}

/// Parse `s` as a daemon URL: `None` when it is not one (no `ferry://`),
/// an error when it is a bad one.
pub fn parse_url(s: &str) -> Option<std::result::Result<DaemonUrl, String>> {
    let rest = s.strip_prefix("ferry://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let bad = |why: &str| Some(Err(format!("{s:?}: {why} (ferry://host[:port]/path)")));
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((h, tail)) = v6.split_once(']') else {
            return bad("unclosed [");
        };
        (h, tail.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return bad("no host");
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return bad("bad port"),
        },
    };
    Some(Ok(DaemonUrl {
        host: host.into(),
        port,
        path: path.into(),
    }))
}

fn shown(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("ferry://[{host}]:{port}")
    } else {
        format!("ferry://{host}:{port}")
    }
}

/// Connect to the daemon at `host:port` (over as many connections as
/// `streams` says), prove `psk`, send `args` (a `serve` command line) and
/// read the answer: the session's endpoint when it was accepted.
/// Wait on the [`Flushed`] before exiting: a daemon learns that a pull
/// is complete from our last message.
pub fn daemon_connect(
    host: &str,
    port: u16,
    psk: &Psk,
    args: &[String],
    streams: Streams,
) -> Result<(Endpoint, Flushed)> {
    let (reader, writer, _) = dial(host, port, psk, args, streams)?;
    Ok(ferry_link::stream_link_flushed(reader, writer))
}

/// As [`daemon_connect`], for a stream request (`recv -- PATH`): the bare
/// connection (or connections, as `streams` says) once the daemon has
/// accepted, on which the stream then makes its own handshake (fresh
/// keys, the same pre-shared key).
pub fn daemon_stream(
    host: &str,
    port: u16,
    psk: &Psk,
    args: &[String],
    streams: Streams,
) -> Result<Conn> {
    let (_, _, conn) = dial(host, port, psk, args, streams)?;
    Ok(conn)
}

type Dialed = (
    ChannelReader<ConnRead>,
    BufWriter<ChannelWriter<ConnWrite>>,
    Conn,
);

/// Connect, prove the key, send the request and read an accepting answer.
fn dial(host: &str, port: u16, psk: &Psk, args: &[String], streams: Streams) -> Result<Dialed> {
    let name = shown(host, port);
    let link = |what: String| Error::Link(LinkError::Io(what));
    let s = connect(host, port).map_err(|e| link(e.to_string()))?;
    let (session, conn) =
        stripe::join_client(s, psk, streams, HANDSHAKE_TIMEOUT).map_err(|e| match e {
            ChannelError::WrongKey => Error::Auth(format!(
                "{name} does not hold this key (check --key-file on both sides)"
            )),
            ChannelError::Io(io) => link(format!("{name}: handshake: {io}")),
            other => Error::Protocol(format!("{name}: handshake: {other}")),
        })?;
    // The daemon answers within its request and lock waits; one that does
    // not is gone.
    let r = conn.reader(Some(ANSWER_WAIT));
    let w = conn.writer();
    let (r, w) = r
        .and_then(|r| Ok((r, w?)))
        .map_err(|e| link(e.to_string()))?;
    let mut reader = ChannelReader::new(r, &session);
    let mut writer = BufWriter::with_capacity(1 << 20, ChannelWriter::new(w, &session));
    let req = pre::encode_request(args).map_err(|e| Error::Usage(e.to_string()))?;
    let sent = writer.write_all(&req).and_then(|()| writer.flush());
    sent.map_err(|e| link(format!("{name}: sending the request: {e}")))?;
    let mut head = [0u8; pre::ANSWER_HEAD];
    reader
        .read_exact(&mut head)
        .map_err(|e| link(format!("{name} closed the session before answering: {e}")))?;
    let proto = |e: pre::PreambleError| Error::Protocol(format!("{name}: {e}"));
    let (status, n) = pre::answer_head(&head).map_err(proto)?;
    let mut text = vec![0u8; n];
    reader
        .read_exact(&mut text)
        .map_err(|e| link(format!("{name}: {e}")))?;
    let text = pre::answer_text(&text).map_err(proto)?;
    reader.get_mut().set_idle(None);
    match status {
        Status::Accepted => Ok((reader, writer, conn)),
        Status::Usage => Err(Error::Usage(format!("{name} refused the session: {text}"))),
        Status::Io => Err(Error::Peer {
            class: FatalClass::Io,
            msg: format!("{name}: {text}"),
        }),
        Status::Busy => Err(Error::Busy(format!("{name}: {text}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = |s: &str| parse_url(s).unwrap().unwrap();
        assert_eq!(
            u("ferry://box:9000/data/x"),
            DaemonUrl {
                host: "box".into(),
                port: 9000,
                path: "data/x".into()
            }
        );
        assert_eq!(u("ferry://10.0.0.2").port, DEFAULT_PORT);
        assert_eq!(u("ferry://10.0.0.2").path, "");
        assert_eq!(u("ferry://[::1]:7/a/").host, "::1");
        assert_eq!(u("ferry://[::1]:7/a/").path, "a/");
        assert!(parse_url("box:/x").is_none());
        for bad in [
            "ferry://",
            "ferry://:80/x",
            "ferry://h:0/",
            "ferry://h:99999/",
            "ferry://[::1/",
        ] {
            assert!(parse_url(bad).unwrap().is_err(), "{bad}");
        }
    }
}
