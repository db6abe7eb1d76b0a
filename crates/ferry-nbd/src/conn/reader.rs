//! The reader thread: decodes every reply off the socket, reads READ
//! payloads straight into the request's buffer, and completes the request's
//! [`Ticket`](super::Ticket) when its reply is done. Any error kills the
//! connection (see `Shared::fail`).

use std::io::{self, Read};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::lock;
use super::socket::Sock;
use super::state::{Dead, Pending, PendingKind, Shared};
use super::ticket::Reply;
use crate::error::{Error, Result};
use crate::proto::{self, *};

/// Starts the reader thread on `sock`; when it stops, it fails the whole
/// connection with the reason.
pub(super) fn spawn(
    mut sock: Sock,
    shared: Arc<Shared>,
    structured: bool,
    ctx: Option<u32>,
    timeout: Duration,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("nbd-reader".into())
        .spawn(move || {
            let mut r = Reader {
                sock: &mut sock,
                shared: &shared,
                structured,
                ctx,
                timeout,
                last_progress: Instant::now(),
                scratch: Vec::new(),
            };
            let why = r.run();
            shared.fail(why);
        })
}

struct Reader<'a> {
    sock: &'a mut Sock,
    shared: &'a Shared,
    structured: bool,
    ctx: Option<u32>,
    timeout: Duration,
    last_progress: Instant,
    scratch: Vec<u8>,
}

enum ReadErr {
    Dead(Dead),
}

impl From<ProtoError> for ReadErr {
    fn from(p: ProtoError) -> Self {
        ReadErr::Dead(Dead::Protocol(p))
    }
}

