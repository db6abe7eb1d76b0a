//! The receiving half of a striped session: chunks back in order.

use std::io::{self, Read};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use super::{HEADER, MAX_CHUNK};

/// Where one connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Reading its next chunk header (`got` bytes of it so far).
    Header { got: usize },
    /// Its next chunk is `seq`, of `len` bytes, not read yet.
    Waiting { seq: u64, len: usize },
    /// Handing on the data of the chunk now due: `left` bytes to go.
    Data { left: usize },
    /// Ended (at a chunk boundary).
    Ended,
}

/// Reads a striped session's bytes in order; see the module docs. The
/// lanes are TCP connections (any pollable byte stream will do).
pub struct StripeReader<S = TcpStream> {
    socks: Vec<S>,
    lanes: Vec<Lane>,
    heads: Vec<[u8; HEADER]>,
    /// The chunk due next.
    next: u64,
    idle: Option<Duration>,
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl<S: Read + AsFd> StripeReader<S> {
    pub fn new(socks: Vec<S>, idle: Option<Duration>) -> Self {
        let n = socks.len();
        StripeReader {
            socks,
            lanes: vec![Lane::Header { got: 0 }; n],
            heads: vec![[0; HEADER]; n],
            next: 0,
            idle,
        }
    }

    pub fn set_idle(&mut self, idle: Option<Duration>) {
        self.idle = idle;
    }

    /// Wait until one of `which` has bytes (or an error, or its end), at
    /// most the idle timeout.
    fn wait(&self, which: &[usize]) -> io::Result<Vec<bool>> {
        let ts = self.idle.map(|d| Timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: d.subsec_nanos().into(),
        });
        loop {
            let mut fds: Vec<PollFd> = which
                .iter()
                .map(|&i| PollFd::new(&self.socks[i], PollFlags::IN))
                .collect();
            match poll(&mut fds, ts.as_ref()) {
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

    /// Read more of lane `i`'s chunk header.
    fn read_header(&mut self, i: usize, got: usize) -> io::Result<()> {
        let n = loop {
            match self.socks[i].read(&mut self.heads[i][got..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        if n == 0 {
            if got > 0 {
                return Err(bad(format!("connection {i} ended inside a chunk header")));
            }
            self.lanes[i] = Lane::Ended;
            return Ok(());
        }
        let got = got + n;
        if got < HEADER {
            self.lanes[i] = Lane::Header { got };
            return Ok(());
        }
        let h = self.heads[i];
        let seq = u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]);
        let len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
        if len == 0 || len > MAX_CHUNK {
            return Err(bad(format!("connection {i}: a chunk of {len} bytes")));
        }
        if seq < self.next {
            return Err(bad(format!(
                "connection {i}: chunk {seq} again (chunk {} is due)",
                self.next
            )));
        }
        self.lanes[i] = Lane::Waiting { seq, len };
        Ok(())
    }

    /// The lane whose chunk is due, its data now being handed on, and the
    /// bytes of it left.
    fn due(&mut self) -> io::Result<Option<(usize, usize)>> {
        let mut found = None;
        for (i, lane) in self.lanes.iter().enumerate() {
            match *lane {
                Lane::Data { left } => return Ok(Some((i, left))),
                Lane::Waiting { seq, .. } if seq < self.next => {
                    return Err(bad(format!(
                        "connection {i}: chunk {seq} again (chunk {} is due)",
                        self.next
                    )))
                }
                Lane::Waiting { seq, len } if seq == self.next => {
                    if found.is_some() {
                        return Err(bad(format!("chunk {seq} on two connections")));
                    }
                    found = Some((i, len));
                }
                _ => {}
            }
        }
        if let Some((i, len)) = found {
            self.lanes[i] = Lane::Data { left: len };
        }
        Ok(found)
    }
}

impl<S: Read + AsFd> Read for StripeReader<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if let Some((i, left)) = self.due()? {
                if self.idle.is_some() {
                    self.wait(&[i])?;
                }
                let want = left.min(buf.len());
                let n = match self.socks[i].read(&mut buf[..want]) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => r?,
                };
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("connection {i} ended inside chunk {}", self.next),
                    ));
                }
                self.lanes[i] = if n == left {
                    self.next += 1;
                    Lane::Header { got: 0 }
                } else {
                    Lane::Data { left: left - n }
                };
                return Ok(n);
            }
            let reading: Vec<(usize, usize)> = self
                .lanes
                .iter()
                .enumerate()
                .filter_map(|(i, l)| match *l {
                    Lane::Header { got } => Some((i, got)),
                    _ => None,
                })
                .collect();
            if reading.is_empty() {
                // Every connection either ended or waits for its turn, and
                // none holds the chunk that is due.
                return match self.lanes.iter().all(|l| *l == Lane::Ended) {
                    true => Ok(0),
                    false => Err(bad(format!(
                        "chunk {} never came: the connections hold later ones or ended",
                        self.next
                    ))),
                };
            }
            let idx: Vec<usize> = reading.iter().map(|&(i, _)| i).collect();
            let ready = self.wait(&idx)?;
            for (k, &(i, got)) in reading.iter().enumerate() {
                if ready[k] {
                    self.read_header(i, got)?;
                }
            }
        }
    }
}
