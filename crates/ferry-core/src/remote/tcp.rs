//! `--direct`: the data leaves ssh for a TCP connection of its own,
//! authenticated and encrypted with a fresh one-session key that the server
//! announces over ssh. The client side connects (or says over ssh that it
//! cannot, and the session stays on ssh); the server side listens, announces
//! and takes the first connection that proves the key.

use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::time::Instant;

use ferry_link::{Endpoint, LinkError};

use crate::error::{Error, Result};

/// The line a direct-mode server prints on stdout (over ssh): its port
/// and the hex key for this one session.
const DIRECT_HELLO: &str = "FERRY-DIRECT";

/// The line a `--direct` client sends over ssh when it cannot connect: the
/// server then speaks the protocol over ssh after all.
pub(super) const DIRECT_FALLBACK: &str = "FERRY-VIA-SSH";

/// How long a direct-mode server waits for its client.
const DIRECT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

fn chan_err(e: ferry_channel::ChannelError) -> Error {
    match e {
        ferry_channel::ChannelError::Io(io) => {
            Error::Link(LinkError::Io(format!("direct channel: {io}")))
        }
        other => Error::Protocol(format!("direct channel: {other}")),
    }
}

/// An endpoint over an authenticated, encrypted channel on `stream`.
fn channel_link(
    stream: std::net::TcpStream,
    psk: &ferry_channel::Psk,
    role: ferry_channel::Role,
) -> Result<(Endpoint, ferry_link::Flushed)> {
    let _ = stream.set_nodelay(true);
    let mut r = stream
        .try_clone()
        .map_err(|e| Error::Link(LinkError::Io(e.to_string())))?;
    let mut w = stream
        .try_clone()
        .map_err(|e| Error::Link(LinkError::Io(e.to_string())))?;
    let session = ferry_channel::handshake(&mut r, &mut w, psk, role).map_err(chan_err)?;
    // The handshake's timeout is for the handshake only: a session may be
    // quiet for long (a sender walking a large tree, a receiver signing a
    // large old copy).
    stream
        .set_read_timeout(None)
        .map_err(|e| Error::Link(LinkError::Io(e.to_string())))?;
    let reader = ferry_channel::ChannelReader::new(r, &session);
    // Small messages coalesce into one sealed frame; large ones pass.
    let writer =
        std::io::BufWriter::with_capacity(1 << 20, ferry_channel::ChannelWriter::new(w, &session));
    Ok(ferry_link::stream_link_flushed(reader, writer))
}

/// Client side of `--direct`: read the server's port and key from ssh,
/// connect, and prove the key.
/// When the server answered but no connection could be made, the error
/// comes with ssh's stdout, so the session can go on over ssh.
pub(super) fn direct_connect(
    host: &str,
    stdout: std::process::ChildStdout,
) -> std::result::Result<Endpoint, (Error, Option<BufReader<std::process::ChildStdout>>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let mut r = BufReader::new(stdout);
        let res = r.read_line(&mut line).map(|_| (line, r));
        let _ = tx.send(res);
    });
    let (line, reader) = match rx.recv_timeout(DIRECT_WAIT) {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return Err((Error::Link(LinkError::Io(e.to_string())), None)),
        Err(_) => {
            return Err((
                Error::Link(LinkError::Io(
                    "the remote ferry did not offer a direct connection".into(),
                )),
                None,
            ))
        }
    };
    let mut words = line.split_whitespace();
    let (Some(DIRECT_HELLO), Some(port), Some(key)) = (words.next(), words.next(), words.next())
    else {
        return if line.is_empty() {
            Err((Error::Link(LinkError::Closed), None))
        } else {
            Err((
                Error::Link(LinkError::BadMagic(line.trim().chars().take(120).collect())),
                None,
            ))
        };
    };
    let port: u16 = port
        .parse()
        .map_err(|_| (Error::Protocol(format!("bad direct port {port:?}")), None))?;
    // Test aid: a port where nothing listens, as behind a firewall.
    #[cfg(feature = "test-hooks")]
    let port = if std::env::var_os("FERRY_TEST_DIRECT_UNREACHABLE").is_some() {
        1
    } else {
        port
    };
    let psk = ferry_channel::Psk::new(key.as_bytes()).map_err(|e| (chan_err(e), None))?;
    let name = host.rsplit('@').next().unwrap_or(host);
    let name = name.trim_start_matches('[').trim_end_matches(']');
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = match (name, port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => {
            let e = Error::Link(LinkError::Io(format!("cannot resolve {name}: {e}")));
            return Err((e, Some(reader)));
        }
    };
    let mut last = None;
    for a in &addrs {
        match std::net::TcpStream::connect_timeout(a, DIRECT_CONNECT_WAIT) {
            Ok(s) => {
                return channel_link(s, &psk, ferry_channel::Role::Initiator)
                    .map(|(ep, _)| ep)
                    .map_err(|e| (e, None))
            }
            Err(e) => last = Some(e),
        }
    }
    let e = Error::Link(LinkError::Io(format!(
        "direct connection to {name}:{port} failed ({})",
        last.map(|e| e.to_string())
            .unwrap_or_else(|| "no address".into())
    )));
    Err((e, Some(reader)))
}

