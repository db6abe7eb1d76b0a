//! A cache of basis signatures, so an unchanged basis need not be re-read.
//!
//! One file per basis path, named by the blake3 hex of the path, written
//! atomically (a temporary file in the same directory, then `rename`). The
//! file stores the whole [`CacheKey`]; [`SigCache::get`] returns nothing
//! unless every field matches, so a file that changed (size, mtime, inode)
//! or a signature at another block size is never trusted.
//!
//! # File format (all integers little-endian)
//!
//! ```text
//! magic      8   "FERRYSIG"
//! version    4   1
//! path_len   4
//! path       path_len
//! size       8   \
//! mtime      8    |
//! mtime_nsec 4    | the rest of the key
//! inode      8    |
//! block_size 8   /
//! count      8   number of blocks: ceil(size / block_size)
//! blocks     count × (weak 8, full block hash 32)
//! check      32  blake3 of everything above
//! ```
//!
//! The decoder ([`decode`]) treats the file as untrusted bytes: every
//! length is checked against what is left before anything is allocated,
//! so it never allocates more than the file's size, and it never panics.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sig::Signature;

const MAGIC: &[u8; 8] = b"FERRYSIG";
const VERSION: u32 = 1;
/// Bytes per block in the file.
const PER_BLOCK: usize = 8 + 32;
/// Cache files larger than this are ignored (2^24 blocks).
const MAX_FILE: u64 = 1 << 30;

/// What a cached signature was computed from. All fields must match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// Path of the basis (as the caller names it).
    pub path: Vec<u8>,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    pub inode: u64,
    /// Block size the signature was computed at.
    pub block_size: u64,
}

/// Why a cache file could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("not a ferry signature cache file")]
    Magic,
    #[error("unsupported cache version {0}")]
    Version(u32),
    #[error("cache file truncated")]
    Truncated,
    #[error("cache file has a bad block count or length")]
    Length,
    #[error("cache file checksum mismatch")]
    Checksum,
}

/// Encodes a cache file.
pub fn encode(key: &CacheKey, sig: &Signature, full: &[[u8; 32]]) -> io::Result<Vec<u8>> {
    let n = Signature::block_count(key.size, key.block_size);
    if sig.block_size != key.block_size
        || sig.basis_size != key.size
        || sig.weak.len() as u64 != n
        || full.len() as u64 != n
        || key.block_size == 0
        || key.path.len() > u32::MAX as usize
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "signature does not match its cache key",
        ));
    }
    let mut v = Vec::with_capacity(64 + key.path.len() + full.len() * PER_BLOCK + 32);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.extend_from_slice(&(key.path.len() as u32).to_le_bytes());
    v.extend_from_slice(&key.path);
    v.extend_from_slice(&key.size.to_le_bytes());
    v.extend_from_slice(&key.mtime.to_le_bytes());
    v.extend_from_slice(&key.mtime_nsec.to_le_bytes());
    v.extend_from_slice(&key.inode.to_le_bytes());
    v.extend_from_slice(&key.block_size.to_le_bytes());
    v.extend_from_slice(&n.to_le_bytes());
    for (w, f) in sig.weak.iter().zip(full) {
        v.extend_from_slice(&w.to_le_bytes());
        v.extend_from_slice(f);
    }
    let check = blake3::hash(&v);
    v.extend_from_slice(check.as_bytes());
    Ok(v)
}

/// A bounded reader over untrusted bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}

/// Decodes a cache file: its key, signature and full block hashes.
pub fn decode(bytes: &[u8]) -> Result<(CacheKey, Signature, Vec<[u8; 32]>), DecodeError> {
    if bytes.len() < 32 {
        return Err(DecodeError::Truncated);
    }
    let (body, check) = bytes.split_at(bytes.len() - 32);
    let mut r = Reader(body);
    if r.take(8)? != MAGIC {
        return Err(DecodeError::Magic);
    }
    let version = r.u32()?;
    if version != VERSION {
        return Err(DecodeError::Version(version));
    }
    let path_len = r.u32()? as usize;
    let path = r.take(path_len)?.to_vec();
    let key = CacheKey {
        path,
        size: r.u64()?,
        mtime: i64::from_le_bytes(r.array()?),
        mtime_nsec: r.u32()?,
        inode: r.u64()?,
        block_size: r.u64()?,
    };
    let count = r.u64()?;
    if key.block_size == 0 || count != Signature::block_count(key.size, key.block_size) {
        return Err(DecodeError::Length);
    }
    // Exactly the blocks must remain: this bounds every allocation below by
    // the input's length.
    if (r.0.len() / PER_BLOCK) as u64 != count || r.0.len() % PER_BLOCK != 0 {
        return Err(DecodeError::Length);
    }
    if blake3::hash(body).as_bytes() != check {
        return Err(DecodeError::Checksum);
    }
    let n = count as usize;
    let mut weak = Vec::with_capacity(n);
    let mut full = Vec::with_capacity(n);
    for rec in r.0.chunks_exact(PER_BLOCK) {
        let mut w = [0u8; 8];
        w.copy_from_slice(&rec[..8]);
        let mut f = [0u8; 32];
        f.copy_from_slice(&rec[8..]);
        weak.push(u64::from_le_bytes(w));
        full.push(f);
    }
    let sig = Signature::from_parts(key.block_size, key.size, weak, &full);
    Ok((key, sig, full))
}

