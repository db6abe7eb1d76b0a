//! `receiver_sequence`: ferry's real receiver ([`run_receiver`]) against a
//! sender played by the input, as `crates/ferry-core/tests/hostile_peer`
//! does by hand.
//!
//! Input: `flags`, `pace`, then records, each a message body decoded with
//! the real codec (bodies that do not decode are skipped; at most
//! [`MAX_MSGS`]). The harness sends `Hello` first (unless `flags & 8`),
//! then the messages, then hangs up. Flags: 1 in-process link (whole-file
//! segments not hashed: their digests are zeros), 2 `--delete`, 4 a
//! file-or-directory destination, 16 `--delta`, 32 `--xattrs`, 64
//! `--checksum`, 128 `--inplace`. With `pace & 1` the harness paces itself
//! as a real sender does: a listed file's ops wait for the receiver's
//! `Want` of it, and `SenderDone` for the receiver's `EndOfList` (at most
//! [`GATE`] each); without, everything is sent at once. With `pace & 2`
//! the harness's `Hello` promises one walk (`features::SUBTREES`), so that
//! `--delete` deletes during the list.
//!
//! Each session runs in a fresh directory `d` holding `d/dst` (with an old
//! file `old` and `sub/x`) and `d/outside/canary`. Asserted:
//!
//! * the receiver returns (within [`crate::util::DEADLINE`]) and never
//!   panics (any panic aborts under libFuzzer);
//! * `d/outside` and its canary are untouched, `d` holds nothing new and
//!   `d/dst` never becomes a symlink;
//! * no file is committed with bytes the sender did not send: a listed
//!   regular file found at the destination holds exactly what the model of
//!   the `Data`/`Zero`/`Copy` ops sent for it says (every byte covered), or
//!   is the untouched old copy; with `--inplace` this is checked on
//!   success only;
//! * success is reported only after `SenderDone`, with every listed file
//!   present, and the report returned is the `ReceiverDone` sent.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread;

use ferry_core::listcheck::valid_rel;
use ferry_core::receiver::run_receiver;
use ferry_core::{DeltaMode, Dest, Stats, SyncOptions};
use ferry_link::layout::{segment_count, segment_range};
use ferry_link::{Endpoint, EntryKind, Message};

use crate::util::{await_done, records, scratch_dir, unlock_tree};

/// Most messages sent per input.
pub const MAX_MSGS: usize = 64;
/// Files larger than this are not modelled byte by byte.
const MODEL_CAP: u64 = 1 << 20;
/// The old file's mtime (seconds).
pub const OLD_MTIME: i64 = 1_500_000_000;

/// Contents of the old file `dst/old`.
pub fn old_content() -> Vec<u8> {
    b"ferry old basis; "
        .iter()
        .copied()
        .cycle()
        .take(3000)
        .collect()
}
/// Contents of `dst/sub/x`.
pub const SUB_X: &[u8] = b"old sub x\n";

/// How long a paced message waits for the receiver at most.
pub const GATE: std::time::Duration = std::time::Duration::from_millis(200);

pub fn run(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Some((&pace, rest)) = rest.split_first() else {
        return;
    };
    let mut msgs: Vec<Message> = Vec::new();
    if flags & 8 == 0 {
        msgs.push(Message::Hello {
            version: ferry_link::PROTOCOL_VERSION,
            features: ferry_link::features::ALL
                | if pace & 2 != 0 { ferry_link::features::SUBTREES } else { 0 },
        });
    }
    msgs.extend(
        records(rest)
            .filter_map(|b| ferry_link::decode(b).ok())
            .take(MAX_MSGS),
    );
    session(flags, pace & 1 != 0, msgs);
}

struct Layout {
    tmp: tempfile::TempDir,
    d: PathBuf,
    dst: PathBuf,
    outside: PathBuf,
    before: [String; 2],
}

