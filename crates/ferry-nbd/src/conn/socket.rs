//! The transport under a connection: a TCP or unix stream behind one type,
//! how to open it from a URI, and a vectored write of header plus payload.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::uri::{Endpoint, NbdUri};

pub(super) enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    pub(super) fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
        })
    }
    pub(super) fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_read_timeout(d),
            Sock::Unix(s) => s.set_read_timeout(d),
        }
    }
    pub(super) fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_write_timeout(d),
            Sock::Unix(s) => s.set_write_timeout(d),
        }
    }
    pub(super) fn shutdown(&self) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(Shutdown::Both),
            Sock::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(b),
            Sock::Unix(s) => s.read(b),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(b),
            Sock::Unix(s) => s.write(b),
        }
    }
    fn write_vectored(&mut self, b: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write_vectored(b),
            Sock::Unix(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

pub(super) fn open_socket(uri: &NbdUri, timeout: Duration) -> Result<Sock> {
    match &uri.endpoint {
        Endpoint::Unix { path } => {
            let s = UnixStream::connect(path).map_err(|e| Error::Connect {
                target: format!("unix socket {}", path.display()),
                source: e,
            })?;
            Ok(Sock::Unix(s))
        }
        Endpoint::Tcp { host, port } => {
            let target = format!("{host}:{port}");
            let addrs = (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(|e| Error::Connect {
                    target: target.clone(),
                    source: e,
                })?;
            let mut last = io::Error::new(io::ErrorKind::NotFound, "host resolved to no address");
            for a in addrs {
                match TcpStream::connect_timeout(&a, timeout) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(Sock::Tcp(s));
                    }
                    Err(e) => last = e,
                }
            }
            Err(Error::Connect {
                target,
                source: last,
            })
        }
    }
}

pub(super) fn write_all_vectored(w: &mut Sock, hdr: &[u8], data: &[u8]) -> io::Result<()> {
    let mut hoff = 0usize;
    let mut doff = 0usize;
    while hoff < hdr.len() || doff < data.len() {
        let bufs = [
            io::IoSlice::new(&hdr[hoff..]),
            io::IoSlice::new(&data[doff..]),
        ];
        let n = match w.write_vectored(&bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let h = n.min(hdr.len() - hoff);
        hoff += h;
        doff += n - h;
    }
    Ok(())
}
