//! The request pipeline: the `submit_*` methods of [`Connection`] check a
//! request against the export, wait for room (at most `max_in_flight`),
//! register it under a fresh cookie, and send header and payload.

use std::io::{self, Write};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};

use super::connection::Connection;
use super::lock;
use super::socket::write_all_vectored;
use super::state::{Dead, Pending, PendingKind};
use super::ticket::{Slot, Ticket};
use crate::error::{Error, Result};
use crate::proto::*;

impl Connection {
    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.info.size => Ok(()),
            _ => Err(Error::OutOfRange {
                offset,
                len,
                size: self.info.size,
            }),
        }
    }

    /// A READ or WRITE carries 1 to `max_payload` bytes.
    fn check_payload(&self, cmd: &str, len: u64) -> Result<()> {
        if len == 0 || len > u64::from(self.info.max_payload()) {
            return Err(Error::InvalidArgument(format!(
                "{cmd} length {len} must be in 1..={}",
                self.info.max_payload()
            )));
        }
        Ok(())
    }

    /// What changes the export needs a writable one, and the range in it.
    fn check_writable(&self, offset: u64, len: u64) -> Result<()> {
        if self.info.read_only() {
            return Err(Error::Unsupported("export is read-only".into()));
        }
        self.check_range(offset, len)
    }

    fn submit(
        &self,
        flags: u16,
        cmd: u16,
        offset: u64,
        len: u32,
        kind: PendingKind,
        payload: Option<&[u8]>,
    ) -> Result<Ticket> {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let req = RequestInfo { cmd, offset, len };
        let slot = Arc::new(Slot {
            result: Mutex::new(None),
            cv: Condvar::new(),
        });
        {
            let mut st = lock(&self.shared.state);
            loop {
                if let Some(d) = &st.dead {
                    return Err(d.to_error());
                }
                if self.shared.server_shutdown.load(Ordering::SeqCst) {
                    return Err(Error::ConnectionLost(
                        "the server is shutting down (it answered ESHUTDOWN)".into(),
                    ));
                }
                if st.in_flight < self.shared.max_in_flight {
                    break;
                }
                st = self
                    .shared
                    .space
                    .wait(st)
                    .unwrap_or_else(|p| p.into_inner());
            }
            st.in_flight += 1;
            st.pending.insert(
                cookie,
                Pending {
                    req,
                    kind,
                    error: None,
                    slot: slot.clone(),
                },
            );
        }
        let hdr = encode_request(flags, cmd, cookie, offset, len);
        let res = {
            let mut w = lock(&self.writer);
            match payload {
                None => w.write_all(&hdr),
                Some(p) => write_all_vectored(&mut w, &hdr, p),
            }
        };
        if let Err(e) = res {
            let why =
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut {
                    Dead::Timeout(self.opts.io_timeout.as_secs())
                } else {
                    Dead::Io(format!("sending {} request: {e}", cmd_name(cmd)))
                };
            self.shared.fail(why);
        }
        Ok(Ticket { slot })
    }

    /// Submits a READ of `buf.len()` bytes at `offset`; the reply hands the
    /// filled buffer back ([`Reply::Data`](super::Reply::Data)).
    pub fn submit_read(&self, offset: u64, buf: Vec<u8>) -> Result<Ticket> {
        let len = buf.len() as u64;
        self.check_payload("READ", len)?;
        self.check_range(offset, len)?;
        let req = RequestInfo {
            cmd: CMD_READ,
            offset,
            len: len as u32,
        };
        let cov = ReadCoverage::new(&req);
        self.submit(
            0,
            CMD_READ,
            offset,
            len as u32,
            PendingKind::Read { buf, cov },
            None,
        )
    }

    /// Submits a WRITE; the data is sent before this returns.
    pub fn submit_write(&self, offset: u64, data: &[u8], fua: bool) -> Result<Ticket> {
        let len = data.len() as u64;
        self.check_payload("WRITE", len)?;
        self.check_writable(offset, len)?;
        let flags = if fua && self.info.can_fua() {
            CMD_FLAG_FUA
        } else {
            0
        };
        self.submit(
            flags,
            CMD_WRITE,
            offset,
            len as u32,
            PendingKind::Other,
            Some(data),
        )
    }

    /// Submits WRITE_ZEROES. `fast` sets `NBD_CMD_FLAG_FAST_ZERO` (only if
    /// the server offers it). `NBD_CMD_FLAG_NO_HOLE` is never set, so the
    /// server may punch holes.
    pub fn submit_write_zeroes(&self, offset: u64, len: u32, fast: bool) -> Result<Ticket> {
        if !self.info.can_zero() {
            return Err(Error::Unsupported(
                "server does not support WRITE_ZEROES".into(),
            ));
        }
        self.check_writable(offset, len.into())?;
        let flags = if fast && self.info.can_fast_zero() {
            CMD_FLAG_FAST_ZERO
        } else {
            0
        };
        self.submit(
            flags,
            CMD_WRITE_ZEROES,
            offset,
            len,
            PendingKind::Other,
            None,
        )
    }

    /// Submits TRIM (contents afterwards are undefined; not a way to zero).
    pub fn submit_trim(&self, offset: u64, len: u32) -> Result<Ticket> {
        if !self.info.can_trim() {
            return Err(Error::Unsupported("server does not support TRIM".into()));
        }
        self.check_range(offset, len.into())?;
        self.submit(0, CMD_TRIM, offset, len, PendingKind::Other, None)
    }

    /// Submits FLUSH.
    pub fn submit_flush(&self) -> Result<Ticket> {
        if !self.info.can_flush() {
            return Err(Error::Unsupported("server does not support FLUSH".into()));
        }
        self.submit(0, CMD_FLUSH, 0, 0, PendingKind::Other, None)
    }

    /// Submits BLOCK_STATUS for `base:allocation`.
    pub fn submit_block_status(&self, offset: u64, len: u32) -> Result<Ticket> {
        if self.info.base_allocation.is_none() {
            return Err(Error::Unsupported(
                "base:allocation was not negotiated".into(),
            ));
        }
        if len == 0 {
            return Err(Error::InvalidArgument("BLOCK_STATUS of length 0".into()));
        }
        self.check_range(offset, len.into())?;
        self.submit(
            0,
            CMD_BLOCK_STATUS,
            offset,
            len,
            PendingKind::BlockStatus { extents: None },
            None,
        )
    }
}
