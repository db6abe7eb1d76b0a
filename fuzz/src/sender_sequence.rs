//! `sender_sequence`: ferry's real sender ([`run_sender`]) against a
//! receiver played by the input (the other direction of
//! `receiver_sequence`: a push to a hostile server).
//!
//! Input: `flags`, then records, each a message body decoded with the real
//! codec (undecodable ones skipped; at most 64). The harness sends `Hello`
//! first (unless `flags & 1`), then the messages (`Want`, `Signature`,
//! `EndOfList`, `ReceiverDone`, …), then hangs up. `flags & 2`: an
//! in-process link (no segment digests). As a real receiver, the harness
//! sends its first message and then waits for the sender's whole list
//! (`EndOfList`, at most a second) before the rest, unless `flags & 4`.
//!
//! The source is a small fixed tree (see [`source_files`]), made once per
//! process. Asserted:
//!
//! * the sender returns (within [`crate::util::DEADLINE`]), never panics,
//!   and never changes the source tree;
//! * it sends data only for files that were asked for: every `Data`,
//!   `Zero`, `Copy`, `SegmentDone` and `Holes` names a file of its own
//!   list that a `Want` named, lies within the file as listed, and `Data`
//!   carries the file's real bytes, `Zero` and `Holes` cover real zeros
//!   (`Holes` only for a file asked for whole), and each segment is
//!   finished once per request;
//! * a `Copy` comes only for a file asked for as a delta whose signature
//!   was completed, lies within the signed basis, keeps its offset under
//!   `DeltaInPlace`, and (for a single consistent signature) claims only
//!   source bytes whose block hashes are the signature's;
//! * with digests on, and always for a file asked to resume (`Have`), a
//!   `SegmentDone` carries the digest of the segment's real bytes (so a
//!   segment held with another digest is never passed over);
//! * success is returned only for a `ReceiverDone` sent, and is that report.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, OnceLock};
use std::thread;

use ferry_core::sender::run_sender;
use ferry_core::{SourceSpec, Stats, SyncOptions};
use ferry_link::layout::{self, SegmentHasher};
use ferry_link::{Endpoint, EntryKind, Message, SignaturePart, WantMode};

use crate::util::{await_done, records};

/// The source tree: regular files by path (a symlink `l` -> `a` and a hard
/// link `h` to `a` besides).
pub fn source_files() -> Vec<(&'static str, Vec<u8>)> {
    let text = |n: usize, seed: &str| -> Vec<u8> {
        format!("{seed} ferry moves data between hosts; ")
            .into_bytes()
            .into_iter()
            .cycle()
            .take(n)
            .collect()
    };
    let mut z = vec![0u8; 70_000];
    z.extend_from_slice(&text(70_000, "z"));
    // Sparse (written so): two segments of holes, data in the third and
    // in the short fourth; its holes may go as one `Holes`.
    let seg = layout::SEGMENT as usize;
    let mut s = vec![0u8; 3 * seg + 5000];
    s[2 * seg + 4096..2 * seg + 9096].copy_from_slice(&text(5000, "s"));
    s[3 * seg..].copy_from_slice(&text(5000, "t"));
    vec![
        ("a", text(5000, "a")),
        ("empty", Vec::new()),
        ("holes", s),
        ("sub/c", text(20_000, "c")),
        ("z", z),
    ]
}

/// Write `c` at `p` with holes where it has 64 KiB of zeros on 64 KiB
/// boundaries.
fn write_sparse(p: &Path, c: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = fs::File::create(p).expect("source file");
    f.set_len(c.len() as u64).expect("size");
    for (i, chunk) in c.chunks(1 << 16).enumerate() {
        if !layout::is_zero(chunk) {
            f.write_all_at(chunk, (i << 16) as u64).expect("write");
        }
    }
}

struct Source {
    root: PathBuf,
    files: HashMap<Vec<u8>, Vec<u8>>,
    snapshot: Vec<String>,
}