impl Reader<'_> {
    fn run(&mut self) -> Dead {
        loop {
            match self.one() {
                Ok(()) => {}
                Err(ReadErr::Dead(d)) => return d,
            }
        }
    }

    /// Fills `buf` from the socket. `idle_ok`: at a message boundary, with
    /// nothing in flight, waiting is not a timeout.
    fn fill(&mut self, buf: &mut [u8], idle_ok: bool) -> Result<(), ReadErr> {
        let mut got = 0;
        while got < buf.len() {
            match self.sock.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(ReadErr::Dead(
                        if self.shared.closing.load(Ordering::SeqCst) {
                            Dead::Closed
                        } else {
                            Dead::Eof
                        },
                    ))
                }
                Ok(n) => {
                    got += n;
                    self.last_progress = Instant::now();
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    if self.shared.closing.load(Ordering::SeqCst) {
                        return Err(ReadErr::Dead(Dead::Closed));
                    }
                    if idle_ok && got == 0 && lock(&self.shared.state).in_flight == 0 {
                        self.last_progress = Instant::now();
                        continue;
                    }
                    if self.last_progress.elapsed() >= self.timeout {
                        return Err(ReadErr::Dead(Dead::Timeout(self.timeout.as_secs())));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(ReadErr::Dead(
                        if self.shared.closing.load(Ordering::SeqCst) {
                            Dead::Closed
                        } else {
                            Dead::Io(format!("reading from the NBD server: {e}"))
                        },
                    ))
                }
            }
        }
        Ok(())
    }

    fn take(&self, cookie: u64) -> Result<Pending, ReadErr> {
        lock(&self.shared.state)
            .pending
            .remove(&cookie)
            .ok_or(ReadErr::Dead(Dead::Protocol(ProtoError::UnknownCookie(
                cookie,
            ))))
    }

    fn put_back(&self, cookie: u64, p: Pending) {
        lock(&self.shared.state).pending.insert(cookie, p);
    }

    /// Reads one reply message and applies it to the request it answers
    /// (taken out of the table meanwhile, so no lock is held during socket
    /// reads). On error that request fails too, and the reader's caller
    /// fails the whole connection; entries put back after a concurrent
    /// `fail` are drained by the final `fail` when the reader exits.
    fn one(&mut self) -> Result<(), ReadErr> {
        let mut magic = [0u8; 4];
        self.fill(&mut magic, true)?;
        let hlen = reply_header_len(magic, self.structured)?;
        let mut hbuf = [0u8; STRUCTURED_HEADER_LEN];
        hbuf[..4].copy_from_slice(&magic);
        self.fill(&mut hbuf[4..hlen], false)?;
        let header = parse_reply_header(&hbuf[..hlen], self.structured)?;
        let cookie = header.cookie();
        let mut p = self.take(cookie)?;
        let r = self.handle(header, &mut p);
        match r {
            Ok(true) => {
                let result = finalize(&mut p);
                if matches!(&result, Err(e) if e.server_errno() == Some(ESHUTDOWN)) {
                    // The spec requires a soft disconnect: refuse new
                    // requests; NBD_CMD_DISC goes out on disconnect/drop.
                    self.shared.server_shutdown.store(true, Ordering::SeqCst);
                }
                self.shared.finish(p, result);
                Ok(())
            }
            Ok(false) => {
                self.put_back(cookie, p);
                Ok(())
            }
            Err(ReadErr::Dead(d)) => {
                p.slot.complete(Err(d.to_error()));
                let mut st = lock(&self.shared.state);
                st.in_flight -= 1;
                drop(st);
                Err(ReadErr::Dead(d))
            }
        }
    }

    /// Handles one message for `p`; returns true when the reply is complete.
    fn handle(&mut self, header: ReplyHeader, p: &mut Pending) -> Result<bool, ReadErr> {
        match header {
            ReplyHeader::Simple { error, .. } => {
                let dlen = simple_reply_data_len(error, self.structured, &p.req)?;
                if error != 0 {
                    p.error
                        .get_or_insert(server_error(&p.req, error, String::new(), None));
                } else if dlen > 0 {
                    match &mut p.kind {
                        PendingKind::Read { buf, cov } => {
                            let n = buf.len();
                            // Cannot fail: dlen == request length == buf.len().
                            let b = &mut buf[..n.min(dlen as usize)];
                            self.fill_into(b)?;
                            cov.add(p.req.offset, dlen.into())?;
                        }
                        _ => {
                            return Err(ProtoError::Malformed(
                                "simple reply data for a non-READ".into(),
                            )
                            .into())
                        }
                    }
                }
                Ok(true)
            }
            ReplyHeader::Chunk {
                flags, kind, len, ..
            } => {
                check_chunk_len(kind, len, &p.req)?;
                if kind == REPLY_TYPE_OFFSET_DATA {
                    if len < 9 {
                        return Err(ProtoError::Malformed(
                            "NBD_REPLY_TYPE_OFFSET_DATA shorter than 9 bytes".into(),
                        )
                        .into());
                    }
                    let mut ob = [0u8; 8];
                    self.fill(&mut ob, false)?;
                    let off = u64::from_be_bytes(ob);
                    let dlen = u64::from(len - 8);
                    let PendingKind::Read { buf, cov } = &mut p.kind else {
                        return Err(
                            ProtoError::Malformed("data chunk for a non-READ".into()).into()
                        );
                    };
                    cov.add(off, dlen)?;
                    let start = (off - p.req.offset) as usize;
                    let mut b = std::mem::take(buf);
                    let r = self.fill_into(&mut b[start..start + dlen as usize]);
                    if let PendingKind::Read { buf, .. } = &mut p.kind {
                        *buf = b;
                    }
                    r?;
                } else {
                    let mut scratch = std::mem::take(&mut self.scratch);
                    scratch.clear();
                    scratch.resize(len as usize, 0);
                    let r = self.fill(&mut scratch, false);
                    let res = r.and_then(|_| {
                        let chunk = parse_chunk_payload(flags, kind, &scratch, &p.req)?;
                        self.apply(chunk, p)
                    });
                    if scratch.capacity() <= 1 << 20 {
                        self.scratch = scratch;
                    }
                    res?;
                }
                Ok(flags & REPLY_FLAG_DONE != 0)
            }
        }
    }

    fn fill_into(&mut self, b: &mut [u8]) -> Result<(), ReadErr> {
        self.fill(b, false)
    }

    fn apply(&self, chunk: Chunk<'_>, p: &mut Pending) -> Result<(), ReadErr> {
        match chunk {
            Chunk::None => {}
            // Data chunks are read straight into the READ buffer in `handle`.
            Chunk::OffsetData { .. } => {}
            Chunk::OffsetHole { offset, len } => {
                if let PendingKind::Read { buf, cov } = &mut p.kind {
                    cov.add(offset, len.into())?;
                    let s = (offset - p.req.offset) as usize;
                    buf[s..s + len as usize].fill(0);
                }
            }
            Chunk::BlockStatus {
                context,
                descriptors,
            } => {
                if let PendingKind::BlockStatus { extents } = &mut p.kind {
                    if Some(context) == self.ctx {
                        if extents.is_some() {
                            return Err(ProtoError::Malformed(
                                "two block status chunks for the same context".into(),
                            )
                            .into());
                        }
                        *extents = Some(descriptors);
                    }
                }
            }
            Chunk::Error {
                errno,
                message,
                offset,
                ..
            } => {
                p.error
                    .get_or_insert(server_error(&p.req, errno, message, offset));
            }
        }
        Ok(())
    }
}

fn server_error(req: &RequestInfo, errno: u32, message: String, offset: Option<u64>) -> Error {
    Error::Server {
        command: cmd_name(req.cmd),
        offset: req.offset,
        len: req.len.into(),
        errno,
        errno_name: proto::errno_name(errno),
        message,
        error_offset: offset,
    }
}

fn finalize(p: &mut Pending) -> Result<Reply> {
    if let Some(e) = p.error.take() {
        return Err(e);
    }
    match std::mem::replace(&mut p.kind, PendingKind::Other) {
        PendingKind::Read { buf, cov } => {
            if !cov.complete() {
                return Err(ProtoError::Malformed(format!(
                    "READ at {} length {} reported success without sending all data",
                    p.req.offset, p.req.len
                ))
                .into());
            }
            Ok(Reply::Data(buf))
        }
        PendingKind::BlockStatus { extents } => match extents {
            Some(e) => Ok(Reply::Extents(e)),
            None => Err(ProtoError::Malformed(
                "BLOCK_STATUS reply without base:allocation extents".into(),
            )
            .into()),
        },
        PendingKind::Other => Ok(Reply::Done),
    }
}
