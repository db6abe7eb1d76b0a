#![allow(dead_code)]
//! The hostile-peer harness: the test plays a malicious *sender* by hand against
//! ferry's real receiver (`run_receiver`) over the in-process link, and
//! checks that nothing outside the destination is touched, that broken
//! protocol is refused as a protocol error, and that the receiver never
//! panics, hangs, or reports a missing file as a success.
//!
//! Every session runs in a temp dir `d` holding `d/dst` (the destination
//! root) and `d/outside` (a sibling with `canary` = b"untouched").

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ferry_core::receiver::run_receiver;
use ferry_core::{Class, Dest, Stats, SyncOptions};
use ferry_link::layout::{self, SegmentHasher};
use ferry_link::{Endpoint, Entry, EntryKind, Message, MsgTx, ReceiverReport, WantMode};

/// A receiver that has not returned by then has hung: the test fails.
pub const DEADLINE: Duration = Duration::from_secs(30);
pub const MTIME: i64 = 1_600_000_000;

/// A file list in a short notation: entries separated by `;`, each
/// `[ID#]KIND:PATH[:ARG]` with KIND `D` (ARG: octal mode), `F` (ARG: size),
/// `L` (ARG: symlink target), `H` (ARG: link_to id) or `S` (a FIFO). Ids count up from 0
/// unless given. `OUT` at the start of a path or target stands for
/// `outside`.
pub fn list(spec: &str, outside: &Path) -> Vec<Entry> {
    let out = |s: &str| match s.strip_prefix("OUT") {
        Some(rest) => format!("{}{rest}", outside.display()).into_bytes(),
        None => s.as_bytes().to_vec(),
    };
    let mut next = 0;
    let mut v = Vec::new();
    for item in spec.split(';').map(str::trim) {
        let (id, item) = match item.split_once('#') {
            Some((n, rest)) if n.parse::<u32>().is_ok() => (n.parse().unwrap(), rest),
            _ => (next, item),
        };
        next = id + 1;
        let mut f = item.splitn(3, ':');
        let (kind, path, arg) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap_or(""));
        let mut e = Entry {
            id,
            path: out(path),
            mode: 0o100644,
            mtime: MTIME,
            ..Default::default()
        };
        match kind {
            "D" => {
                e.kind = Some(EntryKind::Dir);
                e.mode = 0o040000 | u32::from_str_radix(arg, 8).unwrap_or(0o755);
            }
            "F" => (e.kind, e.size) = (Some(EntryKind::File), arg.parse().unwrap()),
            "L" => (e.kind, e.target) = (Some(EntryKind::Symlink), out(arg)),
            // A FIFO (ARG ignored): made only with -D.
            "S" => (e.kind, e.mode) = (Some(EntryKind::Special), 0o010644),
            "H" => {
                // Version 10: the link names its target by id and by path.
                e.kind = Some(EntryKind::HardLink);
                e.link_to = arg.parse().unwrap();
                e.target = v
                    .iter()
                    .find(|x: &&Entry| x.id == e.link_to)
                    .map(|x| x.path.clone())
                    .unwrap_or_default();
            }
            k => panic!("bad kind {k:?} in {spec:?}"),
        }
        v.push(e);
    }
    v
}

/// The bytes of file `id` of `size` bytes, as the fake sender sends them.
pub fn content(id: u32, size: u64) -> Vec<u8> {
    let pat = format!("file {id} pwned;");
    pat.bytes().cycle().take(size as usize).collect()
}

// ---------------------------------------------------------------- fake sender

/// The sending side, played by hand. A thread drains the receiver's
/// messages into an unbounded queue, so the link can never deadlock.
pub struct Peer {
    pub tx: MsgTx,
    pub inbox: mpsc::Receiver<Message>,
    pub log: Arc<Mutex<Vec<String>>>,
    /// Announced size of each file entry sent.
    pub sizes: HashMap<u32, u64>,
    pub real_digests: bool,
    /// What `start` announces in `Hello` (`features::ALL` unless a
    /// script says otherwise).
    pub features: u64,
    pub eol: bool,
    pub sender_done: bool,
    pub ended: bool,
}

impl Peer {
    /// A closed link is the receiver's business: sends never fail here.
    pub fn send(&mut self, m: Message) {
        let _ = self.tx.send(m);
    }