fn snapshot(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = fs::symlink_metadata(&p) else {
            out.push(format!("{} gone", p.display()));
            continue;
        };
        let what = if m.is_dir() {
            let mut kids: Vec<_> = fs::read_dir(&p)
                .map(|r| r.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            kids.sort();
            stack.extend(kids);
            String::new()
        } else if m.file_type().is_symlink() {
            format!("-> {:?}", fs::read_link(&p).ok())
        } else {
            blake3::hash(&fs::read(&p).unwrap_or_default())
                .to_hex()
                .to_string()
        };
        out.push(format!(
            "{} {:o} {} {}.{} {} {what}",
            p.display(),
            m.mode(),
            m.len(),
            m.mtime(),
            m.mtime_nsec(),
            m.nlink()
        ));
    }
    out
}

fn source() -> &'static Source {
    static SRC: OnceLock<Source> = OnceLock::new();
    SRC.get_or_init(|| {
        let root = crate::util::process_dir("source").join("src");
        fs::create_dir_all(root.join("sub")).expect("src");
        let mut files = HashMap::new();
        for (p, c) in source_files() {
            write_sparse(&root.join(p), &c);
            files.insert(p.as_bytes().to_vec(), c);
        }
        std::os::unix::fs::symlink("a", root.join("l")).expect("symlink");
        fs::hard_link(root.join("a"), root.join("h")).expect("hard link");
        files.insert(b"h".to_vec(), files[&b"a".to_vec()].clone());
        let snapshot = snapshot(&root);
        Source {
            root,
            files,
            snapshot,
        }
    })
}

/// The sources of a run: the tree's contents (`src/`).
pub fn specs() -> Vec<SourceSpec> {
    vec![SourceSpec {
        path: source().root.clone(),
        name: Vec::new(),
        follow: false,
    }]
}

pub fn run(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut msgs: Vec<Message> = Vec::new();
    if flags & 1 == 0 {
        msgs.push(Message::Hello {
            version: ferry_link::PROTOCOL_VERSION,
            features: ferry_link::features::ALL,
        });
    }
    msgs.extend(
        records(rest)
            .filter_map(|b| ferry_link::decode(b).ok())
            .take(64),
    );
    let in_process = flags & 2 != 0;
    let (said, res) = session(msgs.clone(), in_process, flags & 4 == 0);
    if crate::util::verbose() {
        let names: Vec<_> = said.iter().map(Message::name).collect();
        eprintln!("sender_sequence: {res:?}; said {names:?}");
    }
    check(&msgs, &said, &res, in_process);
}

/// Run the sender against `msgs`; what it said and what it returned.
pub fn session(
    msgs: Vec<Message>,
    in_process: bool,
    wait_for_list: bool,
) -> (Vec<Message>, ferry_core::Result<ferry_link::ReceiverReport>) {
    let src = source();
    let opts = SyncOptions {
        in_process,
        threads: 1,
        owner: false,
        direct_io: false,
        ..Default::default()
    };
    let threads = crate::util::Threads::before();
    let (a, b) = ferry_link::in_process();
    let (done_tx, done_rx) = mpsc::channel();
    let sources = specs();
    let sender = thread::Builder::new()
        .name("fuzz sender".into())
        .spawn(move || {
            let r = run_sender(a, &sources, &opts, &Stats::default(), false);
            let _ = done_tx.send(());
            r
        })
        .expect("spawn");
    let Endpoint { tx, rx, .. } = b;
    let (listed_tx, listed) = mpsc::channel();
    let drain = thread::spawn(move || {
        let mut said = Vec::new();
        while let Ok(m) = rx.recv() {
            if matches!(m, Message::EndOfList) {
                let _ = listed_tx.send(());
            }
            said.push(m);
        }
        said
    });
    for (i, m) in msgs.into_iter().enumerate() {
        if i == 1 && wait_for_list {
            let _ = listed.recv_timeout(std::time::Duration::from_secs(1));
        }
        if tx.send(m).is_err() {
            break;
        }
    }
    drop(tx);
    await_done(&done_rx, "the sender");
    let res = sender.join().expect("the sender panicked");
    let said = drain.join().expect("drain");
    threads.settle("the sender");
    assert_eq!(
        snapshot(&src.root),
        src.snapshot,
        "the sender CHANGED its source tree"
    );
    (said, res)
}

