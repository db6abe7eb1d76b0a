//! The high-level client the engine uses.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::conn::{ConnectOptions, Connection, ExportInfo, Reply, Ticket};
use crate::error::{Error, Result};
use crate::proto::{ENOTSUP, STATE_HOLE, STATE_ZERO};
use crate::uri::NbdUri;

/// A run of the export with uniform allocation status (`base:allocation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    /// `NBD_STATE_HOLE`: not allocated on the server.
    pub hole: bool,
    /// `NBD_STATE_ZERO`: reads as zeroes.
    pub zero: bool,
}

impl Extent {
    /// True if the extent need not be read: the server says it reads as
    /// zeroes (`NBD_STATE_ZERO`). A hole without that flag is read: the
    /// spec promises nothing of its contents (a trimmed range may read
    /// back as anything), and a copy must have what a read returns.
    pub fn skippable(&self) -> bool {
        self.zero
    }
}

/// Default size of READ/WRITE requests used by the helpers (1 MiB).
pub const DEFAULT_REQUEST_SIZE: usize = 1 << 20;
/// Most extents [`Client::extents`] returns at once (6 MiB of them): a
/// server may describe a range in pieces of one byte, and what it sends
/// must not decide how much this side keeps.
pub const MAX_EXTENTS: usize = 1 << 18;
/// Most BLOCK_STATUS round trips one [`Client::extents`] makes: a server
/// may answer each for one byte (merged into the extent before, so that
/// [`MAX_EXTENTS`] never stops it).
pub const MAX_QUERIES: usize = 4096;
/// Largest WRITE_ZEROES / BLOCK_STATUS request length used by the helpers.
const MAX_RANGE_REQUEST: u64 = 1 << 30;

/// An NBD client: one connection plus the URI to open more. Cheap to clone;
/// clones share the connection, which is safe to use from many threads.
#[derive(Clone)]
pub struct Client {
    conn: Arc<Connection>,
    uri: NbdUri,
    opts: ConnectOptions,
    fast_zero_broken: Arc<AtomicBool>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("uri", &self.uri.to_string())
            .field("info", self.conn.info())
            .finish()
    }
}

impl Client {
    /// Connects to an `nbd://` or `nbd+unix://` URI with default options.
    pub fn connect(uri: &str) -> Result<Client> {
        Self::connect_with(uri, ConnectOptions::default())
    }

    /// Connects with explicit options.
    pub fn connect_with(uri: &str, opts: ConnectOptions) -> Result<Client> {
        let uri = NbdUri::parse(uri)?;
        Self::connect_uri(&uri, opts)
    }