    /// The receiver's next message; `None` once it ended the session.
    pub fn recv(&mut self) -> Option<Message> {
        if self.ended {
            return None;
        }
        let m = self.inbox.recv().ok();
        self.log.lock().unwrap().push(match &m {
            None => "<link closed>".to_string(),
            Some(Message::Want { file, mode }) => format!("Want({file},{mode:?})"),
            Some(Message::Fatal { class, error }) => format!("Fatal({class:?}: {error})"),
            Some(m) => m.name().to_string(),
        });
        match &m {
            None | Some(Message::ReceiverDone(_) | Message::Fatal { .. }) => self.ended = true,
            Some(Message::EndOfList) => self.eol = true,
            _ => {}
        }
        m
    }

    /// Hello both ways, the list, `EndOfList`.
    pub fn start(&mut self, list: Vec<Entry>) {
        if !self.hello() {
            return;
        }
        self.list(list);
        self.send(Message::EndOfList);
    }

    /// `Hello` with [`Peer::features`]; whether the receiver answered one.
    pub fn hello(&mut self) -> bool {
        self.send(Message::Hello {
            version: ferry_link::PROTOCOL_VERSION,
            features: self.features,
        });
        matches!(self.recv(), Some(Message::Hello { .. }))
    }

    /// Send `list`'s entries (after `Hello`).
    pub fn list(&mut self, list: Vec<Entry>) {
        for e in list {
            if e.kind() == EntryKind::File {
                self.sizes.insert(e.id, e.size);
            }
            self.send(Message::Entry(Box::new(e)));
        }
    }

    /// Wait for the next `Want`; `None` if the session ended first.
    pub fn want(&mut self) -> Option<u32> {
        while let Some(m) = self.recv() {
            if let Message::Want { file, .. } = m {
                return Some(file);
            }
        }
        None
    }

    /// Send file `file` honestly: every segment's data, then its digest.
    pub fn send_file(&mut self, file: u32, mode: WantMode) {
        self.send_file_as(file, mode, false)
    }

    /// [`Peer::send_file`]; with `flip`, the first byte of each segment is
    /// sent flipped under the digest of the real bytes: what a source or old
    /// copy changed mid-transfer looks like.
    pub fn send_file_as(&mut self, file: u32, mode: WantMode, flip: bool) {
        let Some(&size) = self.sizes.get(&file) else {
            return self.log.lock().unwrap().push(format!("<Want {file}?>"));
        };
        let data = content(file, size);
        let block = match mode {
            WantMode::Whole | WantMode::Check => layout::grid_block(size),
            _ => layout::delta_block(size),
        };
        for seg in 0..layout::segment_count(size) {
            let (a, b) = layout::segment_range(size, seg);
            let mut h = match self.real_digests || mode != WantMode::Whole {
                true => SegmentHasher::new(block),
                false => SegmentHasher::disabled(),
            };
            for off in (a..b).step_by(1 << 20) {
                let chunk = &data[off as usize..(off + (1 << 20)).min(b) as usize];
                h.data(chunk);
                let mut sent = chunk.to_vec();
                if flip && off == a {
                    sent[0] ^= 1;
                }
                self.send(data_msg(file, off, &sent));
            }
            let digest = h.finish().0;
            let segment = seg as u32;
            self.send(Message::SegmentDone {
                file,
                segment,
                digest,
            });
        }
    }

    /// Serve honestly to the end: answer `Want`s, `SenderDone` after the
    /// receiver's `EndOfList`, then read until `ReceiverDone`/`Fatal`.
    pub fn serve(&mut self) {
        loop {
            if self.eol && !self.sender_done {
                self.sender_done = true;
                self.send(Message::SenderDone);
            }
            match self.recv() {
                Some(Message::Want { file, mode }) => self.send_file(file, mode),
                Some(_) => {}
                None => return,
            }
        }
    }
}

pub fn data_msg(file: u32, offset: u64, d: &[u8]) -> Message {
    let data = d.to_vec();
    Message::Data { file, offset, data }
}
pub fn seg_done(file: u32, segment: u32) -> Message {
    let digest = [0; 32];
    Message::SegmentDone {
        file,
        segment,
        digest,
    }
}

pub type Script = Box<dyn FnOnce(&mut Peer) + Send>;

/// The honest script: send `list`, serve it.
pub fn plain(list: Vec<Entry>) -> Script {
    Box::new(move |p| {
        p.start(list);
        p.serve();
    })
}

