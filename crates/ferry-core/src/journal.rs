//! The journal of a partial file: what an interrupted run had written of a
//! file, so that the next run can resume it instead of starting over.
//!
//! While a large file is received into `.NAME.ferry-partial`, the receiver
//! appends to `.NAME.ferry-journal` beside it, after each `fdatasync` of
//! the partial file, one record per segment that was complete and verified
//! before that sync. A kill leaves both; the next run reads the journal
//! with [`parse`], keeps it only if [`resumable`] says it describes the
//! file the sender lists now, re-hashes every segment it names from the
//! partial file, and offers those digests to the sender (`Have`), which
//! checks them against its own copy. Nothing in a journal is trusted: it is
//! decoded as untrusted bytes (a fuzz target runs [`parse`]), every record
//! carries a check tied to its header, and a segment is kept only when the
//! bytes on the disk hash as the sender's source does.
//!
//! Format (all integers little-endian):
//!
//! * header: [`MAGIC`], source size `u64`, mtime seconds `i64`, mtime
//!   nanoseconds `u32`, name length `u16` (at most [`MAX_NAME`]), the
//!   destination's file name, and `check`: the first 8 bytes of BLAKE3 over
//!   everything before it;
//! * records of [`RECORD_LEN`] bytes: segment `u64`, its digest `[32]`, and
//!   the first 8 bytes of BLAKE3 over the header's check, the segment and
//!   the digest.
//!
//! A record that does not check out ends the journal (a torn append, or
//! garbage): the records before it stand. A segment beyond the file's end
//! makes the whole journal unusable.

use std::collections::BTreeMap;

use ferry_link::layout;

/// First bytes of a journal.
pub const MAGIC: &[u8; 8] = b"FERRYJ1\n";
/// Longest file name a journal holds (a Linux name is at most 255 bytes).
pub const MAX_NAME: usize = 255;
/// Bytes of one record.
pub const RECORD_LEN: usize = 8 + 32 + 8;
/// Largest journal read (records for 10 TiB of 8 MiB segments); a bigger
/// one is not resumed.
pub const MAX_LEN: u64 = 64 << 20;

/// What a journal says its partial file is a copy of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// The destination's file name (not a path).
    pub name: Vec<u8>,
}

/// A decoded journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Journal {
    pub id: Identity,
    /// The header's check, which every record's check covers.
    pub check: [u8; 8],
    /// Segments recorded, with the digests recorded for them (all zero
    /// when the writer did not know it: a local run digests nothing).
    pub segments: BTreeMap<u64, [u8; 32]>,
}

/// Why a journal cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    #[error("not a ferry journal")]
    BadMagic,
    #[error("journal header is truncated or damaged")]
    BadHeader,
    #[error("journal names segment {0}, beyond the file's end")]
    SegmentOutOfRange(u64),
}

fn check8(parts: &[&[u8]]) -> [u8; 8] {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p);
    }
    let mut out = [0u8; 8];
    out.copy_from_slice(&h.finalize().as_bytes()[..8]);
    out
}

/// The header for `id`, and its check (which records are tied to). `None`
/// when the name is too long for a journal.
pub fn header(id: &Identity) -> Option<(Vec<u8>, [u8; 8])> {
    if id.name.len() > MAX_NAME {
        return None;
    }
    let mut b = Vec::with_capacity(40 + id.name.len());
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&id.size.to_le_bytes());
    b.extend_from_slice(&id.mtime.to_le_bytes());
    b.extend_from_slice(&id.mtime_nsec.to_le_bytes());
    b.extend_from_slice(&(id.name.len() as u16).to_le_bytes());
    b.extend_from_slice(&id.name);
    let check = check8(&[&b]);
    b.extend_from_slice(&check);
    Some((b, check))
}

/// One record: segment `seg` with `digest`, under the header whose check
/// is `check`.
pub fn record(check: &[u8; 8], seg: u64, digest: &[u8; 32]) -> [u8; RECORD_LEN] {
    let mut r = [0u8; RECORD_LEN];
    r[..8].copy_from_slice(&seg.to_le_bytes());
    r[8..40].copy_from_slice(digest);
    let c = check8(&[check, &r[..40]]);
    r[40..].copy_from_slice(&c);
    r
}

