//! The binary encoding of [`Message`]s.
//!
//! A frame on a byte stream is `u32 LE length` followed by that many bytes
//! of body; the body is a one-byte tag and the fields of the message in
//! order. Integers are LEB128 varints (signed ones zig-zagged), byte strings
//! are a varint length and the bytes, fixed arrays are raw. Every length is
//! checked against the bytes that remain and against a per-field limit
//! before anything is allocated, so a hostile frame costs at most its own
//! size. `docs/PROTOCOL.md` is the specification; this file is its
//! reference implementation.

use crate::msg::*;

/// Largest frame body accepted (and ever produced).
pub const MAX_FRAME: usize = 16 << 20;
/// Largest payload of one [`Message::Data`].
pub const MAX_DATA: usize = 8 << 20;
/// Largest path, symlink target, xattr name or error text.
pub const MAX_STR: usize = 64 << 10;
/// Largest xattr value.
pub const MAX_XATTR_VALUE: usize = 64 << 10;
/// Most xattrs on one entry.
pub const MAX_XATTRS: usize = 1024;
/// Most blocks in one [`Message::Signature`].
pub const MAX_SIG_BLOCKS: usize = 1 << 16;
/// Most error lines in a [`ReceiverReport`].
pub const MAX_REPORT_ERRORS: usize = 1000;

/// Why a frame body could not be decoded.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("frame ends inside a field")]
    Truncated,
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    #[error("bad value in field {0}")]
    BadValue(&'static str),
    #[error("field {0} exceeds its limit")]
    TooLong(&'static str),
    #[error("{0} trailing bytes after message")]
    Trailing(usize),
}

mod tag {
    pub const HELLO: u8 = 1;
    pub const ENTRY: u8 = 2;
    pub const END_OF_LIST: u8 = 3;
    pub const WANT: u8 = 4;
    pub const SIGNATURE: u8 = 5;
    pub const DATA: u8 = 6;
    pub const ZERO: u8 = 7;
    pub const COPY: u8 = 8;
    pub const SEGMENT_DONE: u8 = 9;
    pub const FILE_FAILED: u8 = 10;
    pub const SENDER_DONE: u8 = 11;
    pub const RECEIVER_DONE: u8 = 12;
    pub const FATAL: u8 = 13;
    pub const COMPRESSED: u8 = 14;
}

trait Out {
    fn put(&mut self, b: &[u8]);
    fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }
    fn var(&mut self, mut v: u64) {
        let mut buf = [0u8; 10];
        let mut n = 0;
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                buf[n] = byte;
                n += 1;
                break;
            }
            buf[n] = byte | 0x80;
            n += 1;
        }
        self.put(&buf[..n]);
    }
    fn svar(&mut self, v: i64) {
        self.var(((v << 1) ^ (v >> 63)) as u64);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.var(b.len() as u64);
        self.put(b);
    }
}