    /// Connects to a parsed URI.
    pub fn connect_uri(uri: &NbdUri, opts: ConnectOptions) -> Result<Client> {
        let conn = Connection::connect(uri, &opts)?;
        Ok(Client {
            conn: Arc::new(conn),
            uri: uri.clone(),
            opts,
            fast_zero_broken: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Opens one more, independent connection to the same export.
    pub fn reconnect(&self) -> Result<Client> {
        Self::connect_uri(&self.uri, self.opts.clone())
    }

    /// `n` clients for parallel use: up to `n` connections when the server
    /// sets `NBD_FLAG_CAN_MULTI_CONN` and answers them (see
    /// [`crate::Pool`]), the rest handles sharing those connections (still
    /// many requests in flight).
    pub fn connections(&self, n: usize) -> Result<Vec<Client>> {
        let n = n.max(1);
        let pool = crate::pool::Pool::grow(self.clone(), n, std::time::Duration::ZERO);
        let distinct = pool.clients().to_vec();
        Ok((0..n)
            .map(|i| distinct[i % distinct.len()].clone())
            .collect())
    }

    /// Opens `n` connections to `uri` if the server allows multi-conn (else one).
    pub fn connect_multi(uri: &str, n: usize, opts: ConnectOptions) -> Result<Vec<Client>> {
        let first = Self::connect_with(uri, opts)?;
        Ok(crate::pool::Pool::grow(first, n, std::time::Duration::ZERO)
            .clients()
            .to_vec())
    }

    /// The options this client connected with.
    pub fn options(&self) -> &ConnectOptions {
        &self.opts
    }

    /// The underlying connection (for the submit/wait API).
    pub fn connection(&self) -> &Arc<Connection> {
        &self.conn
    }

    /// The URI this client connected to.
    pub fn uri(&self) -> &NbdUri {
        &self.uri
    }

    /// What the handshake established.
    pub fn info(&self) -> &ExportInfo {
        self.conn.info()
    }

    pub fn size(&self) -> u64 {
        self.info().size
    }
    pub fn export_name(&self) -> &str {
        &self.info().export
    }
    pub fn read_only(&self) -> bool {
        self.info().read_only()
    }
    pub fn can_multi_conn(&self) -> bool {
        self.info().can_multi_conn()
    }
    pub fn can_trim(&self) -> bool {
        self.info().can_trim()
    }
    pub fn can_zero(&self) -> bool {
        self.info().can_zero()
    }
    pub fn can_fast_zero(&self) -> bool {
        self.info().can_fast_zero()
    }
    pub fn can_flush(&self) -> bool {
        self.info().can_flush()
    }
    pub fn can_fua(&self) -> bool {
        self.info().can_fua()
    }
    pub fn has_block_status(&self) -> bool {
        self.info().has_block_status()
    }

    /// Request size the helpers use (bounded by the server's max payload).
    pub fn request_size(&self, wanted: usize) -> usize {
        wanted.min(self.info().max_payload() as usize).max(1)
    }

    pub(crate) fn pipeline_depth(&self) -> usize {
        self.opts.max_in_flight.clamp(1, 64)
    }

    /// Allocation extents from `offset`, merged, contiguous and clipped to
    /// `[offset, offset+len)`. They cover all of it, unless the server
    /// describes it in more than [`MAX_EXTENTS`] pieces or more than
    /// [`MAX_QUERIES`] replies: then they cover a prefix (at least one
    /// extent), and the caller asks again from where they end. Without
    /// `base:allocation` the whole range is one data extent.
    pub fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.extents_upto(offset, len, MAX_EXTENTS)
    }

    /// [`Client::extents`], keeping at most `max` (at least one).
    pub(crate) fn extents_upto(&self, offset: u64, len: u64, max: usize) -> Result<Vec<Extent>> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.size())
            .ok_or(Error::OutOfRange {
                offset,
                len,
                size: self.size(),
            })?;
        let mut out: Vec<Extent> = Vec::new();
        if len == 0 {
            return Ok(out);
        }
        if !self.has_block_status() {
            out.push(Extent {
                offset,
                len,
                hole: false,
                zero: false,
            });
            return Ok(out);
        }
        let (mut pos, max) = (offset, max.max(1));
        for _ in 0..MAX_QUERIES {
            if pos >= end || out.len() >= max {
                break;
            }
            let ask = (end - pos).min(MAX_RANGE_REQUEST) as u32;
            let descs = wait_extents(self.conn.submit_block_status(pos, ask)?)?;
            let before = pos;
            pos = append_descriptors(&mut out, pos, end, &descs, max);
            if pos == before {
                return Err(Error::Protocol(crate::proto::ProtoError::Malformed(
                    "BLOCK_STATUS made no progress".into(),
                )));
            }
        }
        Ok(out)
    }

    /// Reads `buf.len()` bytes at `offset` (split and pipelined).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        crate::pool::read_spread(std::slice::from_ref(self), 0, offset, buf)
    }

    /// Writes `data` at `offset` (split and pipelined).
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        crate::pool::write_spread(std::slice::from_ref(self), 0, offset, data)
    }

    /// Makes `[offset, offset+len)` read as zeroes without sending data when
    /// possible: WRITE_ZEROES with `FAST_ZERO` when offered (falling back to
    /// plain WRITE_ZEROES on `ENOTSUP`), plain WRITE_ZEROES otherwise, and
    /// zero-filled WRITEs if the server has no WRITE_ZEROES at all.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        let mut queue = VecDeque::new();
        let depth = self.pipeline_depth();
        self.zero_range_pipelined(offset, len, &mut queue, depth)?;
        while let Some(z) = queue.pop_front() {
            self.finish_zero(z)?;
        }
        Ok(())
    }

    /// Submits zeroing of a range into `queue`, draining it to `depth`.
    pub(crate) fn zero_range_pipelined(
        &self,
        offset: u64,
        len: u64,
        queue: &mut VecDeque<PendingZero>,
        depth: usize,
    ) -> Result<()> {
        let end = offset.checked_add(len).ok_or(Error::OutOfRange {
            offset,
            len,
            size: self.size(),
        })?;
        let mut pos = offset;
        while pos < end {
            while queue.len() >= depth.max(1) {
                if let Some(z) = queue.pop_front() {
                    self.finish_zero(z)?;
                }
            }
            let z = self.submit_zero_chunk(pos, end - pos)?;
            pos += z.len;
            queue.push_back(z);
        }
        Ok(())
    }

    /// Submits one zeroing request for a prefix of `[offset, offset+len)`
    /// (`len` > 0); the returned request says how much it covers.
    pub(crate) fn submit_zero_chunk(&self, offset: u64, len: u64) -> Result<PendingZero> {
        if self.can_zero() {
            let n = len.min(MAX_RANGE_REQUEST);
            let fast = self.can_fast_zero() && !self.fast_zero_broken.load(Ordering::Relaxed);
            let t = self.conn.submit_write_zeroes(offset, n as u32, fast)?;
            Ok(PendingZero {
                offset,
                len: n,
                fast,
                ticket: t,
            })
        } else {
            let n = len.min(self.request_size(DEFAULT_REQUEST_SIZE) as u64);
            let t = self
                .conn
                .submit_write(offset, &zero_buf()[..n as usize], false)?;
            Ok(PendingZero {
                offset,
                len: n,
                fast: false,
                ticket: t,
            })
        }
    }

    /// Waits for a zeroing request; retries without FAST_ZERO on ENOTSUP.
    pub(crate) fn finish_zero(&self, z: PendingZero) -> Result<()> {
        match z.ticket.wait() {
            Ok(_) => Ok(()),
            Err(e) if z.fast && e.server_errno() == Some(ENOTSUP) => {
                self.fast_zero_broken.store(true, Ordering::Relaxed);
                wait_done(
                    self.conn
                        .submit_write_zeroes(z.offset, z.len as u32, false)?,
                )
            }
            Err(e) => Err(e),
        }
    }

    /// TRIM (a hint; contents afterwards are undefined).
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        let end = offset.saturating_add(len);
        let mut pos = offset;
        while pos < end {
            let n = (end - pos).min(MAX_RANGE_REQUEST);
            wait_done(self.conn.submit_trim(pos, n as u32)?)?;
            pos += n;
        }
        Ok(())
    }

    /// FLUSH (a no-op success when the server has no flush).
    pub fn flush(&self) -> Result<()> {
        if !self.can_flush() {
            return Ok(());
        }
        wait_done(self.conn.submit_flush()?)
    }

    /// Sends NBD_CMD_DISC and closes this client's connection (affects clones).
    pub fn disconnect(&self) {
        self.conn.disconnect();
    }
}

