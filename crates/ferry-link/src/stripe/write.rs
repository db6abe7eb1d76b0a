//! The sending half of a striped session: chunks onto whichever
//! connection can take them.

use std::io::{self, IoSlice, Write};
use std::net::TcpStream;

use rustix::event::{poll, PollFd, PollFlags};

use super::{CHUNK, HEADER};

/// Writes the bytes given to it as chunks (at most [`CHUNK`] each) over
/// its connections; see the module docs for the format.
pub struct StripeWriter {
    socks: Vec<TcpStream>,
    seq: u64,
    /// Where the round robin looks first.
    turn: usize,
}

impl StripeWriter {
    pub fn new(socks: Vec<TcpStream>) -> Self {
        StripeWriter {
            socks,
            seq: 0,
            turn: 0,
        }
    }

    /// The next connection that can take a chunk: the first writable one
    /// from `turn` on, waiting for one if none is.
    fn pick(&mut self) -> io::Result<usize> {
        let n = self.socks.len();
        let mut timeout = Some(&rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        });
        loop {
            let mut fds: Vec<PollFd> = self
                .socks
                .iter()
                .map(|s| PollFd::new(s, PollFlags::OUT))
                .collect();
            match poll(&mut fds, timeout) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let ready = |i: usize| {
                let r = fds[i].revents();
                !(r & (PollFlags::OUT | PollFlags::ERR | PollFlags::HUP)).is_empty()
            };
            if let Some(i) = (0..n).map(|k| (self.turn + k) % n).find(|&i| ready(i)) {
                return Ok(i);
            }
            // None can take a chunk now: wait until one can.
            timeout = None;
        }
    }
}

/// Write the header and the data, resuming after short writes.
fn write_chunk(s: &mut TcpStream, head: &[u8; HEADER], data: &[u8]) -> io::Result<()> {
    let total = HEADER + data.len();
    let mut done = 0;
    while done < total {
        let res = if done < HEADER {
            s.write_vectored(&[IoSlice::new(&head[done..]), IoSlice::new(data)])
        } else {
            s.write(&data[done - HEADER..])
        };
        match res {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => done += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Write for StripeWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let data = &buf[..buf.len().min(CHUNK)];
        let i = self.pick()?;
        let mut head = [0u8; HEADER];
        head[..8].copy_from_slice(&self.seq.to_be_bytes());
        head[8..].copy_from_slice(&(data.len() as u32).to_be_bytes());
        write_chunk(&mut self.socks[i], &head, data)?;
        self.seq += 1;
        self.turn = (i + 1) % self.socks.len();
        Ok(data.len())
    }

    /// Every chunk is in the kernel's hands once `write` returns.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
