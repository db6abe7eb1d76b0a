//! Resuming a stream whose output is a regular file that an interrupted
//! run left part of (`recv FILE`), from a sender whose input is a regular
//! file (`send HOST:PORT FILE`, or stdin redirected from one).
//!
//! After the handshake the receiver's first message is OFFER: how many
//! bytes its output already holds and their BLAKE3 (0 and the hash of
//! nothing when it has none, or cannot resume: stdout, a command). The
//! sender's first message is START: where its blocks begin. A sender whose
//! input is a regular file hashes as many bytes of it as were offered;
//! when they hash the same it starts there, else at 0 (the receiver then
//! writes the output from its start again). END's total and digest always
//! cover the whole stream, resumed prefix included, so a prefix that does
//! not belong to the stream can never pass.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

use crate::msg;

/// What a receiver's output already holds, offered to the sender.
pub struct Offer {
    /// Bytes the output holds.
    pub have: u64,
    /// BLAKE3 state over them.
    pub hasher: blake3::Hasher,
    /// Told where the sender starts (`have` or 0) before anything is
    /// written: the output must then continue at that offset.
    pub on_start: Box<dyn FnOnce(u64) -> io::Result<()> + Send>,
}

/// OFFER: `have` u64 LE, digest.
pub(crate) fn offer_message(have: u64, digest: &[u8; 32]) -> Vec<u8> {
    let mut m = vec![msg::OFFER];
    m.extend_from_slice(&have.to_le_bytes());
    m.extend_from_slice(digest);
    m
}

/// The `(have, digest)` of an OFFER message.
pub(crate) fn parse_offer(m: &[u8]) -> Option<(u64, [u8; 32])> {
    if m.len() != 41 || m[0] != msg::OFFER {
        return None;
    }
    let have = u64::from_le_bytes(m[1..9].try_into().ok()?);
    Some((have, m[9..41].try_into().ok()?))
}

/// START: the offset the blocks begin at, u64 LE.
pub(crate) fn start_message(offset: u64) -> Vec<u8> {
    let mut m = vec![msg::START];
    m.extend_from_slice(&offset.to_le_bytes());
    m
}

/// The offset of a START message.
pub(crate) fn parse_start(m: &[u8]) -> Option<u64> {
    if m.len() != 9 || m[0] != msg::START {
        return None;
    }
    Some(u64::from_le_bytes(m[1..9].try_into().ok()?))
}

/// Whether a sender's START at `offset` answers an OFFER of `have` bytes.
pub(crate) fn start_fits(offset: u64, have: u64) -> bool {
    offset == 0 || offset == have
}

/// BLAKE3 over `n` bytes of `f` from `at`, read with `pread`; `None` when
/// the file ends first.
fn hash_range(f: &File, at: u64, n: u64) -> io::Result<Option<blake3::Hasher>> {
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < n {
        let k = ((n - off) as usize).min(buf.len());
        let got = f.read_at(&mut buf[..k], at + off)?;
        if got == 0 {
            return Ok(None);
        }
        h.update(&buf[..got]);
        off += got as u64;
    }
    Ok(Some(h))
}

/// The receiver's side: the BLAKE3 state over the first `n` bytes of `f`.
pub fn hash_prefix(f: &File, n: u64) -> io::Result<blake3::Hasher> {
    hash_range(f, 0, n)?.ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))
}

/// The sender's side: when `f` is a regular file whose next `have` bytes
/// (from its current position) hash to `digest`, move it past them and
/// return the state over them; else leave it where it is.
pub fn skip_prefix(
    f: &mut File,
    have: u64,
    digest: &[u8; 32],
) -> io::Result<Option<blake3::Hasher>> {
    if have == 0 || !f.metadata()?.is_file() {
        return Ok(None);
    }
    let at = f.stream_position()?;
    let Some(h) = hash_range(f, at, have)? else {
        return Ok(None);
    };
    if h.finalize().as_bytes() != digest {
        return Ok(None);
    }
    f.seek(SeekFrom::Start(at + have))?;
    Ok(Some(h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn messages_round_trip_and_refuse_other_lengths() {
        let m = offer_message(7, &[3; 32]);
        assert_eq!(parse_offer(&m), Some((7, [3; 32])));
        assert_eq!(parse_offer(&m[..40]), None);
        assert_eq!(parse_start(&start_message(1 << 40)), Some(1 << 40));
        assert_eq!(parse_start(&m), None);
        assert!(start_fits(0, 9) && start_fits(9, 9) && !start_fits(5, 9));
    }

    #[test]
    fn a_sender_skips_only_a_prefix_that_hashes_the_same() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[5u8; 3000]).unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        let want = *blake3::hash(&[5u8; 1000]).as_bytes();
        let h = skip_prefix(&mut f, 1000, &want)
            .unwrap()
            .expect("same prefix");
        assert_eq!(h.finalize().as_bytes(), &want);
        assert_eq!(f.stream_position().unwrap(), 1000);
        // Another prefix, or one longer than the file: nothing skipped.
        f.seek(SeekFrom::Start(0)).unwrap();
        assert!(skip_prefix(&mut f, 1000, &[0; 32]).unwrap().is_none());
        assert!(skip_prefix(&mut f, 5000, &want).unwrap().is_none());
        assert_eq!(f.stream_position().unwrap(), 0);
        let r = hash_prefix(&f, 1000).unwrap();
        assert_eq!(r.finalize().as_bytes(), &want);
        assert!(hash_prefix(&f, 4000).is_err());
    }
}
