//! `delta_signature`: what a sender does with the block signature a
//! receiver sends (`Message::Signature` parts, [`Signature::extend_part`],
//! [`Matcher`]), the decoder of peer input behind every delta.
//!
//! Input: `mode`, `bs` (block size selector), `per` (blocks per part), then
//! records.
//!
//! * `mode & 1 == 0`, honest: record 0 is the basis, record 1 an edit
//!   script that makes the source from it. The basis's signature, cut
//!   into parts of `per` blocks and carried through the real codec, must
//!   be accepted part by part and come out equal; the matcher's ops must
//!   tile the source in order, copy only bytes the basis really has there,
//!   rebuild the source exactly, be the same when given the block hashes,
//!   and tile a sub-range (with context) exactly.
//! * `mode & 1 == 1`, hostile: every record but the last is a message body
//!   (decoded with the real codec; `Signature`s are used), the last is the
//!   source. `extend_part` either appends exactly the part or changes
//!   nothing, never beyond the claimed basis's block count; the matcher
//!   (which tolerates an inconsistent signature) must still tile the
//!   source, copy only from within the claimed basis, and claim a block
//!   only where the source's block hash is the signature's.

use ferry_delta::sig::short;
use ferry_delta::{apply_to_vec, signature_of_bytes, Matcher, Op, Signature};
use ferry_link::layout::block_hash;
use ferry_link::{decode, encode, Message, SignaturePart};

use crate::util::{records, Bytes};

pub const BLOCK_SIZES: [u64; 9] = [1, 2, 3, 8, 16, 64, 256, 1024, 8192];
/// Largest signature (in blocks) the target accepts: keeps executions cheap.
const MAX_BLOCKS: u64 = 1 << 16;

pub fn run(data: &[u8]) {
    let mut b = Bytes(data);
    let mode = b.u8();
    let bs = BLOCK_SIZES[b.u8() as usize % BLOCK_SIZES.len()];
    let per = usize::from(b.u8()).max(1);
    let recs: Vec<&[u8]> = records(b.rest()).take(64).collect();
    if mode & 1 == 0 {
        honest(bs, per, &recs);
    } else {
        hostile(&recs);
    }
}

/// Apply an edit script: (position u16, op) pairs; op < 64 deletes that
/// many bytes, < 128 inserts `op - 64` bytes of `op`, else replaces a byte.
pub fn edit(basis: &[u8], script: &[u8]) -> Vec<u8> {
    let mut v = basis.to_vec();
    for c in script.chunks_exact(3) {
        let at = u16::from_le_bytes([c[0], c[1]]) as usize % (v.len() + 1);
        match c[2] {
            n @ 0..64 => {
                let end = (at + n as usize).min(v.len());
                v.drain(at..end);
            }
            n @ 64..128 => {
                let ins = vec![n; (n - 64) as usize];
                v.splice(at..at, ins);
            }
            n => {
                if at < v.len() {
                    v[at] = n;
                }
            }
        }
    }
    v
}

/// The ops cover `range` exactly, in order, none empty.
fn tiles(ops: &[Op], range: std::ops::Range<u64>) {
    let mut at = range.start;
    for op in ops {
        assert!(!op.is_empty(), "an empty op {op:?}");
        assert_eq!(
            op.offset(),
            at,
            "ops {ops:?} leave a gap or overlap at {at}"
        );
        at += op.len();
    }
    assert_eq!(at, range.end, "ops {ops:?} do not reach {}", range.end);
}