/// A directory of cached signatures.
#[derive(Debug, Clone)]
pub struct SigCache {
    dir: PathBuf,
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl SigCache {
    /// Opens (creating if needed) the cache directory `dir`.
    pub fn open(dir: &Path) -> io::Result<SigCache> {
        fs::create_dir_all(dir)?;
        Ok(SigCache {
            dir: dir.to_path_buf(),
        })
    }

    fn file_for(&self, path: &[u8]) -> PathBuf {
        self.dir.join(blake3::hash(path).to_hex().as_str())
    }

    /// The cached signature and full block hashes for `key`, if a cache
    /// file exists for its path, decodes, and matches every field of `key`.
    pub fn get(&self, key: &CacheKey) -> Option<(Signature, Vec<[u8; 32]>)> {
        let f = File::open(self.file_for(&key.path)).ok()?;
        let len = f.metadata().ok()?.len();
        if len > MAX_FILE {
            return None;
        }
        let mut bytes = Vec::with_capacity(len as usize);
        f.take(len).read_to_end(&mut bytes).ok()?;
        let (k, sig, full) = decode(&bytes).ok()?;
        (k == *key).then_some((sig, full))
    }

    /// Stores `sig`/`full` under `key`, replacing any previous entry for
    /// the same path atomically. Not fsynced: a torn file fails its
    /// checksum and is ignored.
    pub fn put(&self, key: &CacheKey, sig: &Signature, full: &[[u8; 32]]) -> io::Result<()> {
        let bytes = encode(key, sig, full)?;
        let dst = self.file_for(&key.path);
        let tmp = self.dir.join(format!(
            ".tmp.{}.{}.{}",
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed),
            blake3::hash(&key.path).to_hex().as_str()
        ));
        let res = (|| {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(&bytes)?;
            fs::rename(&tmp, &dst)
        })();
        if res.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        res
    }

    /// Removes the entry for `path`, if any.
    pub fn remove(&self, path: &[u8]) -> io::Result<()> {
        match fs::remove_file(self.file_for(path)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature_of_bytes;

    fn key() -> CacheKey {
        CacheKey {
            path: b"dir/file.img".to_vec(),
            size: 20_000,
            mtime: 1_700_000_000,
            mtime_nsec: 123,
            inode: 42,
            block_size: 8192,
        }
    }

    fn data() -> Vec<u8> {
        (0..20_000u32).map(|i| (i * 13 % 251) as u8).collect()
    }

    #[test]
    fn round_trip_and_stale_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = SigCache::open(&dir.path().join("sigs")).expect("open");
        let k = key();
        let (sig, full) = signature_of_bytes(&data(), k.block_size);
        assert!(c.get(&k).is_none());
        c.put(&k, &sig, &full).expect("put");
        assert_eq!(c.get(&k), Some((sig.clone(), full.clone())));
        let variants = [
            CacheKey {
                size: 20_001,
                ..key()
            },
            CacheKey { mtime: 1, ..key() },
            CacheKey {
                mtime_nsec: 124,
                ..key()
            },
            CacheKey { inode: 43, ..key() },
            CacheKey {
                block_size: 16384,
                ..key()
            },
            CacheKey {
                path: b"other".to_vec(),
                ..key()
            },
        ];
        for v in &variants {
            assert!(c.get(v).is_none(), "{v:?}");
        }
        // No temporary files are left behind.
        let names: Vec<_> = fs::read_dir(&c.dir).expect("ls").collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn put_rejects_mismatched_signature() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = SigCache::open(dir.path()).expect("open");
        let (sig, full) = signature_of_bytes(&data(), 16384);
        assert!(c.put(&key(), &sig, &full).is_err());
    }

    #[test]
    fn every_truncation_and_bit_flip_is_rejected() {
        let k = key();
        let (sig, full) = signature_of_bytes(&data(), k.block_size);
        let bytes = encode(&k, &sig, &full).expect("encode");
        assert_eq!(decode(&bytes), Ok((k, sig, full)));
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut {cut}");
        }
        for i in (0..bytes.len()).step_by(7) {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(decode(&b).is_err(), "flip {i}");
        }
    }

    #[test]
    fn corrupt_file_is_a_miss() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = SigCache::open(dir.path()).expect("open");
        let k = key();
        let (sig, full) = signature_of_bytes(&data(), k.block_size);
        c.put(&k, &sig, &full).expect("put");
        let f = c.file_for(&k.path);
        let mut b = fs::read(&f).expect("read");
        let last = b.len() - 1;
        b[last] ^= 1;
        fs::write(&f, &b).expect("write");
        assert!(c.get(&k).is_none());
        fs::write(&f, b"junk").expect("write");
        assert!(c.get(&k).is_none());
    }
}
