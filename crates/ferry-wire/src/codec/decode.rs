//! The decoder of a frame body into a [`Message`]: bounded by the field
//! limits before anything is allocated, never panicking, refusing trailing
//! bytes.

use super::*;

struct In<'a> {
    b: &'a [u8],
}

impl<'a> In<'a> {
    fn u8(&mut self) -> Result<u8, DecodeError> {
        let (&v, rest) = self.b.split_first().ok_or(DecodeError::Truncated)?;
        self.b = rest;
        Ok(v)
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.b.len() {
            return Err(DecodeError::Truncated);
        }
        let (a, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(a)
    }
    fn var(&mut self) -> Result<u64, DecodeError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let byte = self.u8()?;
            let part = (byte & 0x7f) as u64;
            if i == 9 && part > 1 {
                return Err(DecodeError::BadValue("varint"));
            }
            v |= part << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::BadValue("varint"))
    }
    fn var32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        u32::try_from(self.var()?).map_err(|_| DecodeError::BadValue(what))
    }
    fn svar(&mut self) -> Result<i64, DecodeError> {
        let v = self.var()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }
    fn bytes(&mut self, limit: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.var()?;
        if n > limit as u64 {
            return Err(DecodeError::TooLong(what));
        }
        self.take(n as usize)
    }
    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let b = self.bytes(MAX_STR, what)?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn count(
        &mut self,
        limit: usize,
        per_item: usize,
        what: &'static str,
    ) -> Result<usize, DecodeError> {
        let n = self.var()?;
        // Each item takes at least `per_item` bytes, so a count larger than
        // what remains is a lie: refuse before allocating for it.
        if n > limit as u64 || n.saturating_mul(per_item as u64) > self.b.len() as u64 {
            return Err(DecodeError::TooLong(what));
        }
        Ok(n as usize)
    }
}

/// Decode one frame body. Never panics; allocates at most about the size of
/// `body`.
pub fn decode(body: &[u8]) -> Result<Message, DecodeError> {
    if body.len() > MAX_FRAME {
        return Err(DecodeError::TooLong("frame"));
    }
    let mut i = In { b: body };
    let m = match i.u8()? {
        tag::HELLO => Message::Hello {
            version: i.var32("version")?,
            features: i.var()?,
        },
        tag::ENTRY => entry(&mut i)?,
        tag::END_OF_LIST => Message::EndOfList,
        tag::DECIDED => Message::Decided {
            below: i.var32("below")?,
        },
        tag::WANT => Message::Want {
            file: i.var32("file")?,
            mode: match i.u8()? {
                0 => WantMode::Whole,
                1 => WantMode::Delta,
                2 => WantMode::DeltaInPlace,
                3 => WantMode::Resume,
                4 => WantMode::Check,
                _ => return Err(DecodeError::BadValue("want mode")),
            },
        },
        tag::SIGNATURE => signature(&mut i)?,
        tag::HAVE => have(&mut i)?,
        tag::DATA => {
            let file = i.var32("file")?;
            let offset = i.var()?;
            let data = i.bytes(MAX_DATA, "data")?.to_vec();
            if offset.checked_add(data.len() as u64).is_none() {
                return Err(DecodeError::BadValue("offset"));
            }
            Message::Data { file, offset, data }
        }
        tag::ZERO => {
            let file = i.var32("file")?;
            let offset = i.var()?;
            let len = i.var()?;
            if offset.checked_add(len).is_none() {
                return Err(DecodeError::BadValue("offset"));
            }
            Message::Zero { file, offset, len }
        }
        tag::HOLES => {
            let file = i.var32("file")?;
            let first = i.var32("first")?;
            let count = i.var32("count")?;
            if count == 0 || first.checked_add(count).is_none() {
                return Err(DecodeError::BadValue("count"));
            }
            Message::Holes { file, first, count }
        }
        tag::UNUSED => {
            let file = i.var32("file")?;
            let offset = i.var()?;
            let len = i.var()?;
            if offset.checked_add(len).is_none() {
                return Err(DecodeError::BadValue("offset"));
            }
            Message::Unused { file, offset, len }
        }
        tag::COPY => {
            let file = i.var32("file")?;
            let offset = i.var()?;
            let basis_offset = i.var()?;
            let len = i.var()?;
            if offset.checked_add(len).is_none() || basis_offset.checked_add(len).is_none() {
                return Err(DecodeError::BadValue("offset"));
            }
            Message::Copy {
                file,
                offset,
                basis_offset,
                len,
            }
        }
        tag::SEGMENT_DONE => Message::SegmentDone {
            file: i.var32("file")?,
            segment: i.var32("segment")?,
            digest: i.array::<32>()?,
        },
        tag::FILE_FAILED => Message::FileFailed {
            file: i.var32("file")?,
            error: i.string("error")?,
        },
        tag::FILE_CHANGED => Message::FileChanged {
            file: i.var32("file")?,
            error: i.string("error")?,
        },
        tag::SENDER_DONE => Message::SenderDone,
        tag::RECEIVER_DONE => report(&mut i)?,
        tag::FATAL => Message::Fatal {
            class: FatalClass::from_wire(i.u8()?).ok_or(DecodeError::BadValue("class"))?,
            error: i.string("error")?,
        },
        tag::COMPRESSED => compressed(&mut i)?,
        tag::CHANGE => {
            let code = i.array::<11>()?;
            if !code.iter().all(|b| (b' '..=b'~').contains(b)) {
                return Err(DecodeError::BadValue("change code"));
            }
            Message::Change(Box::new(Change {
                code,
                // A directory's path has its `/` on top of the limit.
                path: i.bytes(MAX_STR + 1, "path")?.to_vec(),
                to: i.bytes(MAX_STR, "change target")?.to_vec(),
            }))
        }
        t => return Err(DecodeError::UnknownTag(t)),
    };
    if !i.b.is_empty() {
        return Err(DecodeError::Trailing(i.b.len()));
    }
    Ok(m)
}

