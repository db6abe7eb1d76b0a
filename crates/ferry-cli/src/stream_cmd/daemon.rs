//! A daemon's streams (`serve --listen --root DIR`): a client pushes one
//! into a file beneath the root (`ferry send ... ferry://HOST:PORT/PATH`)
//! or fetches one (`ferry recv --from ferry://...`). The daemon opens the
//! file by handles and accepts; these run the stream on the bare
//! connection with the daemon's key. Each session's buffer is 64 MiB: a
//! daemon serves several.

use ferry_link::stripe::Conn;
use std::fs::File;
use std::sync::Arc;
use std::time::Duration;

use ferry_channel::Psk;
use ferry_core::remote::daemon::{StreamDone, StreamRecv, StreamSend};
use ferry_stream::{ErrorKind, Options, StreamError};

use super::recv::ResumableFile;

/// The stream options of a daemon's session.
fn options(key: &Psk, idle: Option<Duration>) -> Options {
    let mut opts = Options::new(key.clone());
    opts.buffer = 64 << 20;
    // A client that never starts its stream, or goes silent in it (a live
    // one sends a keepalive every second), gives back its slot.
    opts.idle = Some(idle.unwrap_or(Duration::from_secs(30)));
    opts
}

/// A stream's failure as the daemon's session error: a wrong key is an
/// authentication failure, a broken stream a protocol error, the
/// daemon's own file an I/O error, the rest the link's.
fn failure(e: StreamError) -> ferry_core::Error {
    use ferry_core::Error;
    let msg = e.to_string();
    match e.kind {
        ErrorKind::WrongKey => Error::Auth(msg),
        ErrorKind::Usage => Error::Usage(msg),
        ErrorKind::Integrity => Error::Protocol(msg),
        ErrorKind::Io | ErrorKind::ConsumerExited | ErrorKind::ProducerFailed => Error::Io {
            path: "the stream's file".into(),
            source: std::io::Error::other(msg),
        },
        _ => Error::Link(ferry_link::LinkError::Io(msg)),
    }
}

/// What the session moved, from the stream's summary and counters.
fn done(opts: &Options, s: ferry_stream::Summary) -> StreamDone {
    StreamDone {
        bytes: s.bytes,
        resumed: ferry_stream::Stats::get(&opts.stats.resumed),
    }
}

/// Receives a client's stream into the file the daemon opened.
pub fn daemon_receiver(key: Psk, idle: Option<Duration>) -> Arc<StreamRecv> {
    Arc::new(move |file: File, conn: Conn, resume: bool| {
        let opts = options(&key, idle);
        let open: ferry_stream::Opener<ResumableFile> =
            Box::new(move || ResumableFile::from_file(file, resume, "the stream's file"));
        ferry_stream::recv_conn(&opts, &conn, open)
            .map(|s| done(&opts, s))
            .map_err(failure)
    })
}

/// Sends the file the daemon opened as a stream to the client (resumed
/// from what the client's own file holds, when it offers that).
pub fn daemon_sender(key: Psk, idle: Option<Duration>) -> Arc<StreamSend> {
    Arc::new(move |file: File, conn: Conn| {
        let opts = options(&key, idle);
        ferry_stream::send_file_conn(&opts, file, &conn)
            .map(|s| done(&opts, s))
            .map_err(failure)
    })
}
