//! The byte-pipe side of a stream link: the magic, then frames (length,
//! its complement, body, XXH3 check) written by one thread and read by
//! another; keepalive frames when the writer is idle, and every read or
//! write that moves bytes noted as progress (see [`crate::liveness`]).

use std::io::{Read, Write};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use crate::codec::{self, MAX_FRAME};
use crate::liveness::{Liveness, KEEPALIVE};
use crate::msg::Message;
use crate::transport::{frame_check, Batch, LinkError, WireCounter};
use crate::MAGIC;

fn io_err(e: std::io::Error) -> LinkError {
    match e.kind() {
        std::io::ErrorKind::BrokenPipe
        | std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset => LinkError::Closed,
        _ => LinkError::Io(e.to_string()),
    }
}

pub(crate) fn write_loop<W: Write>(
    w: &mut W,
    rx: &Receiver<Batch>,
    sent: &WireCounter,
    link_rate: &std::sync::atomic::AtomicU64,
    live: &Liveness,
) -> Result<(), LinkError> {
    w.write_all(MAGIC).map_err(io_err)?;
    sent.add(MAGIC.len() as u64);
    let mut buf = Vec::with_capacity(1 << 20);
    // How fast the pipe drains, for the compressor's choice of codec.
    let mut drain = ferry_compress::DrainRate::default();
    loop {
        let m = match rx.try_recv() {
            Ok(m) => m,
            Err(TryRecvError::Empty) => {
                w.flush().map_err(io_err)?;
                live.moved();
                match rx.recv_timeout(KEEPALIVE) {
                    Ok(m) => m,
                    Err(RecvTimeoutError::Timeout) => {
                        // Nothing to say: an empty frame says "alive".
                        write_keepalive(w)?;
                        live.moved();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        buf.clear();
        push_frames(m, &mut buf);
        // Frames already queued go out in the same write, up to
        // COALESCE bytes: a file list of small entries would otherwise
        // cost a write (and, through ssh, a packet) per entry.
        while buf.len() < COALESCE {
            match rx.try_recv() {
                Ok(m) => push_frames(m, &mut buf),
                Err(_) => break,
            }
        }
        let t = std::time::Instant::now();
        // Each write that takes bytes is progress: a slow but moving pipe
        // is never taken for a dead one (see [`Liveness`]).
        write_all_live(w, &buf, live)?;
        sent.add(buf.len() as u64);
        let now = std::time::Instant::now();
        if let Some(rate) = drain.wrote(buf.len() as u64, now - t, now) {
            link_rate.store(rate.to_bits(), std::sync::atomic::Ordering::Relaxed);
        }
    }
    w.flush().map_err(io_err)
}

/// Frames gathered into one write while more are queued (see
/// [`write_loop`]).
const COALESCE: usize = 64 << 10;

/// Append the frames of `b`'s messages to `buf`.
fn push_frames(b: Batch, buf: &mut Vec<u8>) {
    match b {
        Batch::One(m) => push_frame(&m, buf),
        Batch::Many(ms) => ms.for_each(|m| push_frame(&m, buf)),
    }
}

/// Append `m`'s frame to `buf`: length, its complement, body, check.
fn push_frame(m: &Message, buf: &mut Vec<u8>) {
    let start = buf.len();
    buf.extend_from_slice(&[0; 8]);
    codec::encode(m, buf);
    let body = (buf.len() - start - 8) as u32;
    buf[start..start + 4].copy_from_slice(&body.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&(!body).to_le_bytes());
    let check = frame_check(&buf[start..]);
    buf.extend_from_slice(&check.to_le_bytes());
}

/// `write_all`, noting each write that the pipe took as progress.
fn write_all_live<W: Write>(w: &mut W, mut buf: &[u8], live: &Liveness) -> Result<(), LinkError> {
    while !buf.is_empty() {
        match w.write(buf) {
            Ok(0) => return Err(LinkError::Closed),
            Ok(n) => {
                buf = &buf[n..];
                live.moved();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(e)),
        }
    }
    Ok(())
}

/// `read_exact`, noting each read that brought bytes as progress.
fn read_exact_live<R: Read>(
    r: &mut R,
    mut buf: &mut [u8],
    live: &Liveness,
) -> Result<(), LinkError> {
    while !buf.is_empty() {
        match r.read(buf) {
            Ok(0) => return Err(LinkError::Closed),
            Ok(n) => {
                buf = &mut buf[n..];
                live.heard();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(e)),
        }
    }
    Ok(())
}

/// An empty frame: a keepalive, skipped by the reader.
pub(crate) fn write_keepalive<W: Write>(w: &mut W) -> Result<(), LinkError> {
    let mut f = [0u8; 12];
    f[4..8].copy_from_slice(&(!0u32).to_le_bytes());
    let check = frame_check(&f[..8]);
    f[8..].copy_from_slice(&check.to_le_bytes());
    w.write_all(&f).map_err(io_err)?;
    w.flush().map_err(io_err)
}

/// Bytes the reader buffers: what one batch of frames is taken from.
const READ_BUFFER: usize = 256 << 10;

/// Messages handed over in one batch at most.
const MAX_BATCH: usize = 1024;

/// Frame bytes gathered into one batch at most (past the first frame):
/// some small frames decode to many times their size (an entry's empty
/// attribute names), and a batch sits in a queue of [`READ_QUEUE`].
const MAX_BATCH_BYTES: usize = 64 << 10;

/// Batches queued from a stream reader to its receiver: each holds at most
/// one large frame plus [`MAX_BATCH_BYTES`] of small ones.
pub(crate) const READ_QUEUE: usize = 16;

/// Whether `buf` starts with a whole frame (as its length says; a damaged
/// length is found when the frame is read).
fn whole_frame(buf: &[u8]) -> bool {
    buf.len() >= 8 && {
        let n = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as u64;
        buf.len() as u64 >= 8 + n + 4
    }
}

/// Read the magic, then frames until the pipe closes or fails. Messages
/// go to `tx` in batches: every frame already in the read buffer is
/// decoded before the batch is handed over, so the receiving thread is
/// woken once per buffer rather than once per message (a file list of
/// small entries arrives a few thousand to a read).
pub(crate) fn read_loop<R: Read>(
    r: &mut R,
    tx: &Sender<Batch>,
    received: &WireCounter,
    live: &Liveness,
) -> Result<(), LinkError> {
    read_magic(r, received)?;
    let mut r = std::io::BufReader::with_capacity(READ_BUFFER, r);
    let mut batch = Vec::new();
    let res = read_frames(&mut r, tx, &mut batch, received, live);
    // What was decoded before the end (or the damage) still goes first.
    if !batch.is_empty() {
        let _ = tx.send(Batch::Many(batch.into_iter()));
    }
    res
}

fn read_magic<R: Read>(r: &mut R, received: &WireCounter) -> Result<(), LinkError> {
    let mut magic = [0u8; 8];
    let mut got = 0;
    while got < magic.len() {
        match r.read(&mut magic[got..]) {
            Ok(0) if got == 0 => return Err(LinkError::Closed),
            Ok(0) => {
                return Err(LinkError::BadMagic(
                    String::from_utf8_lossy(&magic[..got]).into(),
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(e)),
        }
    }
    if magic[..6] == MAGIC[..6] && magic[7] == b'\n' && magic[6] != MAGIC[6] {
        return Err(LinkError::Version(magic[6]));
    }
    if &magic != MAGIC {
        // Show what arrived: often a shell's banner or an error text.
        let mut more = [0u8; 120];
        let n = r.read(&mut more).unwrap_or(0);
        let mut text = magic.to_vec();
        text.extend_from_slice(&more[..n]);
        return Err(LinkError::BadMagic(
            String::from_utf8_lossy(&text).trim().to_string(),
        ));
    }
    received.add(MAGIC.len() as u64);
    Ok(())
}

fn read_frames<R: Read>(
    r: &mut std::io::BufReader<R>,
    tx: &Sender<Batch>,
    batch: &mut Vec<Message>,
    received: &WireCounter,
    live: &Liveness,
) -> Result<(), LinkError> {
    let mut frame = Vec::new();
    let mut bytes = 0;
    loop {
        // Hand the batch over before a read that may have to wait.
        if !batch.is_empty()
            && (batch.len() >= MAX_BATCH || bytes >= MAX_BATCH_BYTES || !whole_frame(r.buffer()))
        {
            let full = std::mem::take(batch);
            bytes = 0;
            if tx.send(Batch::Many(full.into_iter())).is_err() {
                return Ok(());
            }
        }
        let mut len = [0u8; 8];
        match r.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(LinkError::Closed)
            }
            Err(e) => return Err(io_err(e)),
        }
        let n = u32::from_le_bytes([len[0], len[1], len[2], len[3]]);
        let not_n = u32::from_le_bytes([len[4], len[5], len[6], len[7]]);
        // A damaged length is caught here, before waiting for a body that
        // may never come.
        if not_n != !n {
            return Err(LinkError::Checksum);
        }
        let n = n as u64;
        if n > MAX_FRAME as u64 {
            return Err(LinkError::FrameTooLarge(n));
        }
        // Header, body and check, read as one. The buffer only grows:
        // shrinking it for a small frame would zero the bytes again for
        // the next big one.
        let need = 8 + n as usize + 4;
        if frame.len() < need {
            frame.resize(need, 0);
        }
        let frame = &mut frame[..need];
        frame[..8].copy_from_slice(&len);
        live.heard();
        read_exact_live(r, &mut frame[8..], live)?;
        received.add(8 + n + 4);
        let (lb, check) = frame.split_at(8 + n as usize);
        let check = u32::from_le_bytes([check[0], check[1], check[2], check[3]]);
        if check != frame_check(lb) {
            return Err(LinkError::Checksum);
        }
        if n == 0 {
            // A keepalive.
            continue;
        }
        batch.push(codec::decode(&lb[8..])?);
        bytes += need;
    }
}
