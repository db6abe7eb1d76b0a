//! `journal`: the decoder of partial-file journals
//! ([`ferry_core::journal::parse`]), whose bytes are not trusted (a
//! journal left on a shared disk can be anything).
//!
//! Input: `mode`, then a journal. With `mode & 1` the harness builds the
//! header itself from the first bytes (so that mutations reach the
//! records behind the check) and appends the rest as records under it,
//! each with its check when `mode & 2`. Whatever decodes names only
//! segments within the file, and a journal rebuilt from what was decoded
//! decodes to the same.

use ferry_core::journal::{header, parse, record, resumable, Identity, RECORD_LEN};
use ferry_link::layout;

use crate::util::Bytes;

pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let file = if mode & 1 != 0 {
        let mut b = Bytes(rest);
        let size = b.u64() >> (b.u8() % 64);
        let (mtime, mtime_nsec) = (b.u64() as i64, b.u32());
        let n = usize::from(b.u8());
        let id = Identity {
            size,
            mtime,
            mtime_nsec,
            name: b.take(n).to_vec(),
        };
        let Some((mut file, check)) = header(&id) else {
            return;
        };
        for r in b.rest().chunks(RECORD_LEN) {
            if mode & 2 != 0 && r.len() >= 40 {
                let seg = u64::from_le_bytes(r[..8].try_into().unwrap_or([0; 8]));
                let d: [u8; 32] = r[8..40].try_into().unwrap_or([0; 32]);
                file.extend_from_slice(&record(&check, seg, &d));
            } else {
                file.extend_from_slice(r);
            }
        }
        file
    } else {
        rest.to_vec()
    };
    let Ok(j) = parse(&file) else { return };
    let nseg = layout::segment_count(j.id.size);
    assert!(j.segments.keys().all(|&s| s < nseg), "segment past the end");
    let (mut again, check) = header(&j.id).expect("a decoded name fits a header");
    assert_eq!(check, j.check, "header check differs on re-encoding");
    for (s, d) in &j.segments {
        again.extend_from_slice(&record(&check, *s, d));
    }
    let k = parse(&again).expect("a rebuilt journal decodes");
    assert_eq!(k, j, "rebuilt journal decodes differently");
    let _ = resumable(&j, &j.id, j.id.size);
}