/// Decode a journal's bytes (at most [`MAX_LEN`] of them are looked at).
pub fn parse(b: &[u8]) -> Result<Journal, JournalError> {
    let b = &b[..b.len().min(MAX_LEN as usize)];
    if b.len() < MAGIC.len() || &b[..MAGIC.len()] != MAGIC {
        return Err(JournalError::BadMagic);
    }
    let fixed = MAGIC.len() + 8 + 8 + 4 + 2;
    if b.len() < fixed {
        return Err(JournalError::BadHeader);
    }
    let u64_at = |o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        a
    };
    let size = u64::from_le_bytes(u64_at(8));
    let mtime = i64::from_le_bytes(u64_at(16));
    let mtime_nsec = u32::from_le_bytes([b[24], b[25], b[26], b[27]]);
    let name_len = u16::from_le_bytes([b[28], b[29]]) as usize;
    if name_len > MAX_NAME || b.len() < fixed + name_len + 8 {
        return Err(JournalError::BadHeader);
    }
    let head_end = fixed + name_len;
    let mut check = [0u8; 8];
    check.copy_from_slice(&b[head_end..head_end + 8]);
    if check8(&[&b[..head_end]]) != check {
        return Err(JournalError::BadHeader);
    }
    let id = Identity {
        size,
        mtime,
        mtime_nsec,
        name: b[fixed..head_end].to_vec(),
    };
    let nseg = layout::segment_count(size);
    let mut segments = BTreeMap::new();
    for r in b[head_end + 8..].chunks_exact(RECORD_LEN) {
        if check8(&[&check, &r[..40]]) != r[40..] {
            break;
        }
        let mut s = [0u8; 8];
        s.copy_from_slice(&r[..8]);
        let seg = u64::from_le_bytes(s);
        if seg >= nseg {
            return Err(JournalError::SegmentOutOfRange(seg));
        }
        let mut d = [0u8; 32];
        d.copy_from_slice(&r[8..40]);
        segments.insert(seg, d);
    }
    Ok(Journal {
        id,
        check,
        segments,
    })
}

/// Whether a journal describes the file listed now (`want`) and a partial
/// file of `partial_len` bytes: the same size, modification time and name,
/// and a partial file of the full size. A source that changed since, or a
/// journal left beside another name, is not resumed.
pub fn resumable(j: &Journal, want: &Identity, partial_len: u64) -> bool {
    j.id == *want && partial_len == want.size && !j.segments.is_empty()
}

/// Whether `name` (a file name) is one ferry keeps its partial state
/// under: `.NAME.ferry-partial` or `.NAME.ferry-journal`. The sender's
/// walk skips such names and the receiver refuses them, so that a listed
/// file can never be written over the partial file of another.
pub fn is_reserved(name: &[u8]) -> bool {
    name.len() > 1
        && name[0] == b'.'
        && (name.ends_with(b".ferry-partial") || name.ends_with(b".ferry-journal"))
}

/// The file name whose partial state the reserved `name` holds
/// (`.NAME.ferry-partial` and `.NAME.ferry-journal` give `NAME`).
pub fn reserved_base(name: &[u8]) -> Option<&[u8]> {
    if !is_reserved(name) {
        return None;
    }
    let stem = &name[1..];
    stem.strip_suffix(b".ferry-partial".as_slice())
        .or_else(|| stem.strip_suffix(b".ferry-journal".as_slice()))
}

/// Segments complete since the last journal append, waiting for the next
/// `fdatasync`: appended once this many bytes of them have gathered (a
/// kill costs at most about this much again, plus what was in flight).
pub const SYNC_EVERY: u64 = 64 << 20;

/// Segments complete since the last journal append (holes, mostly) that
/// make an append due even with little data among them: what waits in
/// memory stays small, and a kill in a terabyte of holes costs little.
pub const SYNC_RECORDS: usize = 4096;

