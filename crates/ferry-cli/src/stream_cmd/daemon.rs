//! A daemon's streams (`serve --listen --root DIR`): a client pushes one
//! into a file beneath the root (`ferry send ... ferry://HOST:PORT/PATH`)
//! or fetches one (`ferry recv --from ferry://...`). The daemon opens the
//! file by handles and accepts; these run the stream on the bare
//! connection with the daemon's key. Each session's buffer is 64 MiB: a
//! daemon serves several.

use std::fs::File;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use ferry_channel::Psk;
use ferry_core::remote::daemon::{StreamRecv, StreamSend};
use ferry_stream::{ErrorKind, Options, StreamError};

use super::recv::ResumableFile;

/// The stream options of a daemon's session.
fn options(key: &Psk, idle: Option<Duration>) -> Options {
    let mut opts = Options::new(key.clone());
    opts.buffer = 64 << 20;
    opts.idle = idle;
    opts
}

/// A stream's failure as the daemon's session error.
fn failure(e: StreamError) -> ferry_core::Error {
    use ferry_link::FatalClass;
    let class = match e.kind {
        ErrorKind::Usage => FatalClass::Usage,
        ErrorKind::Io | ErrorKind::ConsumerExited | ErrorKind::ProducerFailed => FatalClass::Io,
        _ => FatalClass::Connection,
    };
    ferry_core::Error::Peer {
        class,
        msg: e.to_string(),
    }
}

/// A connection's read half, and how to shut it.
type Halves = (TcpStream, Box<dyn Fn() + Send>);

/// The connection's read half and how to shut it (`how`).
fn halves(conn: &TcpStream, how: std::net::Shutdown) -> Result<Halves, ferry_core::Error> {
    let io = |e: std::io::Error| failure(StreamError::new(ErrorKind::Io, e.to_string()));
    let r = conn.try_clone().map_err(io)?;
    let ctl = conn.try_clone().map_err(io)?;
    Ok((
        r,
        Box::new(move || {
            let _ = ctl.shutdown(how);
        }),
    ))
}

/// Receives a client's stream into the file the daemon opened.
pub fn daemon_receiver(key: Psk, idle: Option<Duration>) -> Arc<StreamRecv> {
    Arc::new(move |file: File, conn: TcpStream, resume: bool| {
        let opts = options(&key, idle);
        let (r, shut) = halves(&conn, std::net::Shutdown::Write)?;
        let open: ferry_stream::Opener<ResumableFile> =
            Box::new(move || ResumableFile::from_file(file, resume, "the stream's file"));
        ferry_stream::recv_over(&opts, r, conn, open, Some(shut))
            .map(|s| s.bytes)
            .map_err(failure)
    })
}

/// Sends the file the daemon opened as a stream to the client (resumed
/// from what the client's own file holds, when it offers that).
pub fn daemon_sender(key: Psk, idle: Option<Duration>) -> Arc<StreamSend> {
    Arc::new(move |file: File, conn: TcpStream| {
        let opts = options(&key, idle);
        let (r, abort) = halves(&conn, std::net::Shutdown::Both)?;
        ferry_stream::send_file_over(&opts, file, r, conn, Some(abort))
            .map(|s| s.bytes)
            .map_err(failure)
    })
}