fn honest(bs: u64, per: usize, recs: &[&[u8]]) {
    let basis = recs.first().copied().unwrap_or_default();
    let source = edit(basis, recs.get(1).copied().unwrap_or_default());
    let (sig, _) = signature_of_bytes(basis, bs);
    assert!(
        sig.is_consistent(),
        "the signature of a basis is inconsistent"
    );
    let n = sig.weak.len();
    let mut got = Signature::receiving(bs, basis.len() as u64);
    let mut i = 0;
    loop {
        let j = (i + per).min(n);
        let m = Message::Signature(SignaturePart {
            file: 1,
            block_size: bs as u32,
            basis_size: basis.len() as u64,
            first_block: i as u64,
            weak: sig.weak[i..j].to_vec(),
            strong: sig.strong[i..j].to_vec(),
            last: j == n,
        });
        let mut body = Vec::new();
        encode(&m, &mut body);
        let Ok(Message::Signature(SignaturePart {
            first_block,
            weak,
            strong,
            ..
        })) = decode(&body)
        else {
            panic!("a signature part does not survive the codec");
        };
        got.extend_part(first_block, &weak, &strong)
            .expect("an honest part is refused");
        i = j;
        if i >= n {
            break;
        }
    }
    assert!(got.is_consistent() && got == sig, "the parts do not add up");

    let m = Matcher::new(&got);
    let mut ops = Vec::new();
    m.diff(&source, 0, &mut |op| ops.push(op));
    tiles(&ops, 0..source.len() as u64);
    for op in &ops {
        if let Op::Copy {
            offset,
            basis_offset,
            len,
        } = *op
        {
            let (o, b, l) = (offset as usize, basis_offset as usize, len as usize);
            assert!(b + l <= basis.len(), "{op:?} beyond the basis");
            assert_eq!(
                source[o..o + l],
                basis[b..b + l],
                "{op:?} copies other bytes"
            );
        }
    }
    let rebuilt = apply_to_vec(basis, source.len() as u64, &ops, &source);
    assert!(rebuilt == source, "the ops do not rebuild the source");

    let hashes: Vec<[u8; 32]> = source.chunks(bs as usize).map(block_hash).collect();
    let mut with = Vec::new();
    m.diff_with_hashes(&source, 0, &hashes, &mut |op| with.push(op));
    assert_eq!(with, ops, "diff_with_hashes differs from diff");

    if !source.is_empty() {
        let a = (per * 7919) % source.len();
        let e = (a + per * 13).min(source.len());
        let mut part = Vec::new();
        m.diff_range(&source, 0, a..e, None, &mut |op| part.push(op));
        tiles(&part, a as u64..e as u64);
        for op in &part {
            if let Op::Copy {
                offset,
                basis_offset,
                len,
            } = *op
            {
                let (o, b, l) = (offset as usize, basis_offset as usize, len as usize);
                assert_eq!(source[o..o + l], basis[b..b + l], "{op:?} in a range");
            }
        }
    }
}

fn hostile(recs: &[&[u8]]) {
    let Some((source, parts)) = recs.split_last() else {
        return;
    };
    let mut sig: Option<Signature> = None;
    for body in parts {
        let Ok(Message::Signature(SignaturePart {
            block_size,
            basis_size,
            first_block,
            weak,
            strong,
            ..
        })) = decode(body)
        else {
            continue;
        };
        let s = sig.get_or_insert_with(|| Signature::receiving(block_size.into(), basis_size));
        let total = Signature::block_count(s.basis_size, s.block_size);
        if total > MAX_BLOCKS {
            return;
        }
        let before = s.clone();
        match s.extend_part(first_block, &weak, &strong) {
            Ok(()) => {
                assert_eq!(s.weak.len(), before.weak.len() + weak.len());
                assert_eq!(s.weak[before.weak.len()..], weak[..]);
                assert_eq!(s.strong[before.strong.len()..], strong[..]);
                assert_eq!(s.weak.len(), s.strong.len());
                assert!(
                    s.weak.len() as u64 <= total,
                    "more blocks than the basis has"
                );
            }
            Err(e) => assert!(*s == before, "a refused part ({e}) changed the signature"),
        }
    }
    let Some(sig) = sig else { return };
    let m = Matcher::new(&sig);
    let mut ops = Vec::new();
    m.diff(source, 0, &mut |op| ops.push(op));
    tiles(&ops, 0..source.len() as u64);
    let bs = sig.block_size;
    let n = sig.weak.len().min(sig.strong.len()) as u64;
    for op in &ops {
        let Op::Copy {
            offset,
            basis_offset,
            len,
        } = *op
        else {
            continue;
        };
        assert!(
            basis_offset
                .checked_add(len)
                .is_some_and(|e| e <= sig.basis_size),
            "{op:?} beyond the claimed basis of {} bytes",
            sig.basis_size
        );
        assert_eq!(basis_offset % bs, 0, "{op:?} not at a basis block");
        let mut done = 0;
        while done < len {
            let j = (basis_offset + done) / bs;
            assert!(
                j < n,
                "{op:?} copies basis block {j}, which was never signed"
            );
            let l = sig.block_len(j);
            assert!(done + l <= len, "{op:?} copies part of basis block {j}");
            let o = (offset + done) as usize;
            let piece = &source[o..o + l as usize];
            assert_eq!(
                short(&block_hash(piece)),
                sig.strong[j as usize],
                "{op:?} claims source [{o}, +{l}) is basis block {j}, whose hash differs"
            );
            done += l;
        }
    }
}