/// What a hostile script does with a wanted file's id.
pub type Evil = fn(&mut Peer, u32);

/// Send `list`, wait for the first `Want`, do `evil` with its file id,
/// then serve honestly to the end.
pub fn on_want(list: Vec<Entry>, evil: Evil) -> Script {
    Box::new(move |p| {
        p.start(list);
        if let Some(file) = p.want() {
            evil(p, file);
        }
        p.serve();
    })
}

pub struct Outcome {
    pub res: ferry_core::Result<ReceiverReport>,
    /// What the receiver sent, in order.
    pub said: Vec<String>,
}

impl Outcome {
    pub fn shown(&self) -> String {
        match &self.res {
            Ok(r) => format!(
                "Ok(transferred {}, failed {}, errors {:?}); receiver said {:?}",
                r.files_transferred, r.files_failed, r.errors, self.said
            ),
            Err(e) => format!("Err({:?}: {e}); receiver said {:?}", e.class(), self.said),
        }
    }
    /// Nothing when refused as a protocol error, and the receiver told the
    /// peer so (a `Fatal` of class protocol, so both sides exit 4).
    pub fn refused(&self) -> Vec<String> {
        let told = self
            .said
            .last()
            .is_some_and(|m| m.starts_with("Fatal(Protocol:"));
        match &self.res {
            Err(e) if e.class() == Class::Protocol && told => vec![],
            _ => vec![format!("NOT REFUSED as a protocol error: {}", self.shown())],
        }
    }
    /// Nothing for a protocol error, a success or a partial transfer, or an
    /// error of one of the classes in `also`.
    pub fn fine(&self, also: &[Class]) -> Vec<String> {
        let ok = |c| [Class::Protocol, Class::Partial].contains(&c) || also.contains(&c);
        match &self.res {
            Err(e) if !ok(e.class()) => vec![format!("unexpected outcome: {}", self.shown())],
            _ => vec![],
        }
    }
    pub fn succeeded(&self) -> bool {
        matches!(&self.res, Ok(r) if r.files_failed == 0)
    }
}

pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "<non-string panic>".into())
}

/// Run the real receiver against `script`. Fails the test if the receiver
/// panics or does not return within [`DEADLINE`]. Plain threads, not a
/// scope: a hung receiver is abandoned instead of hanging the test run.
pub fn session(label: &str, dest: Dest, in_process: bool, delete: bool, script: Script) -> Outcome {
    let opts = SyncOptions {
        in_process,
        delete,
        threads: 2,
        owner: false,
        ..Default::default()
    };
    session_opts(label, dest, opts, script)
}

/// [`session`] with the receiver's options given whole (the fake sender
/// sends real digests unless `opts.in_process`).
pub fn session_opts(label: &str, dest: Dest, opts: SyncOptions, script: Script) -> Outcome {
    let (a, b) = ferry_link::in_process();
    let real_digests = !opts.in_process;
    let receiver = thread::Builder::new()
        .name(format!("receiver {}", label.replace('\0', "\\0")))
        .spawn(move || run_receiver(b, &dest, &opts, &Stats::default()))
        .unwrap();
    let Endpoint { tx, rx, .. } = a;
    let (itx, inbox) = mpsc::channel();
    thread::spawn(move || {
        while let Ok(m) = rx.recv() {
            if itx.send(m).is_err() {
                break;
            }
        }
    });
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut peer = Peer {
        tx,
        inbox,
        log: log.clone(),
        sizes: HashMap::new(),
        real_digests,
        features: ferry_link::features::ALL,
        eol: false,
        sender_done: false,
        ended: false,
    };
    let sender = thread::spawn(move || script(&mut peer));
    let start = Instant::now();
    let said = || log.lock().map(|l| l.clone()).unwrap_or_default();
    while !receiver.is_finished() {
        if start.elapsed() > DEADLINE {
            panic!(
                "[{label}] receiver HUNG: no result after {DEADLINE:?}; it said {:?}",
                said()
            );
        }
        thread::sleep(Duration::from_millis(2));
    }
    let res = match receiver.join() {
        Ok(r) => r,
        Err(p) => panic!("[{label}] receiver PANICKED: {}", panic_text(&*p)),
    };
    while !sender.is_finished() {
        if start.elapsed() > DEADLINE + Duration::from_secs(5) {
            panic!("[{label}] fake sender stuck after the receiver returned");
        }
        thread::sleep(Duration::from_millis(2));
    }
    if let Err(p) = sender.join() {
        panic!("[{label}] test script panicked: {}", panic_text(&*p));
    }
    Outcome { res, said: said() }
}