/// Time since the last journal append after which any complete segment
/// makes an append due: on a slow link [`SYNC_EVERY`] bytes take minutes,
/// and a file smaller than that would never record anything.
pub const SYNC_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `bytes` of data in `segments` complete segments, `since` the
/// last append, call for an `fdatasync` and a journal append.
pub fn sync_due(bytes: u64, segments: usize, since: std::time::Duration) -> bool {
    bytes >= SYNC_EVERY || segments >= SYNC_RECORDS || (segments > 0 && since >= SYNC_AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity {
            size: 100 << 20,
            mtime: 1_700_000_000,
            mtime_nsec: 7,
            name: b"disk.img".to_vec(),
        }
    }

    fn journal(records: &[(u64, [u8; 32])]) -> Vec<u8> {
        let (mut b, check) = header(&id()).unwrap();
        for (s, d) in records {
            b.extend_from_slice(&record(&check, *s, d));
        }
        b
    }

    #[test]
    fn appends_follow_data_not_holes() {
        let now = std::time::Duration::ZERO;
        assert!(!sync_due(0, 1, now));
        assert!(!sync_due(SYNC_EVERY - 1, 8, now));
        assert!(sync_due(SYNC_EVERY, 8, now));
        assert!(sync_due(8 << 20, 1, SYNC_AFTER));
        assert!(!sync_due(0, 0, SYNC_AFTER));
        // 512 segments of holes (4 GiB): still waiting; 4096 (32 GiB): due.
        assert!(!sync_due(0, 512, now));
        assert!(sync_due(0, SYNC_RECORDS, now));
    }

    #[test]
    fn a_journal_reads_back_as_written() {
        let b = journal(&[(0, [1; 32]), (5, [2; 32]), (12, [0; 32])]);
        let j = parse(&b).unwrap();
        assert_eq!(j.id, id());
        assert_eq!(j.segments.len(), 3);
        assert_eq!(j.segments[&5], [2; 32]);
        assert!(resumable(&j, &id(), 100 << 20));
    }

    #[test]
    fn a_torn_or_damaged_record_ends_the_journal() {
        let mut b = journal(&[(0, [1; 32]), (1, [2; 32]), (2, [3; 32])]);
        // Torn last append: the records before it stand.
        b.truncate(b.len() - 5);
        assert_eq!(parse(&b).unwrap().segments.len(), 2);
        // A flipped bit in the second record: only the first stands.
        let mut b = journal(&[(0, [1; 32]), (1, [2; 32]), (2, [3; 32])]);
        let second = b.len() - 2 * RECORD_LEN + 9;
        b[second] ^= 1;
        assert_eq!(parse(&b).unwrap().segments.keys().collect::<Vec<_>>(), [&0]);
    }

    #[test]
    fn records_of_another_journal_do_not_count() {
        let mut other = id();
        other.mtime += 1;
        let (_, foreign) = header(&other).unwrap();
        let (mut b, _) = header(&id()).unwrap();
        b.extend_from_slice(&record(&foreign, 0, &[1; 32]));
        assert!(parse(&b).unwrap().segments.is_empty());
    }

    #[test]
    fn a_damaged_header_or_wild_segment_is_refused() {
        assert_eq!(parse(b"").unwrap_err(), JournalError::BadMagic);
        assert_eq!(parse(b"FERRYJ1\n\0").unwrap_err(), JournalError::BadHeader);
        let mut b = journal(&[]);
        b[10] ^= 0x40;
        assert_eq!(parse(&b).unwrap_err(), JournalError::BadHeader);
        let b = journal(&[(13, [0; 32])]);
        assert_eq!(parse(&b).unwrap_err(), JournalError::SegmentOutOfRange(13));
    }

    #[test]
    fn only_the_same_source_and_a_whole_partial_resume() {
        let j = parse(&journal(&[(0, [1; 32])])).unwrap();
        assert!(resumable(&j, &id(), 100 << 20));
        assert!(!resumable(&j, &id(), 50 << 20), "short partial file");
        let mut touched = id();
        touched.mtime_nsec += 1;
        assert!(!resumable(&j, &touched, 100 << 20));
        let mut renamed = id();
        renamed.name = b"other.img".to_vec();
        assert!(!resumable(&j, &renamed, 100 << 20));
        let empty = parse(&journal(&[])).unwrap();
        assert!(!resumable(&empty, &id(), 100 << 20), "nothing to resume");
    }

    #[test]
    fn partial_state_names_are_reserved() {
        assert!(is_reserved(b".big.ferry-partial"));
        assert!(is_reserved(b".big.ferry-journal"));
        assert!(is_reserved(b"._dev_sdb.ferry-journal"));
        assert!(!is_reserved(b"big.ferry-partial"), "not hidden");
        assert!(!is_reserved(b".big.ferry-partial.txt"));
        assert_eq!(reserved_base(b".big.ferry-partial"), Some(&b"big"[..]));
        assert_eq!(reserved_base(b".a.b.ferry-journal"), Some(&b"a.b"[..]));
        assert_eq!(reserved_base(b"big.ferry-partial"), None);
        assert_eq!(reserved_base(b".big"), None);
        assert!(!is_reserved(b".big.ferry-123-4"));
        assert!(!is_reserved(b"."));
    }

    #[test]
    fn a_name_too_long_has_no_journal() {
        let mut long = id();
        long.name = vec![b'x'; 256];
        assert!(header(&long).is_none());
    }
}
