use ferry_link::SignaturePart;

use super::*;

/// Work for the signer thread, in the order the dispatcher queued it.
pub(super) enum SignJob {
    /// Sign the old copy of `d`, then ask for the file as a delta.
    Sign {
        d: Arc<DstFile>,
        meta: Box<fs::Metadata>,
        dest: PathBuf,
        inplace: bool,
    },
    /// Re-hash what the partial file of `d` holds and ask to resume it.
    Resume { d: Arc<DstFile>, dest: PathBuf },
    /// The sender's list is complete: answer `EndOfList`, after every
    /// `Want` queued before it.
    EndOfList,
    /// Every entry below this is decided: say so (`Decided`), after every
    /// `Want` queued before it, so that none comes after it for those.
    Decided(u32),
}

/// The share of a delta file that deltas have saved so far in this run
/// (see [`decide::delta_saving`]); a delta pays when reading the old copy
/// costs less than that share of sending the file whole.
pub(super) fn delta_saving(sh: &Shared<'_>) -> f64 {
    decide::delta_saving(
        sh.delta_done.load(Ordering::Relaxed),
        sh.stats.files_delta.load(Ordering::Relaxed),
        sh.stats.bytes_matched.load(Ordering::Relaxed),
    )
}

/// Signs old copies and asks for deltas, off the dispatcher's thread.
pub(super) fn signer(jobs: Receiver<SignJob>, sh: &Shared<'_>, tx: MsgTx) {
    for job in jobs {
        match job {
            SignJob::EndOfList => {
                if tx.send(Message::EndOfList).is_err() {
                    return;
                }
            }
            SignJob::Decided(below) => {
                if tx.send(Message::Decided { below }).is_err() {
                    return;
                }
            }
            SignJob::Resume { d, dest } => {
                if let Err(err) = super::partial::resume_and_want(&tx, &d) {
                    abandon(sh, &d, &dest, err);
                }
            }
            SignJob::Sign {
                d,
                meta,
                dest,
                inplace,
            } => {
                if let Err(err) = sign_and_want(sh, &tx, &d, &meta, &dest, inplace) {
                    abandon(sh, &d, &dest, err);
                }
            }
        }
    }
}

/// `d` could not be signed or resumed: it fails, and holds up nothing.
fn abandon(sh: &Shared<'_>, d: &DstFile, dest: &Path, err: io::Error) {
    d.fail(describe(&err));
    d.reported.store(true, Ordering::SeqCst);
    // No data will come for it: it holds up nothing.
    release_delta(d);
    let _ = sh.in_flight.wake.try_send(());
    if is_fatal_io(&err) {
        sh.set_fatal(Error::io(dest, err));
    } else {
        sh.stats.error(line(dest, &err));
    }
}

pub(super) fn sign_and_want(
    sh: &Shared<'_>,
    tx: &MsgTx,
    d: &DstFile,
    meta: &fs::Metadata,
    dest: &Path,
    inplace: bool,
) -> io::Result<()> {
    let Some(basis) = &d.basis else {
        return Err(io::Error::other("delta without an old copy"));
    };
    let size = d.entry.size;
    let id = d.entry.id;
    if !decide::still_pays(d.delta_cost, delta_saving(sh)) {
        // Deltas finished since this one was chosen say it will not pay:
        // ask for the file whole (on the whole-file digest grid).
        d.block
            .store(decide::digest_block(false, size), Ordering::SeqCst);
        d.delta.store(false, Ordering::SeqCst);
        return tx
            .send(Message::Want {
                file: id,
                mode: decide::want_mode(false, inplace),
            })
            .map_err(|err| io::Error::other(err.to_string()));
    }
    let mode = decide::want_mode(true, inplace);
    // Ask before signing: the sender reads its copy into memory while this
    // side reads the old one, so the two reads overlap. A signature that
    // then fails leaves the sender waiting for nothing it must finish.
    tx.send(Message::Want { file: id, mode })
        .map_err(|err| io::Error::other(err.to_string()))?;
    let bs = layout::delta_block(size);
    let basis_size = meta.len();
    if let Ok(mut bb) = d.basis_blocks.write() {
        bb.size = basis_size;
    }
    let key = cache_key(dest, meta, bs);
    if let Some((sig, full)) = sh.cache.as_ref().and_then(|c| c.get(&key)) {
        if let Ok(mut bb) = d.basis_blocks.write() {
            bb.weak = sig.weak.clone();
            bb.full = full;
        }
        return send_signature(tx, id, &sig, basis_size, bs);
    }
    // Signed in file order and sent as it goes: the sender copies the
    // blocks that did not move while the rest is still being read here,
    // and this side applies those copies from the page cache just filled.
    let sent = std::cell::Cell::new(0u64);
    let n = ferry_delta::Signature::block_count(basis_size, bs);
    ferry_delta::sign_file_in_order(
        basis,
        basis_size,
        bs,
        sh.opts.threads,
        |first, weak, full| {
            if let Ok(mut bb) = d.basis_blocks.write() {
                bb.weak.extend_from_slice(weak);
                bb.full.extend_from_slice(full);
            }
            let end = first + weak.len() as u64;
            sent.set(end);
            tx.send(Message::Signature(SignaturePart {
                file: id,
                block_size: bs as u32,
                basis_size,
                first_block: first,
                weak: weak.to_vec(),
                strong: full.iter().map(ferry_delta::sig::short).collect(),
                last: end == n,
            }))
            .map_err(|err| io::Error::other(err.to_string()))
        },
    )?;
    if sent.get() == 0 {
        // An empty old copy: one empty, last part.
        let sig = ferry_delta::Signature::receiving(bs, basis_size);
        send_signature(tx, id, &sig, basis_size, bs)?;
    }
    if let (Some(c), Ok(bb)) = (&sh.cache, d.basis_blocks.read()) {
        // A cache that cannot be written only costs a re-read.
        let sig = ferry_delta::Signature::from_parts(bs, basis_size, bb.weak.clone(), &bb.full);
        let _ = c.put(&key, &sig, &bb.full);
    }
    Ok(())
}

/// Send a signature in parts.
pub(super) fn send_signature(
    tx: &MsgTx,
    id: u32,
    sig: &ferry_delta::Signature,
    basis_size: u64,
    bs: u64,
) -> io::Result<()> {
    const PART: usize = 8192;
    let n = sig.weak.len();
    let mut first = 0usize;
    loop {
        let end = (first + PART).min(n);
        tx.send(Message::Signature(SignaturePart {
            file: id,
            block_size: bs as u32,
            basis_size,
            first_block: first as u64,
            weak: sig.weak[first..end].to_vec(),
            strong: sig.strong[first..end].to_vec(),
            last: end == n,
        }))
        .map_err(|err| io::Error::other(err.to_string()))?;
        if end == n {
            return Ok(());
        }
        first = end;
    }
}