// ---------------------------------------------------------------- layout

pub struct Layout {
    pub _tmp: tempfile::TempDir,
    pub d: PathBuf,
    pub dst: PathBuf,
    pub outside: PathBuf,
    /// [`meta`] of `outside` and of the canary at setup.
    pub before: [String; 2],
}

pub fn meta(p: &Path) -> String {
    fs::symlink_metadata(p).map_or("<gone>".into(), |m| {
        let (mode, secs, ns, nlink) = (m.mode(), m.mtime(), m.mtime_nsec(), m.nlink());
        format!("mode {mode:o}, mtime {secs}.{ns:09}, nlink {nlink}")
    })
}

pub fn names(p: &Path) -> Vec<String> {
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
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().to_path_buf();
        let (dst, outside) = (d.join("dst"), d.join("outside"));
        fs::create_dir(&dst).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("canary"), b"untouched").unwrap();
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o755)).unwrap();
        let before = [meta(&outside), meta(&outside.join("canary"))];
        Layout {
            _tmp: tmp,
            d,
            dst,
            outside,
            before,
        }
    }

    /// A session into `Dest::Dir(dst)`.
    pub fn run(&self, label: &str, in_process: bool, delete: bool, script: Script) -> Outcome {
        session(
            label,
            Dest::Dir(self.dst.clone()),
            in_process,
            delete,
            script,
        )
    }

    pub fn list(&self, spec: &str) -> Vec<Entry> {
        list(spec, &self.outside)
    }

    /// Everything wrong outside `dst` (`extra`: more names allowed in `d`).
    pub fn problems(&self, extra: &[&str]) -> Vec<String> {
        let mut out = Vec::new();
        let canary = self.outside.join("canary");
        let c = fs::read(&canary).map(|b| String::from_utf8_lossy(&b).into_owned());
        if c.as_ref().ok().map(|s| &**s) != Some("untouched") {
            out.push(format!("canary OVERWRITTEN or GONE: {c:?}"));
        }
        for (what, p, was) in [
            ("canary", &canary, &self.before[1]),
            ("d/outside", &self.outside, &self.before[0]),
        ] {
            if meta(p) != *was {
                let now = meta(p);
                out.push(format!("{what} metadata CHANGED: {was} -> {now}"));
            }
        }
        let new_out: Vec<_> = names(&self.outside)
            .into_iter()
            .filter(|n| n != "canary")
            .collect();
        if !new_out.is_empty() {
            out.push(format!("CREATED in d/outside: {new_out:?}"));
        }
        let ok = |n: &String| ["dst", "outside"].contains(&n.as_str()) || extra.contains(&&**n);
        let stray: Vec<_> = names(&self.d).into_iter().filter(|n| !ok(n)).collect();
        if !stray.is_empty() {
            out.push(format!("CREATED in d beside dst: {stray:?}"));
        }
        if fs::symlink_metadata(&self.dst).is_ok_and(|m| m.file_type().is_symlink()) {
            out.push(format!(
                "d/dst BECAME A SYMLINK: {:?}",
                fs::read_link(&self.dst)
            ));
        }
        out
    }
}

/// Collect one case's problems `p`, and those of its layout, under `label`.
pub fn note(fails: &mut Vec<String>, label: &str, mut p: Vec<String>, l: &Layout, extra: &[&str]) {
    p.extend(l.problems(extra));
    let label = label.replace('\0', "\\0");
    fails.extend(p.into_iter().map(|p| format!("[{label}] {p}")));
}

pub fn verdict(test: &str, fails: Vec<String>) {
    assert!(fails.is_empty(), "{test}:\n  - {}", fails.join("\n  - "));
}

/// Run each list (honest script) on a fresh layout: each must be refused
/// as a protocol error, with nothing touched outside `dst`.
pub fn refuse_all<S: AsRef<str>>(test: &str, specs: impl IntoIterator<Item = S>) {
    let mut fails = Vec::new();
    for spec in specs {
        let (l, spec) = (Layout::new(), spec.as_ref());
        let o = l.run(spec, true, false, plain(l.list(spec)));
        note(&mut fails, spec, o.refused(), &l, &[]);
    }
    verdict(test, fails);
}
