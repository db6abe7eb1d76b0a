//! The idle timeout of an established link: a reader that fails with
//! `TimedOut` when the peer has sent no byte (not even a keepalive) for
//! the set time. Only the time spent waiting for the peer counts: time the
//! caller spends elsewhere (a full ring, a slow consumer) does not.

use std::io::{self, Read};
use std::os::fd::AsFd;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};

/// A byte source that waits at most `idle` for each read (`None`: for
/// ever). Works on sockets and pipes alike (ssh's stdout). The source must
/// not buffer on its own (a `File`, `TcpStream`, `ChildStdout`, not
/// `Stdin`): bytes held in a user-space buffer are invisible to `poll`.
pub struct IdleRead<R> {
    inner: R,
    idle: Option<Duration>,
}

impl<R: Read + AsFd> IdleRead<R> {
    pub fn new(inner: R, idle: Option<Duration>) -> Self {
        IdleRead { inner, idle }
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Change the wait (say, from the handshake's to the stream's).
    pub fn set_idle(&mut self, idle: Option<Duration>) {
        self.idle = idle;
    }

    /// Wait until the source is readable (or has ended or failed); a
    /// `TimedOut` error after `idle` without either.
    fn wait(&self, idle: Duration) -> io::Result<()> {
        let ts = Timespec {
            tv_sec: idle.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: idle.subsec_nanos().into(),
        };
        loop {
            let mut fds = [PollFd::new(&self.inner, PollFlags::IN)];
            match poll(&mut fds, Some(&ts)) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the peer sent nothing, not even a keepalive, for {} s (--timeout)",
                            idle.as_secs_f64().ceil() as u64
                        ),
                    ))
                }
                Ok(_) => return Ok(()),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl<R: Read + AsFd> Read for IdleRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(idle) = self.idle.filter(|_| !buf.is_empty()) {
            self.wait(idle)?;
        }
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    #[test]
    fn silence_times_out_and_bytes_do_not() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut r = IdleRead::new(b, Some(Duration::from_millis(100)));
        let mut buf = [0u8; 4];
        a.write_all(b"ab").unwrap();
        assert_eq!(r.read(&mut buf).unwrap(), 2);
        let t = Instant::now();
        let e = r.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(100));
        // Time spent away from the reader does not count.
        std::thread::sleep(Duration::from_millis(150));
        a.write_all(b"c").unwrap();
        assert_eq!(r.read(&mut buf).unwrap(), 1);
        drop(a);
        assert_eq!(
            r.read(&mut buf).unwrap(),
            0,
            "end of input is not a timeout"
        );
    }

    #[test]
    fn no_timeout_waits() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut r = IdleRead::new(b, None);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            a.write_all(b"x").unwrap();
        });
        let mut buf = [0u8; 1];
        assert_eq!(r.read(&mut buf).unwrap(), 1);
        t.join().unwrap();
    }
}
