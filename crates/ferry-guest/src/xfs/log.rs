//! Is the internal log clean? XFS's only sign of a mounted (or crashed)
//! filesystem.
//!
//! The log is a ring of 512-byte basic blocks (BBs). Each log write stamps
//! the first word of every BB it writes with the pass number over the ring
//! (its cycle; a record header carries the magic there and its cycle in the
//! next word). The head, where the next write goes, is where the cycle
//! drops by one. A clean unmount writes a last record holding one
//! operation flagged UNMOUNT, ending exactly at the head. (A frozen
//! filesystem's log is covered but, with the kernels tested, has no such
//! record: a copy of it reads as in use, as xfs_repair also says.)
//!
//! What is checked, as xfs_repair's `xlog_is_dirty` does, but stricter:
//! 1. the cycles of the first and last BB: equal (the head is at the end of
//!    the ring) or the last one lower by one (binary search for the head);
//!    anything else is not clean;
//! 2. the BBs within the most that can be in flight (8 records of 256 KiB)
//!    on either side of the head have the cycles a finished log has (no
//!    hole left by writes that completed out of order);
//! 3. the last record header before the head: this filesystem's UUID, one
//!    operation, flagged UNMOUNT, ending exactly at the head, and its CRC
//!    correct when it has one (mkfs writes its unmount record without: XFS
//!    takes a zero CRC as none, even on v5).
//!
//! A log never written (all cycles zero, as XFS also takes for clean) is
//! clean. Everything else, including a log this module cannot make sense
//! of, reads as "not clean": the caller then asks for `--force`.

use super::sb::Sb;
use super::{be32, be64, byte, read_at, uuid_at};
use crate::error::FsError;
use crate::ReadAt;

const BB: u64 = 512;
const HEADER_MAGIC: u32 = 0xfeed_babe;
const UNMOUNT_TRANS: u8 = 0x20;
const VERSION_2: u32 = 2;
const HEADER_CYCLE_SIZE: u32 = 32 * 1024;
const MAX_RECORD: u32 = 256 * 1024;
/// Log record header fields.
const H_CRC: usize = 32;
/// sizeof(struct xlog_rec_header): 324 bytes of fields, padded to 328 where
/// 64-bit fields are 8-byte aligned (not on i386). The CRC covers that
/// size, so either is accepted.
const HEADER_SIZES: [usize; 2] = [328, 324];
const EXT_HEADER_SIZE: usize = 260;

/// `None` when the log is clean; otherwise why it is not, or cannot be
/// known: an external log lives on another device, so whether it holds
/// changes the free-space trees do not have yet cannot be told from here.
pub(super) fn state(r: &dyn ReadAt, sb: &Sb) -> Result<Option<String>, FsError> {
    let Some((agno, agbno)) = sb.internal_log() else {
        return Ok(Some(
            "its log is on another device, so whether it needs recovery cannot be checked".into(),
        ));
    };
    let Some(base) = sb.byte_of(agno, agbno) else {
        return Ok(Some("its log is out of range".into()));
    };
    let log = Log {
        r,
        base,
        n: u64::from(sb.logblocks) << (sb.blocklog - 9),
        sb,
    };
    match log.find_clean() {
        Ok(()) => Ok(None),
        Err(NotClean::Io(e @ FsError::Io(_))) => Err(e),
        Err(NotClean::Io(e)) => Ok(Some(format!("its log is unreadable ({e})"))),
        Err(NotClean::Why(why)) => Ok(Some(format!(
            "its log is not clean ({why}): mounted, or it needs recovery"
        ))),
    }
}

struct Log<'a> {
    r: &'a dyn ReadAt,
    base: u64,
    /// BBs in the log.
    n: u64,
    sb: &'a Sb,
}

/// Why a log is not known clean, or a read error.
enum NotClean {
    Why(String),
    Io(FsError),
}

impl From<FsError> for NotClean {
    fn from(e: FsError) -> Self {
        NotClean::Io(e)
    }
}

impl<'a> Log<'a> {
    fn bytes(&self, bb: u64, len: usize) -> Result<Vec<u8>, FsError> {
        read_at(self.r, self.base + (bb % self.n) * BB, len)
    }

    /// The cycle a BB was written in.
    fn cycle(&self, bb: u64) -> Result<u32, FsError> {
        let b = self.bytes(bb, 8)?;
        Ok(if be32(&b, 0) == HEADER_MAGIC {
            be32(&b, 4)
        } else {
            be32(&b, 0)
        })
    }

    /// The most BBs in flight at once: 8 records of the largest size.
    fn in_flight(&self) -> u64 {
        let rec = if self.sb.logv2 { MAX_RECORD } else { 32 * 1024 };
        (8 * u64::from(rec) / BB).min(self.n)
    }

