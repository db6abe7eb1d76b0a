//! The receiving half of a striped session: chunks back in order.
//!
//! Each read drains what every connection has ready into that
//! connection's queue of chunks (so every connection's TCP window stays
//! open and grows, as it would for a reader of that connection alone),
//! and hands on the chunk that is due. The queues together hold at most
//! [`WINDOW`] bytes, plus the chunk each connection is receiving: a
//! connection whose queue is full is not read until its chunks come due,
//! except to finish the chunk that is due itself.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use super::{HEADER, MAX_CHUNK};

/// Bytes of complete chunks held for reordering, over all connections.
pub const WINDOW: usize = 32 << 20;

/// Buffers kept for reuse.
const SPARE: usize = 32;

/// A side ends all its connections at once: once one has ended, the
/// others have this long to bring what is due or end too, or the session
/// is cut (a connection that died without a reset).
pub const ENDED_GRACE: Duration = Duration::from_secs(30);

/// Where one connection stands.
struct Lane<S> {
    s: S,
    head: [u8; HEADER],
    /// Bytes of `head` read so far (the chunk being received has its
    /// header when this is `HEADER`).
    got: usize,
    /// The chunk being received: its `seq`, the bytes of it received so
    /// far, and its buffer (as long as the chunk).
    part: Option<(u64, usize, Vec<u8>)>,
    /// Complete chunks, in `seq` order.
    ready: VecDeque<(u64, Vec<u8>)>,
    /// Bytes in `ready`.
    held: usize,
    /// The last `seq` seen on this connection.
    last: Option<u64>,
    ended: bool,
}

/// Reads a striped session's bytes in order; see the module docs. The
/// lanes are TCP connections (any pollable byte stream will do).
pub struct StripeReader<S = TcpStream> {
    lanes: Vec<Lane<S>>,
    /// The chunk due next, and how much of it was handed on.
    next: u64,
    off: usize,
    idle: Option<Duration>,
    /// See [`ENDED_GRACE`].
    grace: Duration,
    spare: Vec<Vec<u8>>,
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl<S: Read + AsFd> StripeReader<S> {
    pub fn new(socks: Vec<S>, idle: Option<Duration>) -> Self {
        let lanes = socks
            .into_iter()
            .map(|s| Lane {
                s,
                head: [0; HEADER],
                got: 0,
                part: None,
                ready: VecDeque::new(),
                held: 0,
                last: None,
                ended: false,
            })
            .collect();
        StripeReader {
            lanes,
            next: 0,
            off: 0,
            idle,
            grace: ENDED_GRACE,
            spare: Vec::new(),
        }
    }

    /// How long the other connections may stay silent once one has ended
    /// (default [`ENDED_GRACE`]).
    pub fn set_grace(&mut self, grace: Duration) {
        self.grace = grace;
    }

    pub fn set_idle(&mut self, idle: Option<Duration>) {
        self.idle = idle;
    }

    fn held(&self) -> usize {
        self.lanes.iter().map(|l| l.held).sum()
    }

    /// The lane whose first ready chunk is due.
    fn due(&self) -> io::Result<Option<usize>> {
        let mut found = None;
        for (i, l) in self.lanes.iter().enumerate() {
            match l.ready.front() {
                Some((seq, _)) if *seq < self.next => {
                    return Err(bad(format!(
                        "connection {i}: chunk {seq} again (chunk {} is due)",
                        self.next
                    )))
                }
                Some((seq, _)) if *seq == self.next => {
                    if found.is_some() {
                        return Err(bad(format!("chunk {seq} on two connections")));
                    }
                    found = Some(i);
                }
                _ => {}
            }
        }
        Ok(found)
    }

    /// Whether lane `i` may be read now: it has not ended, and the queues
    /// have room, or it may bring the chunk that is due (it is receiving
    /// that chunk, or holds nothing and is between chunks).
    fn readable(&self, i: usize, room: bool) -> bool {
        let l = &self.lanes[i];
        let may_bring_due = match &l.part {
            Some(p) => p.0 == self.next,
            None => l.ready.is_empty(),
        };
        !l.ended && (room || may_bring_due)
    }

    /// Wait until one of `which` has bytes (or an error, or its end), at
    /// most the idle timeout.
    fn wait(&self, which: &[usize]) -> io::Result<Vec<bool>> {
        let ended = self.lanes.iter().position(|l| l.ended);
        let grace = ended.is_some() && self.idle.is_none_or(|d| d > self.grace);
        let limit = if grace { Some(self.grace) } else { self.idle };
        let ts = limit.map(|d| Timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: d.subsec_nanos().into(),
        });
        loop {
            let mut fds: Vec<PollFd> = which
                .iter()
                .map(|&i| PollFd::new(&self.lanes[i].s, PollFlags::IN))
                .collect();
            match poll(&mut fds, ts.as_ref()) {
                Ok(0) if grace => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "connection {} of the session ended and the others went silent",
                            ended.unwrap_or(0)
                        ),
                    ));
                }
                Ok(0) => {
                    let secs = self.idle.map_or(0, |d| d.as_secs_f64().ceil() as u64);
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the peer sent nothing, not even a keepalive, for {secs} s (--timeout)"
                        ),
                    ));
                }
                Ok(_) => return Ok(fds.iter().map(|f| !f.revents().is_empty()).collect()),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// One read from lane `i` (which poll found ready): header bytes, or
    /// data of the chunk it is receiving.
    fn pull(&mut self, i: usize) -> io::Result<()> {
        let spare = &mut self.spare;
        let l = &mut self.lanes[i];
        let r = match &mut l.part {
            None => l.s.read(&mut l.head[l.got..]),
            Some((_, filled, data)) => l.s.read(&mut data[*filled..]),
        };
        let n = match r {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            r => r?,
        };
        if n == 0 {
            if l.got > 0 || l.part.is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("connection {i} ended inside a chunk"),
                ));
            }
            l.ended = true;
            return Ok(());
        }
        if let Some((seq, filled, data)) = &mut l.part {
            *filled += n;
            if *filled == data.len() {
                let chunk = (*seq, std::mem::take(data));
                l.held += chunk.1.len();
                l.ready.push_back(chunk);
                l.part = None;
                l.got = 0;
            }
            return Ok(());
        }
        l.got += n;
        if l.got < HEADER {
            return Ok(());
        }
        let h = l.head;
        let seq = u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]);
        let len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
        if len == 0 || len > MAX_CHUNK {
            return Err(bad(format!("connection {i}: a chunk of {len} bytes")));
        }
        if seq < self.next || l.last.is_some_and(|p| seq <= p) {
            return Err(bad(format!(
                "connection {i}: chunk {seq} out of order (chunk {} is due)",
                self.next
            )));
        }
        l.last = Some(seq);
        let mut buf = spare.pop().unwrap_or_default();
        buf.resize(len, 0);
        l.part = Some((seq, 0, buf));
        Ok(())
    }
}