/// An `Entry` after its tag.
fn entry(i: &mut In) -> Result<Message, DecodeError> {
    let id = i.var32("id")?;
    let path = i.bytes(MAX_STR, "path")?.to_vec();
    let kind = EntryKind::from_u8(i.u8()?).ok_or(DecodeError::BadValue("kind"))?;
    let mode = i.var32("mode")?;
    let uid = i.var32("uid")?;
    let gid = i.var32("gid")?;
    let size = i.var()?;
    let mtime = i.svar()?;
    let mtime_nsec = i.var32("mtime_nsec")?;
    if mtime_nsec >= 1_000_000_000 {
        return Err(DecodeError::BadValue("mtime_nsec"));
    }
    let target = i.bytes(MAX_STR, "target")?.to_vec();
    let link_to = i.var32("link_to")?;
    let n = i.count(MAX_XATTRS, 2, "xattrs")?;
    let mut xattrs = Vec::with_capacity(n);
    for _ in 0..n {
        let k = i.bytes(MAX_STR, "xattr name")?.to_vec();
        let v = i.bytes(MAX_XATTR_VALUE, "xattr value")?.to_vec();
        xattrs.push((k, v));
    }
    let digest = match i.u8()? {
        0 => None,
        1 => Some(i.array::<32>()?),
        _ => return Err(DecodeError::BadValue("digest flag")),
    };
    let owner = i.bytes(MAX_NAME, "owner name")?.to_vec();
    let group = i.bytes(MAX_NAME, "group name")?.to_vec();
    let rdev = i.var()?;
    Ok(Message::Entry(Box::new(Entry {
        id,
        path,
        kind: Some(kind),
        mode,
        uid,
        gid,
        size,
        mtime,
        mtime_nsec,
        target,
        link_to,
        xattrs,
        digest,
        owner,
        group,
        rdev,
    })))
}

/// A `Signature` after its tag.
fn signature(i: &mut In) -> Result<Message, DecodeError> {
    let file = i.var32("file")?;
    let block_size = i.var32("block_size")?;
    if block_size == 0 {
        return Err(DecodeError::BadValue("block_size"));
    }
    let basis_size = i.var()?;
    let first_block = i.var()?;
    let last = match i.u8()? {
        0 => false,
        1 => true,
        _ => return Err(DecodeError::BadValue("last")),
    };
    let n = i.count(MAX_SIG_BLOCKS, 24, "signature blocks")?;
    let mut weak = Vec::with_capacity(n);
    let mut strong = Vec::with_capacity(n);
    for _ in 0..n {
        weak.push(u64::from_le_bytes(i.array::<8>()?));
        strong.push(i.array::<16>()?);
    }
    Ok(Message::Signature(SignaturePart {
        file,
        block_size,
        basis_size,
        first_block,
        weak,
        strong,
        last,
    }))
}

/// A `Have` after its tag.
fn have(i: &mut In) -> Result<Message, DecodeError> {
    let file = i.var32("file")?;
    let upto = i.var()?;
    let n = i.count(MAX_HAVE_SEGMENTS, 33, "kept segments")?;
    let mut kept: Vec<(u64, [u8; 32])> = Vec::with_capacity(n);
    for _ in 0..n {
        let seg = i.var()?;
        if seg >= upto || kept.last().is_some_and(|&(prev, _)| seg <= prev) {
            return Err(DecodeError::BadValue("kept segment"));
        }
        kept.push((seg, i.array::<32>()?));
    }
    Ok(Message::Have(HavePart { file, upto, kept }))
}

/// A `ReceiverDone` after its tag.
fn report(i: &mut In) -> Result<Message, DecodeError> {
    let mut v = [0u64; 15];
    for x in v.iter_mut() {
        *x = i.var()?;
    }
    let n = i.count(MAX_REPORT_ERRORS, 1, "errors")?;
    let mut errors = Vec::with_capacity(n);
    for _ in 0..n {
        errors.push(i.string("error")?);
    }
    Ok(Message::ReceiverDone(Box::new(ReceiverReport {
        files_total: v[0],
        files_transferred: v[1],
        files_delta: v[2],
        files_deleted: v[3],
        files_failed: v[4],
        bytes_total: v[5],
        bytes_transferred: v[6],
        bytes_written: v[7],
        bytes_matched: v[8],
        dirs_total: v[9],
        delete_skipped: v[10],
        delta_mismatch: v[11],
        bytes_resumed: v[12],
        files_vanished: v[13],
        deletes_held: v[14],
        errors,
    })))
}

/// A `Compressed` after its tag.
fn compressed(i: &mut In) -> Result<Message, DecodeError> {
    let file = i.var32("file")?;
    let offset = i.var()?;
    let codec = i.u8()?;
    let stream = u16::try_from(i.var()?).map_err(|_| DecodeError::BadValue("stream"))?;
    let level = i32::try_from(i.svar()?).map_err(|_| DecodeError::BadValue("level"))?;
    let raw_len = i.var32("raw_len")?;
    if raw_len as usize > MAX_DATA || offset.checked_add(raw_len as u64).is_none() {
        return Err(DecodeError::TooLong("raw_len"));
    }
    let data = i.bytes(MAX_DATA, "compressed data")?.to_vec();
    Ok(Message::Compressed(CompressedData {
        file,
        offset,
        codec,
        stream,
        level,
        raw_len,
        data,
    }))
}
