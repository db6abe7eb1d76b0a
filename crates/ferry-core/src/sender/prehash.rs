//! The pre-hash thread: hashes big delta sources on the delta grid while
//! the receiver still signs its old copy, so that segments found in place
//! go early (see [`crate::early`]), and which files are worth it.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crossbeam_channel::Receiver;
use ferry_link::layout;

use super::open::open_listed;
use super::SrcFile;

/// Delta sources smaller than this are not pre-hashed.
const PREHASH_MIN: u64 = 4 << 20;

/// Whether a file asked for as a delta is pre-hashed: not a source kept
/// open (an NBD export, read only where it must be), not a small one, and
/// only when its delta blocks tile a segment exactly (early segments are
/// whole segments of whole blocks).
pub(super) fn worth_prehashing(kept_open: bool, size: u64) -> bool {
    !kept_open && size >= PREHASH_MIN && layout::SEGMENT.is_multiple_of(layout::delta_block(size))
}

/// Hash the delta sources sent by the request thread on the delta grid,
/// reading around the page cache (they are read again only where they
/// changed), as far as [`crate::early::PreHash::go_on`] lets them; `over`
/// ends waits when the session ends.
pub(super) fn prehash(files: Receiver<Arc<SrcFile>>, direct_io: bool, over: &AtomicBool) {
    let mut mems = vec![Vec::new(), Vec::new()];
    for f in files {
        let r = prehash_file(&f, direct_io, &mut mems, over);
        f.prehash.finish(r.is_ok());
    }
}

/// One file's pre-hash: a reader thread reads the next segment while this
/// one hashes the last (measured with strace on the 1 GiB mangled file:
/// reading and hashing one after the other made the pre-hash, not the
/// signing or the link, what early segments waited for).
fn prehash_file(
    f: &SrcFile,
    direct_io: bool,
    mems: &mut Vec<Vec<u8>>,
    over: &AtomicBool,
) -> std::io::Result<()> {
    let h = open_listed(&f.path, &f.reach, f.ident)?;
    let r = crate::direct::Reader::listed(h, direct_io && !f.device, f.size, f.dense);
    let bs = layout::delta_block(f.size);
    let (full_tx, full_rx) = crossbeam_channel::bounded::<std::io::Result<(Vec<u8>, usize)>>(1);
    let (empty_tx, empty_rx) = crossbeam_channel::unbounded::<Vec<u8>>();
    for m in mems.drain(..) {
        let _ = empty_tx.send(m);
    }
    let (r, empty_rx) = (&r, &empty_rx);
    std::thread::scope(|s| {
        // `move`: the reader owns `full_tx`, so the loop below ends when the
        // reader does.
        s.spawn(move || {
            for seg in 0..layout::segment_count(f.size) {
                if !f.prehash.go_on(over) {
                    break;
                }
                let (start, end) = layout::segment_range(f.size, seg);
                let len = (end - start) as usize;
                let mut mem = empty_rx.recv().unwrap_or_default();
                let read = r.read_exact_at(crate::direct::aligned(&mut mem, len), start);
                let failed = read.is_err();
                if full_tx.send(read.map(|()| (mem, len))).is_err() || failed {
                    break;
                }
            }
        });
        let mut res = Ok(());
        for got in &full_rx {
            match got {
                Ok((mut mem, len)) => {
                    f.prehash.push(
                        crate::direct::aligned(&mut mem, len)
                            .chunks(bs as usize)
                            .map(layout::block_hash),
                    );
                    let _ = empty_tx.send(mem);
                }
                Err(e) => res = Err(e),
            }
        }
        res
    })?;
    mems.extend(empty_rx.try_iter());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_big_files_read_by_path_are_prehashed() {
        assert!(!worth_prehashing(false, 0));
        assert!(!worth_prehashing(false, PREHASH_MIN - 1));
        assert!(worth_prehashing(false, PREHASH_MIN));
        // Even the largest delta block (for the largest files) tiles a
        // segment: no size is too big.
        assert!(worth_prehashing(false, 1 << 30));
        assert!(worth_prehashing(false, u64::MAX / 2));
        // An NBD export is never pre-hashed, however big.
        assert!(!worth_prehashing(true, PREHASH_MIN));
        assert!(!worth_prehashing(true, 1 << 40));
    }
}