fn meta(p: &Path) -> String {
    fs::symlink_metadata(p).map_or("<gone>".into(), |m| {
        let (mode, secs, ns, nlink) = (m.mode(), m.mtime(), m.mtime_nsec(), m.nlink());
        format!(
            "mode {mode:o}, mtime {secs}.{ns:09}, nlink {nlink}, size {}",
            m.len()
        )
    })
}

fn names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

impl Layout {
    fn new(make_dst: bool) -> Layout {
        let tmp = scratch_dir();
        let d = tmp.path().to_path_buf();
        let (dst, outside) = (d.join("dst"), d.join("outside"));
        if make_dst {
            fs::create_dir_all(dst.join("sub")).expect("dst");
            fs::write(dst.join("old"), old_content()).expect("old");
            fs::write(dst.join("sub/x"), SUB_X).expect("sub/x");
            let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(OLD_MTIME as u64);
            let f = fs::File::options()
                .write(true)
                .open(dst.join("old"))
                .expect("old");
            f.set_modified(when).expect("mtime");
        }
        fs::create_dir(&outside).expect("outside");
        fs::write(outside.join("canary"), b"untouched").expect("canary");
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o755)).expect("chmod");
        let before = [meta(&outside), meta(&outside.join("canary"))];
        Layout {
            tmp,
            d,
            dst,
            outside,
            before,
        }
    }

    /// What is wrong outside `dst`.
    fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let canary = self.outside.join("canary");
        if fs::read(&canary).ok().as_deref() != Some(&b"untouched"[..]) {
            out.push("canary OVERWRITTEN or GONE".to_string());
        }
        if meta(&canary) != self.before[1] || meta(&self.outside) != self.before[0] {
            out.push(format!(
                "outside metadata CHANGED: {:?} -> {:?}",
                self.before,
                [meta(&self.outside), meta(&canary)]
            ));
        }
        if names(&self.outside) != ["canary"] {
            out.push(format!("d/outside now holds {:?}", names(&self.outside)));
        }
        // A destination that became one file keeps its partial state
        // beside it (`.dst.ferry-partial`, `.dst.ferry-journal`) when the
        // run is cut short: what the next run resumes from.
        let stray: Vec<_> = names(&self.d)
            .into_iter()
            .filter(|n| {
                !matches!(
                    n.as_str(),
                    "dst" | "outside" | ".dst.ferry-partial" | ".dst.ferry-journal"
                )
            })
            .collect();
        if !stray.is_empty() {
            out.push(format!("CREATED in d beside dst: {stray:?}"));
        }
        if fs::symlink_metadata(&self.dst).is_ok_and(|m| m.file_type().is_symlink()) {
            out.push("d/dst BECAME A SYMLINK".into());
        }
        out
    }
}

/// What the sender's ops make of one regular-file entry.
struct FileModel {
    path: Vec<u8>,
    size: u64,
    buf: Option<Vec<u8>>,
    /// Sorted, disjoint byte ranges written.
    covered: Vec<(u64, u64)>,
    /// A `Copy` the model cannot follow.
    unknown: bool,
    done: HashSet<u32>,
    /// Runs of segments finished by `Holes`: `[start, end)`.
    hole_runs: Vec<(u64, u64)>,
    /// Every segment finished: later ops are refused, not applied.
    frozen: bool,
    /// The list's first entry (a file-or-directory destination).
    first: bool,
}