impl Out for Vec<u8> {
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

struct Count(usize);
impl Out for Count {
    fn put(&mut self, b: &[u8]) {
        self.0 += b.len();
    }
}

fn write_msg<O: Out>(o: &mut O, m: &Message) {
    match m {
        Message::Hello { version, features } => {
            o.u8(tag::HELLO);
            o.var(*version as u64);
            o.var(*features);
        }
        Message::Entry(e) => {
            o.u8(tag::ENTRY);
            o.var(e.id as u64);
            o.bytes(&e.path);
            o.u8(e.kind() as u8);
            o.var(e.mode as u64);
            o.var(e.uid as u64);
            o.var(e.gid as u64);
            o.var(e.size);
            o.svar(e.mtime);
            o.var(e.mtime_nsec as u64);
            o.bytes(&e.target);
            o.var(e.link_to as u64);
            o.var(e.xattrs.len() as u64);
            for (k, v) in &e.xattrs {
                o.bytes(k);
                o.bytes(v);
            }
            match &e.digest {
                Some(d) => {
                    o.u8(1);
                    o.put(d);
                }
                None => o.u8(0),
            }
        }
        Message::EndOfList => o.u8(tag::END_OF_LIST),
        Message::Want { file, mode } => {
            o.u8(tag::WANT);
            o.var(*file as u64);
            o.u8(*mode as u8);
        }
        Message::Signature {
            file,
            block_size,
            basis_size,
            first_block,
            weak,
            strong,
            last,
        } => {
            o.u8(tag::SIGNATURE);
            o.var(*file as u64);
            o.var(*block_size as u64);
            o.var(*basis_size);
            o.var(*first_block);
            o.u8(*last as u8);
            o.var(weak.len() as u64);
            for (w, s) in weak.iter().zip(strong.iter()) {
                o.put(&w.to_le_bytes());
                o.put(s);
            }
        }
        Message::Data { file, offset, data } => {
            o.u8(tag::DATA);
            o.var(*file as u64);
            o.var(*offset);
            o.bytes(data);
        }
        Message::Zero { file, offset, len } => {
            o.u8(tag::ZERO);
            o.var(*file as u64);
            o.var(*offset);
            o.var(*len);
        }
        Message::Copy {
            file,
            offset,
            basis_offset,
            len,
        } => {
            o.u8(tag::COPY);
            o.var(*file as u64);
            o.var(*offset);
            o.var(*basis_offset);
            o.var(*len);
        }
        Message::SegmentDone {
            file,
            segment,
            digest,
        } => {
            o.u8(tag::SEGMENT_DONE);
            o.var(*file as u64);
            o.var(*segment as u64);
            o.put(digest);
        }
        Message::FileFailed { file, error } => {
            o.u8(tag::FILE_FAILED);
            o.var(*file as u64);
            o.bytes(clip(error).as_bytes());
        }
        Message::SenderDone => o.u8(tag::SENDER_DONE),
        Message::ReceiverDone(r) => {
            o.u8(tag::RECEIVER_DONE);
            for v in [
                r.files_total,
                r.files_transferred,
                r.files_delta,
                r.files_deleted,
                r.files_failed,
                r.bytes_total,
                r.bytes_transferred,
                r.bytes_written,
                r.bytes_matched,
                r.dirs_total,
                r.delete_skipped,
                r.delta_mismatch,
            ] {
                o.var(v);
            }
            let n = r.errors.len().min(MAX_REPORT_ERRORS);
            o.var(n as u64);
            for e in &r.errors[..n] {
                o.bytes(clip(e).as_bytes());
            }
        }
        Message::Fatal { class, error } => {
            o.u8(tag::FATAL);
            o.u8(*class as u8);
            o.bytes(clip(error).as_bytes());
        }
        Message::Compressed {
            file,
            offset,
            codec,
            stream,
            level,
            raw_len,
            data,
        } => {
            o.u8(tag::COMPRESSED);
            o.var(*file as u64);
            o.var(*offset);
            o.u8(*codec);
            o.var(*stream as u64);
            o.svar(*level as i64);
            o.var(*raw_len as u64);
            o.bytes(data);
        }
    }
}

/// Truncate a text to [`MAX_STR`] bytes on a char boundary.
fn clip(s: &str) -> &str {
    if s.len() <= MAX_STR {
        return s;
    }
    let mut end = MAX_STR;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Encode `m` as a frame body, appending to `out`.
pub fn encode(m: &Message, out: &mut Vec<u8>) {
    write_msg(out, m);
}

/// Size of `m` on a byte pipe: the 8-byte frame header, the body and the
/// 4-byte check (see `transport`).
pub fn encoded_len(m: &Message) -> usize {
    let mut c = Count(0);
    write_msg(&mut c, m);
    8 + c.0 + 4
}

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
        tag::ENTRY => {
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
            Message::Entry(Box::new(Entry {
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
            }))
        }
        tag::END_OF_LIST => Message::EndOfList,
        tag::WANT => Message::Want {
            file: i.var32("file")?,
            mode: match i.u8()? {
                0 => WantMode::Whole,
                1 => WantMode::Delta,
                2 => WantMode::DeltaInPlace,
                _ => return Err(DecodeError::BadValue("want mode")),
            },
        },
        tag::SIGNATURE => {
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
            Message::Signature {
                file,
                block_size,
                basis_size,
                first_block,
                weak,
                strong,
                last,
            }
        }
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
        tag::SENDER_DONE => Message::SenderDone,
        tag::RECEIVER_DONE => {
            let mut v = [0u64; 12];
            for x in v.iter_mut() {
                *x = i.var()?;
            }
            let n = i.count(MAX_REPORT_ERRORS, 1, "errors")?;
            let mut errors = Vec::with_capacity(n);
            for _ in 0..n {
                errors.push(i.string("error")?);
            }
            Message::ReceiverDone(Box::new(ReceiverReport {
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
                errors,
            }))
        }
        tag::FATAL => Message::Fatal {
            class: FatalClass::from_wire(i.u8()?).ok_or(DecodeError::BadValue("class"))?,
            error: i.string("error")?,
        },
        tag::COMPRESSED => {
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
            Message::Compressed {
                file,
                offset,
                codec,
                stream,
                level,
                raw_len,
                data,
            }
        }
        t => return Err(DecodeError::UnknownTag(t)),
    };
    if !i.b.is_empty() {
        return Err(DecodeError::Trailing(i.b.len()));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip(m: Message) {
        let mut v = Vec::new();
        encode(&m, &mut v);
        // The 8-byte frame header and the 4-byte check around the body.
        assert_eq!(encoded_len(&m), v.len() + 12);
        assert_eq!(decode(&v).unwrap(), m);
    }

    #[test]
    fn every_message_roundtrips() {
        roundtrip(Message::Hello {
            version: 1,
            features: u64::MAX,
        });
        roundtrip(Message::Entry(Box::new(Entry {
            id: 7,
            path: b"a/b c".to_vec(),
            kind: Some(EntryKind::Symlink),
            mode: 0o120777,
            uid: 1000,
            gid: 1000,
            size: 0,
            mtime: -5,
            mtime_nsec: 999_999_999,
            target: b"../x".to_vec(),
            link_to: 0,
            xattrs: vec![(b"user.k".to_vec(), vec![0, 1, 2])],
            digest: Some([9; 32]),
        })));
        roundtrip(Message::EndOfList);
        roundtrip(Message::Want {
            file: 3,
            mode: WantMode::Delta,
        });
        roundtrip(Message::Signature {
            file: 1,
            block_size: 8192,
            basis_size: 1 << 30,
            first_block: 12,
            weak: vec![1, 2],
            strong: vec![[3; 16], [4; 16]],
            last: true,
        });
        roundtrip(Message::Data {
            file: 1,
            offset: 1 << 40,
            data: vec![1; 1000],
        });
        roundtrip(Message::Zero {
            file: 1,
            offset: 4096,
            len: 1 << 33,
        });
        roundtrip(Message::Copy {
            file: 2,
            offset: 0,
            basis_offset: 7,
            len: 8192,
        });
        roundtrip(Message::SegmentDone {
            file: 4,
            segment: 2,
            digest: [1; 32],
        });
        roundtrip(Message::FileFailed {
            file: 4,
            error: "gone".into(),
        });
        roundtrip(Message::SenderDone);
        roundtrip(Message::ReceiverDone(Box::new(ReceiverReport {
            files_total: 1,
            files_transferred: 2,
            files_delta: 3,
            files_deleted: 4,
            files_failed: 5,
            bytes_total: 6,
            bytes_transferred: 7,
            bytes_written: 8,
            bytes_matched: 9,
            dirs_total: 10,
            delete_skipped: 1,
            delta_mismatch: 2,
            errors: vec!["x".into()],
        })));
        for class in [
            FatalClass::Io,
            FatalClass::Protocol,
            FatalClass::Connection,
            FatalClass::Usage,
            FatalClass::Interrupted,
        ] {
            roundtrip(Message::Fatal {
                class,
                error: "no".into(),
            });
        }
        assert!(matches!(
            decode(&[tag::FATAL, 5, 0]),
            Err(DecodeError::BadValue("class"))
        ));
        roundtrip(Message::Compressed {
            file: 3,
            offset: 1 << 20,
            codec: 2,
            stream: 7,
            level: -5,
            raw_len: 4096,
            data: vec![1, 2, 3],
        });
    }

    #[test]
    fn lying_lengths_are_refused_without_allocating() {
        // Signature claiming 65536 blocks in a 20-byte frame.
        let mut v = vec![5u8, 1, 1, 0, 0, 0];
        v.extend_from_slice(&[0x80, 0x80, 0x04]);
        assert!(matches!(decode(&v), Err(DecodeError::TooLong(_))));
        // Data longer than the frame.
        let v = vec![6u8, 1, 0, 0x80, 0x80, 0x80, 0x08];
        assert_eq!(decode(&v), Err(DecodeError::TooLong("data")));
        assert_eq!(decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(decode(&[200]), Err(DecodeError::UnknownTag(200)));
        assert_eq!(decode(&[3, 0]), Err(DecodeError::Trailing(1)));
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config { failure_persistence: None, ..proptest::test_runner::Config::default() })]
        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&b);
        }

        #[test]
        fn data_roundtrips(file in any::<u32>(), offset in 0u64..u64::MAX / 2,
                           data in proptest::collection::vec(any::<u8>(), 0..4096)) {
            roundtrip(Message::Data { file, offset, data });
        }

        #[test]
        fn entries_roundtrip(id in any::<u32>(), path in proptest::collection::vec(any::<u8>(), 0..300),
                             mtime in any::<i64>(), nsec in 0u32..1_000_000_000, size in any::<u64>()) {
            roundtrip(Message::Entry(Box::new(Entry { id, path, mtime, mtime_nsec: nsec, size,
                kind: Some(EntryKind::File), ..Default::default() })));
        }
    }
}