/// One `Signature` message: (block size, basis size, first block, weak,
/// strong, last).
type SigPart = (u32, u64, u64, Vec<u64>, Vec<[u8; 16]>, bool);

/// What the harness asked of one file.
#[derive(Default)]
struct Asked {
    modes: Vec<WantMode>,
    /// Signature messages for the file, in order.
    sig: Vec<SigPart>,
}

fn check(
    msgs: &[Message],
    said: &[Message],
    res: &ferry_core::Result<ferry_link::ReceiverReport>,
    in_process: bool,
) {
    let src = source();
    let mut asked: HashMap<u32, Asked> = HashMap::new();
    let mut done_sent = None;
    for m in msgs {
        match m {
            Message::Want { file, mode } => asked.entry(*file).or_default().modes.push(*mode),
            Message::Signature(SignaturePart {
                file,
                block_size,
                basis_size,
                first_block,
                weak,
                strong,
                last,
            }) => asked.entry(*file).or_default().sig.push((
                *block_size,
                *basis_size,
                *first_block,
                weak.clone(),
                strong.clone(),
                *last,
            )),
            Message::ReceiverDone(r) if done_sent.is_none() => done_sent = Some(r.clone()),
            _ => {}
        }
    }
    if let Ok(r) = res {
        match &done_sent {
            Some(sent) => assert_eq!(**sent, *r, "the sender returned a report it was not sent"),
            None => panic!("the sender succeeded without a ReceiverDone: {r:?}"),
        }
    }
    let mut entries: HashMap<u32, (Vec<u8>, EntryKind, u64)> = HashMap::new();
    let mut digests_seen: HashMap<(u32, u32), usize> = HashMap::new();
    for m in said {
        let (file, range) = match m {
            Message::Entry(e) => {
                assert!(
                    !entries.contains_key(&e.id),
                    "the sender listed id {} twice",
                    e.id
                );
                if e.kind() == EntryKind::File {
                    if let Some(c) = src.files.get(&e.path) {
                        assert_eq!(e.size, c.len() as u64, "listed size of {:?}", e.path);
                    }
                }
                entries.insert(e.id, (e.path.clone(), e.kind(), e.size));
                continue;
            }
            Message::Data { file, offset, data } => (*file, (*offset, data.len() as u64)),
            Message::Zero { file, offset, len } => (*file, (*offset, *len)),
            Message::Copy {
                file, offset, len, ..
            } => (*file, (*offset, *len)),
            Message::SegmentDone { file, segment, .. } => {
                // Once per request (a delta may be asked again whole).
                let n = digests_seen.entry((*file, *segment)).or_default();
                *n += 1;
                let asked_n = asked.get(file).map_or(0, |a| a.modes.len());
                assert!(
                    *n <= asked_n,
                    "segment {segment} of file {file} finished {n} times, asked {asked_n}"
                );
                (*file, (0, 0))
            }
            Message::Holes { file, first, count } => {
                // Each segment once per request, as for SegmentDone; the
                // run must lie in the file and hold only zeros.
                let asked_n = asked.get(file).map_or(0, |a| a.modes.len());
                let size = entries.get(file).map_or(0, |e| e.2);
                let nseg = layout::segment_count(size);
                let end = u64::from(*first) + u64::from(*count);
                assert!(*count > 0 && end <= nseg, "Holes {first}+{count} of a file of {nseg} segments");
                for s in *first..*first + *count {
                    let n = digests_seen.entry((*file, s)).or_default();
                    *n += 1;
                    assert!(*n <= asked_n, "segment {s} of file {file} finished {n} times");
                }
                let (a, _) = layout::segment_range(size, u64::from(*first));
                let (_, b) = layout::segment_range(size, end - 1);
                (*file, (a, b - a))
            }
            _ => continue,
        };
        let name = m.name();
        let Some(a) = asked.get(&file) else {
            panic!("the sender sent {name} for file {file}, which was never asked for");
        };
        let (path, kind, size) = entries
            .get(&file)
            .unwrap_or_else(|| panic!("{name} for file {file}, which the sender never listed"));
        assert_eq!(*kind, EntryKind::File, "{name} for a {kind:?}");
        let content = src
            .files
            .get(path)
            .unwrap_or_else(|| panic!("{name} for unknown source file {path:?}"));
        let (off, len) = range;
        assert!(
            off.checked_add(len).is_some_and(|e| e <= *size),
            "{name} [{off}, +{len}) outside file {file} of {size} bytes"
        );
        let here = &content[off as usize..(off + len) as usize];
        match m {
            Message::Data { data, .. } => {
                assert_eq!(&data[..], here, "Data that is not the file's bytes")
            }
            Message::Zero { .. } => assert!(layout::is_zero(here), "Zero over non-zero bytes"),
            Message::Holes { .. } => {
                assert!(layout::is_zero(here), "Holes over non-zero bytes");
                assert!(
                    a.modes.contains(&WantMode::Whole),
                    "Holes for a file never asked for whole"
                );
            }
            Message::Copy {
                offset,
                basis_offset,
                len,
                ..
            } => check_copy(a, content, *offset, *basis_offset, *len),
            Message::SegmentDone {
                segment, digest, ..
            } => {
                assert!(
                    u64::from(*segment) < layout::segment_count(*size),
                    "SegmentDone {segment} of a file of {size} bytes"
                );
                // Whole files digest on a link; resumed and checked ones
                // always (the receiver checks what it kept against these).
                let whole = a.modes.iter().all(|m| *m == WantMode::Whole);
                let resumed = a
                    .modes
                    .iter()
                    .all(|m| matches!(m, WantMode::Resume | WantMode::Check));
                if (!in_process && whole) || resumed {
                    let (s, e) = layout::segment_range(*size, u64::from(*segment));
                    let mut h = SegmentHasher::new(layout::grid_block(*size));
                    h.data(&content[s as usize..e as usize]);
                    assert_eq!(h.finish().0, *digest, "wrong digest for segment {segment}");
                }
            }
            _ => {}
        }
    }
}