impl FileModel {
    fn cover(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        self.covered.push((a, b));
        self.covered.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for &(s, e) in &self.covered {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        self.covered = merged;
    }
    /// Segments finished, one by one or in runs.
    fn ndone(&self) -> u64 {
        self.done.len() as u64 + self.hole_runs.iter().map(|&(a, b)| b - a).sum::<u64>()
    }
    fn complete(&self) -> bool {
        !self.unknown && (self.size == 0 || self.covered == [(0, self.size)])
    }
}

struct Model {
    files: HashMap<u32, FileModel>,
    order: Vec<u32>,
    sender_done: bool,
}

fn build_model(msgs: &[Message], basis: &[u8], inplace: bool) -> Model {
    let mut m = Model {
        files: HashMap::new(),
        order: Vec::new(),
        sender_done: false,
    };
    let mut seen_paths = HashSet::new();
    let mut first = true;
    for msg in msgs {
        match msg {
            Message::Entry(e) => {
                let new_path = seen_paths.insert(e.path.clone());
                if e.kind() == EntryKind::File && new_path && !m.files.contains_key(&e.id) {
                    m.order.push(e.id);
                    m.files.insert(
                        e.id,
                        FileModel {
                            path: e.path.clone(),
                            size: e.size,
                            buf: (e.size <= MODEL_CAP).then(|| vec![0; e.size as usize]),
                            covered: Vec::new(),
                            unknown: false,
                            done: HashSet::new(),
                            hole_runs: Vec::new(),
                            frozen: e.size == 0,
                            first,
                        },
                    );
                }
                first = false;
            }
            Message::Data { file, offset, data } => {
                if let Some(f) = m.files.get_mut(file).filter(|f| !f.frozen) {
                    let end = offset + data.len() as u64;
                    if end <= f.size {
                        if let Some(b) = &mut f.buf {
                            b[*offset as usize..end as usize].copy_from_slice(data);
                        }
                        f.cover(*offset, end);
                    }
                }
            }
            Message::Zero { file, offset, len } => {
                if let Some(f) = m.files.get_mut(file).filter(|f| !f.frozen) {
                    let end = offset + len;
                    if end <= f.size {
                        if let Some(b) = &mut f.buf {
                            b[*offset as usize..end as usize].fill(0);
                        }
                        f.cover(*offset, end);
                    }
                }
            }
            Message::Copy {
                file,
                offset,
                basis_offset,
                len,
            } => {
                if let Some(f) = m.files.get_mut(file).filter(|f| !f.frozen) {
                    let end = offset + len;
                    let bend = basis_offset + len;
                    let known = f.path == b"old" && !inplace && bend <= basis.len() as u64;
                    if end <= f.size && known {
                        if let Some(b) = &mut f.buf {
                            let src = &basis[*basis_offset as usize..bend as usize];
                            b[*offset as usize..end as usize].copy_from_slice(src);
                        }
                        f.cover(*offset, end);
                    } else {
                        f.unknown = true;
                    }
                }
            }
            Message::SegmentDone { file, segment, .. } => {
                if let Some(f) = m.files.get_mut(file) {
                    if u64::from(*segment) < segment_count(f.size) {
                        f.done.insert(*segment);
                        if f.ndone() >= segment_count(f.size) {
                            f.frozen = true;
                        }
                    }
                }
            }
            Message::Holes { file, first, count } => {
                // Zeros over whole segments, each then finished; all or
                // none: a run past the end, over a finished segment or
                // over one that got ops is a protocol error. In time and
                // space of the messages, not of the run (a run may name
                // 2^32 segments).
                if let Some(f) = m.files.get_mut(file).filter(|f| !f.frozen) {
                    let nseg = segment_count(f.size);
                    let (s, e) = (u64::from(*first), u64::from(*first) + u64::from(*count));
                    let done = f.done.iter().any(|&d| (s..e).contains(&u64::from(d)))
                        || f.hole_runs.iter().any(|&(a, b)| a < e && s < b);
                    if e <= nseg && !done && *count > 0 {
                        let (a, _) = segment_range(f.size, s);
                        let (_, b) = segment_range(f.size, e - 1);
                        // None of the run is finished: any byte written
                        // in it is a segment under way.
                        if f.covered.iter().any(|&(x, y)| x < b && a < y) {
                            continue;
                        }
                        if let Some(buf) = &mut f.buf {
                            buf[a as usize..b as usize].fill(0);
                        }
                        f.cover(a, b);
                        f.hole_runs.push((s, e));
                        if f.ndone() >= nseg {
                            f.frozen = true;
                        }
                    }
                }
            }
            Message::SenderDone => {
                m.sender_done = true;
                break;
            }
            Message::Fatal { .. } => break,
            _ => {}
        }
    }
    m
}

/// What the receiver has said so far, for a paced sender.
#[derive(Default)]
struct Heard {
    wanted: HashSet<u32>,
    eol: bool,
    closed: bool,
}

type Ears = Arc<(Mutex<Heard>, Condvar)>;

/// Wait (at most [`GATE`]) until `ready` holds of what the receiver said.
fn wait_for(ears: &Ears, ready: impl Fn(&Heard) -> bool) {
    let (m, cv) = &**ears;
    let deadline = std::time::Instant::now() + GATE;
    let mut g = m.lock().expect("heard");
    while !g.closed && !ready(&g) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        g = cv.wait_timeout(g, left).expect("heard").0;
    }
}