/// How long a `--direct` client tries to connect before it falls back.
const DIRECT_CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Server side of `--direct`: listen where the ssh connection arrived,
/// announce port and a fresh key on stdout, and take the first client that
/// proves the key. Nobody else gets in: the key never leaves ssh.
pub(super) fn direct_accept() -> Result<(Endpoint, ferry_link::Flushed)> {
    let ip = std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2).map(str::to_string))
        .unwrap_or_else(|| "0.0.0.0".into());
    let io = |e: std::io::Error| Error::Link(LinkError::Io(format!("direct listener: {e}")));
    let listener = std::net::TcpListener::bind((ip.as_str(), 0)).map_err(io)?;
    let port = listener.local_addr().map_err(io)?.port();
    let key = ferry_channel::Psk::generate_hex().map_err(chan_err)?;
    let psk = ferry_channel::Psk::new(key.as_bytes()).map_err(chan_err)?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{DIRECT_HELLO} {port} {key}").map_err(io)?;
        out.flush().map_err(io)?;
    }
    listener.set_nonblocking(true).map_err(io)?;
    // The client may say over ssh that it cannot connect: then the session
    // runs over ssh. Read byte by byte through std's stdin, so nothing after
    // the line is taken from the protocol that follows it.
    let (fb_tx, fb_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while line.len() < 64 {
            match std::io::stdin().read(&mut b) {
                Ok(1) if b[0] == b'\n' => break,
                Ok(1) => line.push(b[0]),
                _ => return,
            }
        }
        if line == DIRECT_FALLBACK.as_bytes() {
            let _ = fb_tx.send(());
        }
    });
    let deadline = Instant::now() + DIRECT_WAIT;
    // Each connection proves the key on a thread of its own, so one that
    // connects and says nothing cannot hold up our client (at most 8 at
    // once, 10 s each); the first that proves it is the session.
    let (won_tx, won_rx) = std::sync::mpsc::channel();
    let pending = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut last_err = None;
    loop {
        if fb_rx.try_recv().is_ok() {
            drop(listener);
            return Ok(ferry_link::stream_link_flushed(
                std::io::stdin(),
                std::io::stdout(),
            ));
        }
        while let Ok(r) = won_rx.try_recv() {
            match r {
                Ok(x) => return Ok(x),
                // Not our client (or a wrong key): keep waiting.
                Err(e) => last_err = Some(e),
            }
        }
        match listener.accept() {
            Ok((s, _)) if pending.load(std::sync::atomic::Ordering::SeqCst) < 8 => {
                s.set_nonblocking(false).map_err(io)?;
                let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                let (tx, psk, n) = (won_tx.clone(), psk.clone(), pending.clone());
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                std::thread::spawn(move || {
                    let _ = tx.send(channel_link(s, &psk, ferry_channel::Role::Responder));
                    n.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => return Err(io(e)),
        }
        if Instant::now() >= deadline {
            return Err(last_err.unwrap_or_else(|| {
                Error::Link(LinkError::Io("no direct connection from the client".into()))
            }));
        }
    }
}