/// A zeroing request in flight.
pub(crate) struct PendingZero {
    offset: u64,
    pub(crate) len: u64,
    fast: bool,
    ticket: Ticket,
}

/// Appends `base:allocation` descriptors starting at `pos`, clipped to `end`,
/// while `out` holds fewer than `max`; returns the new position.
pub(crate) fn append_descriptors(
    out: &mut Vec<Extent>,
    mut pos: u64,
    end: u64,
    descs: &[(u32, u32)],
    max: usize,
) -> u64 {
    for &(l, flags) in descs {
        if pos >= end || out.len() >= max {
            break;
        }
        let l = u64::from(l).min(end - pos);
        push_merged(
            out,
            Extent {
                offset: pos,
                len: l,
                hole: flags & STATE_HOLE != 0,
                zero: flags & STATE_ZERO != 0,
            },
        );
        pos += l;
    }
    pos
}

fn push_merged(out: &mut Vec<Extent>, e: Extent) {
    if let Some(last) = out.last_mut() {
        if last.hole == e.hole && last.zero == e.zero && last.offset + last.len == e.offset {
            last.len += e.len;
            return;
        }
    }
    out.push(e);
}

fn unexpected(cmd: &str, r: &Reply) -> Error {
    Error::Protocol(crate::proto::ProtoError::Malformed(format!(
        "unexpected reply {r:?} to {cmd}"
    )))
}

pub(crate) fn wait_done(t: Ticket) -> Result<()> {
    t.wait().map(|_| ())
}

/// The bytes a READ's ticket brings.
pub(crate) fn wait_data(t: Ticket) -> Result<Vec<u8>> {
    match t.wait()? {
        Reply::Data(d) => Ok(d),
        other => Err(unexpected("READ", &other)),
    }
}

/// A READ's data, into `out`, which it must fill exactly.
pub(crate) fn wait_into(t: Ticket, out: &mut [u8]) -> Result<()> {
    let d = wait_data(t)?;
    if d.len() != out.len() {
        return Err(Error::Protocol(crate::proto::ProtoError::Malformed(
            format!("READ of {} bytes answered with {}", out.len(), d.len()),
        )));
    }
    out.copy_from_slice(&d);
    crate::spare::give_back(d);
    Ok(())
}

/// The `(length, flags)` descriptors a BLOCK_STATUS's ticket brings.
pub(crate) fn wait_extents(t: Ticket) -> Result<Vec<(u32, u32)>> {
    match t.wait()? {
        Reply::Extents(d) => Ok(d),
        other => Err(unexpected("BLOCK_STATUS", &other)),
    }
}

/// A shared buffer of zeroes, as large as the largest request.
pub(crate) fn zero_buf() -> &'static [u8] {
    static Z: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    Z.get_or_init(|| vec![0u8; crate::proto::MAX_PAYLOAD as usize])
}
