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
/// Most segments in one [`Message::Have`].
pub const MAX_HAVE_SEGMENTS: usize = 1 << 16;
/// Most error lines in a [`Message::ReceiverDone`].
pub const MAX_REPORT_ERRORS: usize = 1000;
/// Longest user or group name in an [`Entry`].
pub const MAX_NAME: usize = 255;

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
    pub const HAVE: u8 = 15;
    pub const FILE_CHANGED: u8 = 16;
    pub const CHANGE: u8 = 17;
    pub const UNUSED: u8 = 18;
    pub const DECIDED: u8 = 19;
    pub const HOLES: u8 = 20;
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
            write_entry(o, e);
        }
        Message::EndOfList => o.u8(tag::END_OF_LIST),
        Message::Decided { below } => {
            o.u8(tag::DECIDED);
            o.var(*below as u64);
        }
        Message::Want { file, mode } => {
            o.u8(tag::WANT);
            o.var(*file as u64);
            o.u8(*mode as u8);
        }
        Message::Signature(p) => {
            o.u8(tag::SIGNATURE);
            o.var(p.file as u64);
            o.var(p.block_size as u64);
            o.var(p.basis_size);
            o.var(p.first_block);
            o.u8(p.last as u8);
            o.var(p.weak.len() as u64);
            for (w, s) in p.weak.iter().zip(p.strong.iter()) {
                o.put(&w.to_le_bytes());
                o.put(s);
            }
        }
        Message::Have(h) => {
            o.u8(tag::HAVE);
            o.var(h.file as u64);
            o.var(h.upto);
            o.var(h.kept.len() as u64);
            for (seg, d) in &h.kept {
                o.var(*seg);
                o.put(d);
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
        Message::Holes { file, first, count } => {
            o.u8(tag::HOLES);
            o.var(*file as u64);
            o.var(*first as u64);
            o.var(*count as u64);
        }
        Message::Unused { file, offset, len } => {
            o.u8(tag::UNUSED);
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
        Message::FileChanged { file, error } => {
            o.u8(tag::FILE_CHANGED);
            o.var(*file as u64);
            o.bytes(clip(error).as_bytes());
        }
        Message::SenderDone => o.u8(tag::SENDER_DONE),
        Message::ReceiverDone(r) => {
            o.u8(tag::RECEIVER_DONE);
            write_report(o, r);
        }
        Message::Fatal { class, error } => {
            o.u8(tag::FATAL);
            o.u8(*class as u8);
            o.bytes(clip(error).as_bytes());
        }
        Message::Compressed(c) => {
            o.u8(tag::COMPRESSED);
            o.var(c.file as u64);
            o.var(c.offset);
            o.u8(c.codec);
            o.var(c.stream as u64);
            o.svar(c.level as i64);
            o.var(c.raw_len as u64);
            o.bytes(&c.data);
        }
        Message::Change(c) => {
            o.u8(tag::CHANGE);
            o.put(&c.code);
            o.bytes(&c.path);
            o.bytes(&c.to);
        }
    }
}

/// An `Entry` after its tag.
fn write_entry<O: Out>(o: &mut O, e: &Entry) {
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
    o.bytes(&e.owner);
    o.bytes(&e.group);
    o.var(e.rdev);
}

/// A `ReceiverDone` after its tag.
fn write_report<O: Out>(o: &mut O, r: &ReceiverReport) {
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
        r.bytes_resumed,
        r.files_vanished,
        r.deletes_held,
    ] {
        o.var(v);
    }
    let n = r.errors.len().min(MAX_REPORT_ERRORS);
    o.var(n as u64);
    for e in &r.errors[..n] {
        o.bytes(clip(e).as_bytes());
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

mod decode;
pub use decode::decode;

#[cfg(test)]
mod tests;
