//! Reference application of ops, in memory.

use crate::Op;

/// Rebuilds a source of `source_len` bytes from `basis` and `ops`; literal
/// bytes are taken from `literal_source` at their source offsets (in tests,
/// the source itself). Ops may come in any order (segments interleave).
///
/// # Panics
///
/// This is a test helper: it panics when the ops do not tile
/// `[0, source_len)` exactly or point outside `basis`/`literal_source`.
pub fn apply_to_vec(basis: &[u8], source_len: u64, ops: &[Op], literal_source: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; source_len as usize];
    let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(ops.len());
    for op in ops {
        let (off, len) = (op.offset() as usize, op.len() as usize);
        assert!(len > 0, "empty op {op:?}");
        let dst = &mut out[off..off + len];
        match *op {
            Op::Copy { basis_offset, .. } => {
                let b = basis_offset as usize;
                dst.copy_from_slice(&basis[b..b + len]);
            }
            Op::Literal { .. } => dst.copy_from_slice(&literal_source[off..off + len]),
        }
        ranges.push((op.offset(), op.len()));
    }
    ranges.sort_unstable();
    let mut at = 0u64;
    for (off, len) in ranges {
        assert_eq!(off, at, "ops leave a gap or overlap at {at}");
        at += len;
    }
    assert_eq!(at, source_len, "ops do not reach the end of the source");
    out
}