/// Hold `m` as a real sender would: a listed file's ops until it is
/// wanted, `SenderDone` until the receiver's list is done.
fn pace(ears: &Ears, m: &Message, files: &HashSet<u32>, sent_eol: bool) {
    match m {
        Message::Data { file, .. }
        | Message::Zero { file, .. }
        | Message::Copy { file, .. }
        | Message::SegmentDone { file, .. }
        | Message::Holes { file, .. }
        | Message::FileFailed { file, .. }
            if files.contains(file) =>
        {
            wait_for(ears, |h| h.wanted.contains(file) || h.eol)
        }
        Message::SenderDone if sent_eol => wait_for(ears, |h| h.eol),
        _ => {}
    }
}

fn session(flags: u8, paced: bool, msgs: Vec<Message>) {
    let file_or_dir = flags & 4 != 0;
    let inplace = flags & 128 != 0;
    let l = Layout::new(!file_or_dir);
    let dest = if file_or_dir {
        Dest::FileOrDir(l.dst.clone())
    } else {
        Dest::Dir(l.dst.clone())
    };
    let opts = SyncOptions {
        in_process: flags & 1 != 0,
        delete: flags & 2 != 0,
        delta: if flags & 16 != 0 {
            DeltaMode::Delta
        } else {
            DeltaMode::Auto
        },
        xattrs: flags & 32 != 0,
        checksum: flags & 64 != 0,
        inplace,
        threads: 2,
        owner: false,
        fsync: false,
        direct_io: false,
        ..Default::default()
    };
    let threads = crate::util::Threads::before();
    let (a, b) = ferry_link::in_process();
    let (done_tx, done_rx) = mpsc::channel();
    let receiver = thread::Builder::new()
        .name("fuzz receiver".into())
        .spawn(move || {
            let r = run_receiver(b, &dest, &opts, &Stats::default());
            let _ = done_tx.send(());
            r
        })
        .expect("spawn");
    let Endpoint { tx, rx, .. } = a;
    let ears: Ears = Arc::default();
    let heard = ears.clone();
    let drain = thread::spawn(move || {
        let mut said = Vec::new();
        let note = |f: &dyn Fn(&mut Heard)| {
            f(&mut heard.0.lock().expect("heard"));
            heard.1.notify_all();
        };
        while let Ok(m) = rx.recv() {
            match &m {
                Message::Want { file, .. } => note(&|h| {
                    h.wanted.insert(*file);
                }),
                Message::EndOfList => note(&|h| h.eol = true),
                _ => {}
            }
            said.push(m);
        }
        note(&|h| h.closed = true);
        said
    });
    let model = build_model(&msgs, &old_content(), inplace);
    let mut files = HashSet::new();
    let mut sent_eol = false;
    for m in msgs {
        if paced {
            pace(&ears, &m, &files, sent_eol);
        }
        match &m {
            Message::Entry(e) if e.kind() == EntryKind::File => {
                files.insert(e.id);
            }
            Message::EndOfList => sent_eol = true,
            _ => {}
        }
        if tx.send(m).is_err() {
            break;
        }
    }
    drop(tx);
    await_done(&done_rx, "the receiver");
    let res = receiver.join().expect("the receiver panicked");
    let said = drain.join().expect("drain");
    threads.settle("the receiver");

    if crate::util::verbose() {
        eprintln!(
            "receiver_sequence: {res:?}; said {:?}",
            said.iter().map(Message::name).collect::<Vec<_>>()
        );
    }
    let mut fails = l.problems();
    let success = matches!(&res, Ok(r) if r.files_failed == 0);
    if let Ok(r) = &res {
        if !model.sender_done {
            fails.push("success reported, yet the sender never said SenderDone".into());
        }
        match said.last() {
            Some(Message::ReceiverDone(sent)) if **sent == *r => {}
            other => fails.push(format!(
                "returned {r:?} but the last message sent was {:?}",
                other.map(|m| m.name())
            )),
        }
    }
    if !file_or_dir {
        check_files(&l, &model, success, inplace, &mut fails);
    } else if let Some(f) = model.order.first().map(|id| &model.files[id]) {
        // A single file written as d/dst itself.
        if f.first && fs::symlink_metadata(&l.dst).is_ok_and(|m| m.is_file()) {
            check_one(&l.dst, f, None, success, inplace, &mut fails);
        }
    }
    unlock_tree(l.tmp.path());
    assert!(
        fails.is_empty(),
        "receiver_sequence: {res:?}\n  - {}",
        fails.join("\n  - ")
    );
}

