//! `--direct`: the data leaves ssh for a TCP connection of its own,
//! authenticated and encrypted with a fresh one-session key that the server
//! offers over ssh. The bootstrap is [`ferry_link::direct`]'s, in its sync
//! dialect; here its outcomes become the session's endpoint or its error.

use std::process::{ChildStdin, ChildStdout};
use std::sync::mpsc;
use std::time::Duration;

use ferry_channel::{ChannelError, Psk};
use ferry_link::direct::{self, AcceptError, Accepted, Answer, DialError, Dialect, OfferError};
use ferry_link::stripe::{self, Streams};
use ferry_link::{Endpoint, Flushed, LinkError};

use crate::error::{Error, Result};
use crate::stats::Stats;

/// How long each side waits for the other: the client for the server's
/// offer, the server for a client that proves the key.
const DIRECT_WAIT: Duration = Duration::from_secs(30);

fn chan_err(e: ChannelError) -> Error {
    match e {
        ChannelError::Io(io) => Error::Link(LinkError::Io(format!("direct channel: {io}"))),
        other => Error::Protocol(format!("direct channel: {other}")),
    }
}

fn link_io(e: impl ToString) -> Error {
    Error::Link(LinkError::Io(e.to_string()))
}

/// Client side of `--direct`: read the server's port and key from ssh,
/// connect (as many connections as `streams` says), and prove the key:
/// `Some` endpoint. When the server is up but
/// cannot be reached (a firewall, NAT), it has been told so over ssh, the
/// notice is out and the session goes on over ssh's pipes: `None`.
pub(super) fn direct_connect(
    host: &str,
    streams: Streams,
    ssh_in: &mut ChildStdin,
    ssh_out: &mut ChildStdout,
    stats: &Stats,
) -> Result<Option<Endpoint>> {
    let dial = direct::Dial {
        dialect: Dialect::Sync,
        host: ferry_link::rsh::host_name(host),
        key: None,
        wait: Some(DIRECT_WAIT),
        try_direct: true,
    };
    let dialled = dial.run(ssh_in, ssh_out).map_err(dial_err)?;
    match dialled.route {
        direct::Route::Direct(s) => {
            let key = dialled.offer.key.unwrap_or_default();
            let psk = Psk::new(key.as_bytes()).map_err(chan_err)?;
            let (session, conn) = stripe::join_client(s, &psk, streams, direct::HANDSHAKE_TIMEOUT)
                .map_err(chan_err)?;
            let (ep, _) = direct::channel_link(&session, &conn).map_err(link_io)?;
            stats
                .direct_connections
                .store(conn.count() as u64, std::sync::atomic::Ordering::Relaxed);
            Ok(Some(ep))
        }
        direct::Route::ViaSsh(why) => {
            let e = link_io(why.map(|e| e.to_string()).unwrap_or_default());
            stats.notice(format!("{e}; sending through ssh instead of --direct"));
            Ok(None)
        }
    }
}

fn dial_err(e: DialError) -> Error {
    match e {
        DialError::Offer(OfferError::TimedOut(_)) => {
            link_io("the remote ferry did not offer a direct connection")
        }
        DialError::Offer(OfferError::Closed) => Error::Link(LinkError::Closed),
        DialError::Offer(OfferError::NotOffered(line)) => {
            Error::Link(LinkError::BadMagic(line.chars().take(120).collect()))
        }
        DialError::Offer(OfferError::BadPort { port, .. }) => {
            Error::Protocol(format!("bad direct port {port:?}"))
        }
        DialError::Offer(OfferError::Io(e)) | DialError::KeyNotTaken(e) => link_io(e),
        // The server could not be told that we go through ssh.
        DialError::Lost {
            fell_back: Some(why),
            ..
        } => link_io(why),
        DialError::Lost { source, .. } => link_io(source),
    }
}

/// Server side of `--direct`: listen where the ssh connection arrived,
/// offer port and a fresh key on stdout, and take the first client that
/// proves the key; or, when the client says it cannot connect, speak the
/// protocol over ssh after all. Nobody else gets in: the key never leaves
/// ssh.
pub(super) fn direct_accept() -> Result<(Endpoint, Flushed)> {
    let io = |e: std::io::Error| Error::Link(LinkError::Io(format!("direct listener: {e}")));
    let listener =
        std::net::TcpListener::bind((direct::ssh_listen_ip().as_str(), 0)).map_err(io)?;
    let port = listener.local_addr().map_err(io)?.port();
    let (key, psk) = direct::fresh_key().map_err(chan_err)?;
    direct::offer(
        Dialect::Sync,
        &mut std::io::stdout().lock(),
        port,
        Some(&key),
    )
    .map_err(io)?;
    // Read through std's stdin, so nothing after the answer is taken from
    // the protocol that follows it.
    let (via_ssh_tx, via_ssh) = mpsc::channel();
    std::thread::spawn(move || {
        if let Ok(Ok(Answer::ViaSsh)) = direct::read_answer(Dialect::Sync, std::io::stdin()) {
            let _ = via_ssh_tx.send(());
        }
    });
    let told = || via_ssh.try_recv().is_ok();
    let mut last = None;
    let res = direct::accept_authenticated(
        &listener,
        &psk,
        Some(DIRECT_WAIT),
        &mut |_, e| last = Some(e),
        &told,
    );
    match res {
        Ok(Accepted::Peer(session, conn)) => direct::channel_link(&session, &conn).map_err(link_io),
        Ok(Accepted::Stopped) => {
            drop(listener);
            Ok(ferry_link::stream_link_flushed(
                std::io::stdin(),
                std::io::stdout(),
            ))
        }
        // Not our client (or a wrong key), or none came.
        Err(AcceptError::NoPeer { .. }) => {
            Err(last.map_or_else(|| link_io("no direct connection from the client"), chan_err))
        }
        Err(AcceptError::Listener(e)) => Err(io(e)),
    }
}