impl<S: Read + AsFd> Read for StripeReader<S> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            // Take in what is there already, without waiting.
            let room = self.held() < WINDOW;
            let live: Vec<usize> = (0..self.lanes.len())
                .filter(|&i| self.readable(i, room))
                .collect();
            if let Some(i) = self.due()? {
                if !live.is_empty() {
                    let saved = self.idle.take();
                    self.idle = Some(Duration::ZERO);
                    let ready = self.wait(&live);
                    self.idle = saved;
                    if let Ok(ready) = ready {
                        for (k, &j) in live.iter().enumerate() {
                            if ready[k] {
                                self.pull(j)?;
                            }
                        }
                    }
                }
                let l = &mut self.lanes[i];
                let Some((_, data)) = l.ready.front() else {
                    continue;
                };
                let n = (data.len() - self.off).min(out.len());
                out[..n].copy_from_slice(&data[self.off..self.off + n]);
                self.off += n;
                if self.off == data.len() {
                    if let Some((_, buf)) = l.ready.pop_front() {
                        l.held -= buf.len();
                        if self.spare.len() < SPARE {
                            self.spare.push(buf);
                        }
                    }
                    self.next += 1;
                    self.off = 0;
                }
                return Ok(n);
            }
            if live.is_empty() {
                // Nothing due and nothing more to read: the end if every
                // connection ended with nothing left, else a chunk that
                // will never come.
                let empty = self.lanes.iter().all(|l| l.ended && l.ready.is_empty());
                return match empty {
                    true => Ok(0),
                    false => Err(bad(format!(
                        "chunk {} never came: the connections hold later ones or ended",
                        self.next
                    ))),
                };
            }
            let ready = self.wait(&live)?;
            for (k, &i) in live.iter().enumerate() {
                if ready[k] {
                    self.pull(i)?;
                }
            }
        }
    }
}
