//! `sig_cache`: the decoder of signature cache files
//! ([`ferry_delta::cache::decode`]), whose bytes are not trusted.
//! (Supersedes `crates/ferry-delta/fuzz`'s `sig_cache_decode`.)
//!
//! Input: `mode`, then a cache file. With `mode & 1` the harness appends
//! the file's checksum itself (so that mutations reach the checks behind
//! it). Whatever decodes is a consistent signature of the key's size and
//! block size whose short hashes are its full hashes, and encodes back to
//! exactly the bytes decoded. With `mode & 2` the rest is also used as a
//! basis and a key: its signature must survive an encode/decode round
//! trip.

use ferry_delta::cache::{decode, encode};
use ferry_delta::sig::short;
use ferry_delta::{signature_of_bytes, CacheKey};

use crate::util::Bytes;

pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let file = if mode & 1 != 0 {
        [rest, blake3::hash(rest).as_bytes()].concat()
    } else {
        rest.to_vec()
    };
    if let Ok((key, sig, full)) = decode(&file) {
        assert!(sig.is_consistent(), "an inconsistent signature decoded");
        assert_eq!((sig.block_size, sig.basis_size), (key.block_size, key.size));
        assert_eq!(full.len(), sig.strong.len());
        for (f, s) in full.iter().zip(&sig.strong) {
            assert_eq!(short(f), *s, "short hash is not the full hash's");
        }
        let again = encode(&key, &sig, &full).expect("a decoded signature re-encodes");
        assert!(again == file, "decode/encode does not round-trip");
    }
    if mode & 2 != 0 {
        let mut b = Bytes(rest);
        let bs = u64::from(b.u8()).max(1);
        let n = usize::from(b.u8() % 64);
        let path = b.take(n).to_vec();
        let (mtime, mtime_nsec, inode) = (b.u64() as i64, b.u32(), b.u64());
        let basis = b.rest();
        let key = CacheKey {
            path,
            size: basis.len() as u64,
            mtime,
            mtime_nsec,
            inode,
            block_size: bs,
        };
        let (sig, full) = signature_of_bytes(basis, bs);
        let enc = encode(&key, &sig, &full).expect("encode");
        let (k2, s2, f2) = decode(&enc).expect("an encoded signature decodes");
        assert!(
            k2 == key && s2 == sig && f2 == full,
            "encode/decode does not round-trip"
        );
    }
}