fn check_copy(a: &Asked, content: &[u8], offset: u64, basis_offset: u64, len: u64) {
    assert!(
        a.modes
            .iter()
            .any(|m| matches!(m, WantMode::Delta | WantMode::DeltaInPlace)),
        "Copy for a file never asked for as a delta"
    );
    let lasts: Vec<_> = a.sig.iter().filter(|s| s.5).collect();
    assert!(!lasts.is_empty(), "Copy without a completed signature");
    assert!(
        a.sig
            .iter()
            .any(|s| basis_offset.checked_add(len).is_some_and(|e| e <= s.1)),
        "Copy from [{basis_offset}, +{len}) beyond every signed basis"
    );
    if a.modes.iter().all(|m| *m == WantMode::DeltaInPlace) {
        assert_eq!(offset, basis_offset, "an in-place Copy that moves bytes");
    }
    // With one signature, rebuild it as the sender does and check the
    // claim block by block.
    if lasts.len() != 1 || !a.sig.last().is_some_and(|s| s.5) {
        return;
    }
    let (bs, basis, ..) = a.sig[0];
    let mut sig = ferry_delta::Signature::receiving(u64::from(bs), basis);
    for (_, _, first, weak, strong, _) in &a.sig {
        if sig.extend_part(*first, weak, strong).is_err() {
            return;
        }
    }
    if !sig.is_consistent() {
        return;
    }
    let bs = u64::from(bs);
    let mut done = 0;
    while done < len {
        let (o, b) = (offset + done, basis_offset + done);
        let j = b / bs;
        let blen = sig.block_len(j) - b % bs;
        let n = blen.min(len - done);
        let piece = &content[o as usize..(o + n) as usize];
        if b % bs == 0 && n == sig.block_len(j) {
            let h = ferry_delta::sig::short(&layout::block_hash(piece));
            assert_eq!(
                h, sig.strong[j as usize],
                "Copy of source [{o}, +{n}) as basis block {j}, whose hash differs"
            );
        }
        done += n;
    }
}