    fn find_clean(&self) -> Result<(), NotClean> {
        let why = |s: &str| NotClean::Why(s.to_string());
        if self.n < 2 {
            return Err(why("no room for records"));
        }
        let first = self.cycle(0)?;
        let last = self.cycle(self.n - 1)?;
        // The head, and the cycle of the BBs just before it.
        let (head, cur) = if first == last {
            (self.n, first)
        } else if last.wrapping_add(1) == first {
            let (mut lo, mut hi) = (0, self.n - 1);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if self.cycle(mid)? == last {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            (hi, first)
        } else {
            return Err(NotClean::Why(format!(
                "cycles {first} at its start and {last} at its end"
            )));
        };
        let expect = |bb: u64| if bb < head { cur } else { cur.wrapping_sub(1) };
        self.check_cycles(head, expect)?;
        if cur == 0 {
            // Never written: nothing to recover.
            return Ok(());
        }
        self.check_unmount_record(head, expect)
    }

    /// The BBs around the head, as far as writes can be in flight, are those
    /// of a log whose writes all finished.
    fn check_cycles(&self, head: u64, expect: impl Fn(u64) -> u32) -> Result<(), NotClean> {
        let w = self.in_flight();
        let (from, count) = if 2 * w >= self.n {
            (0, self.n)
        } else {
            ((head + self.n - w) % self.n, 2 * w)
        };
        const CHUNK: u64 = 128;
        let mut done = 0;
        while done < count {
            let k = CHUNK.min(count - done);
            let start = (from + done) % self.n;
            let k = k.min(self.n - start); // do not read past the ring's end
            let b = self.bytes(start, (k * BB) as usize)?;
            for j in 0..k {
                let o = (j * BB) as usize;
                let c = if be32(&b, o) == HEADER_MAGIC {
                    be32(&b, o + 4)
                } else {
                    be32(&b, o)
                };
                if c != expect(start + j) {
                    return Err(NotClean::Why(format!(
                        "block {} of cycle {c} next to the head at {head}",
                        start + j
                    )));
                }
            }
            done += k;
        }
        Ok(())
    }

    fn check_unmount_record(&self, head: u64, expect: impl Fn(u64) -> u32) -> Result<(), NotClean> {
        let why = |s: String| NotClean::Why(s);
        // The last record header before the head: an unmount record is one
        // header (up to 8 BBs) and at most one padded record of data.
        let reach = (u64::from(MAX_RECORD) / BB + 8).min(self.n);
        let mut rhead = None;
        let mut back = 0;
        'scan: while back < reach {
            // The BBs [end - k, end) before those already scanned, in one
            // read that does not cross the ring's start.
            let end = match (head + self.n - back) % self.n {
                0 => self.n,
                e => e,
            };
            let k = (reach - back).min(64).min(end);
            let b = self.bytes(end - k, (k * BB) as usize)?;
            for j in (0..k).rev() {
                if be32(&b, (j * BB) as usize) == HEADER_MAGIC {
                    rhead = Some(end - k + j);
                    break 'scan;
                }
            }
            back += k;
        }
        let Some(rhead) = rhead else {
            return Err(why("no record before the head".into()));
        };
        let h = self.bytes(rhead, BB as usize)?;
        let cycle = be32(&h, 4);
        let version = be32(&h, 8);
        let len = be32(&h, 12);
        let lsn = be64(&h, 16);
        let num_logops = be32(&h, 40);
        let size = be32(&h, 320);
        if cycle != expect(rhead) || lsn != ((u64::from(cycle) << 32) | rhead) {
            return Err(why(format!("the record at {rhead} is stale")));
        }
        if version & !3 != 0 || len > MAX_RECORD || size > MAX_RECORD {
            return Err(why(format!("the record at {rhead} has a bad header")));
        }
        if uuid_at(&h, 304) != self.sb.uuid {
            return Err(why("the last record is another filesystem's".into()));
        }
        let hblks = if self.sb.logv2 && version & VERSION_2 != 0 && size > HEADER_CYCLE_SIZE {
            u64::from(size.div_ceil(HEADER_CYCLE_SIZE))
        } else {
            1
        };
        let data = (rhead + hblks) % self.n;
        let end = (data + u64::from(len).div_ceil(BB)) % self.n;
        if end != head % self.n || num_logops != 1 {
            return Err(why("the last record is not an unmount record".into()));
        }
        let payload = self.ring_bytes(data, len as usize)?;
        if byte(&payload, 9) & UNMOUNT_TRANS == 0 {
            return Err(why("the last record is not an unmount record".into()));
        }
        let stored = h
            .get(H_CRC..H_CRC + 4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
            .unwrap_or(0);
        if stored != 0 {
            let mut ext = Vec::new();
            for i in 1..u64::from(len.div_ceil(HEADER_CYCLE_SIZE)).min(hblks) {
                let x = self.bytes((rhead + i) % self.n, EXT_HEADER_SIZE)?;
                ext.extend_from_slice(&x);
            }
            let ok = HEADER_SIZES.iter().any(|&hs| {
                let mut hdr = h.get(..hs).unwrap_or(&[]).to_vec();
                if let Some(c) = hdr.get_mut(H_CRC..H_CRC + 4) {
                    c.fill(0);
                }
                let mut crc = crate::crc32c_raw(!0, &hdr);
                crc = crate::crc32c_raw(crc, &ext);
                crc = crate::crc32c_raw(crc, &payload);
                !crc == stored
            });
            if !ok {
                return Err(why("the unmount record's CRC does not match".into()));
            }
        }
        Ok(())
    }

    /// `len` bytes from BB `bb`, wrapping at the end of the ring.
    fn ring_bytes(&self, bb: u64, len: usize) -> Result<Vec<u8>, FsError> {
        let bb = bb % self.n;
        if len as u64 > self.n * BB {
            return Err(super::corrupt("log record larger than the log"));
        }
        let room = ((self.n - bb) * BB) as usize;
        if len <= room {
            return self.bytes(bb, len);
        }
        let mut v = self.bytes(bb, room)?;
        v.extend_from_slice(&self.bytes(0, len - room)?);
        Ok(v)
    }
}