fn check_files(l: &Layout, model: &Model, success: bool, inplace: bool, fails: &mut Vec<String>) {
    let old = old_content();
    for id in &model.order {
        let f = &model.files[id];
        if !valid_rel(&f.path) || f.path.is_empty() {
            continue;
        }
        // Only a file under real directories of dst is at its listed path
        // (a listed symlink may lead elsewhere: `outside` is checked apart).
        let mut dir = l.dst.clone();
        let comps: Vec<&[u8]> = f.path.split(|&c| c == b'/').collect();
        let real_dirs = comps[..comps.len() - 1].iter().all(|c| {
            dir.push(std::ffi::OsStr::from_bytes(c));
            fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir())
        });
        if !real_dirs {
            if success {
                fails.push(format!(
                    "SUCCESS REPORTED, yet {:?} is not below real directories",
                    f.path
                ));
            }
            continue;
        }
        let p = l.dst.join(std::ffi::OsStr::from_bytes(&f.path));
        let was: Option<&[u8]> = match &f.path[..] {
            b"old" => Some(&old),
            b"sub/x" => Some(SUB_X),
            _ => None,
        };
        check_one(&p, f, was, success, inplace, fails);
    }
}

/// One listed regular file at its destination path `p`; `was`: what the
/// path held before the run.
fn check_one(
    p: &Path,
    f: &FileModel,
    was: Option<&[u8]>,
    success: bool,
    inplace: bool,
    fails: &mut Vec<String>,
) {
    let shown = String::from_utf8_lossy(&f.path);
    let m = fs::symlink_metadata(p);
    let Some(m) = m.ok().filter(|m| m.is_file()) else {
        if success {
            fails.push(format!("SUCCESS REPORTED, yet {shown} is missing"));
        }
        return;
    };
    if inplace && !success {
        return;
    }
    let Some(want) = &f.buf else {
        if success && m.len() != f.size {
            fails.push(format!("{shown}: {} bytes, listed as {}", m.len(), f.size));
        }
        return;
    };
    let Ok(got) = fs::read(p) else { return };
    if was == Some(&got[..]) {
        return; // left as it was
    }
    if !f.complete() {
        if !f.unknown {
            fails.push(format!(
                "{shown} COMMITTED although the sender sent only {:?} of its {} bytes (success: {success})",
                f.covered, f.size
            ));
        }
        return;
    }
    if got != *want {
        fails.push(format!(
            "{shown} COMMITTED with other bytes than the sender sent ({} bytes, want {})",
            got.len(),
            want.len()
        ));
    }
}
