//! Real XFS images for the tests: built with mkfs.xfs (and a loop mount),
//! read back with xfs_db as ground truth.

#![allow(dead_code)] // each test file uses part of it

use ferry_guest::{Ranges, ReadAt};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Run a tool; its stdout. Panics (never skips) when it is missing or fails.
pub fn tool(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd} (is it installed?): {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `tool` for mount, umount and losetup: loop devices are shared with
/// whatever else runs on the machine, and setting one up can lose a race
/// (or the kernel can hold a just-unmounted one a moment): a few tries.
pub fn tool_retry(cmd: &str, args: &[&str]) -> String {
    for _ in 0..4 {
        let out = Command::new(cmd)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cmd} (is it installed?): {e}"));
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        eprintln!(
            "{cmd} {args:?} failed, trying again: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    tool(cmd, args)
}

/// stdout and stderr of a tool that may exit non-zero (xfs_repair -n).
pub fn tool_any(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd} (is it installed?): {e}"));
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A sparse file of `mib` MiB made into XFS with `args`. recent mkfs.xfs
/// refuses anything under 300 MB.
pub fn mkfs(path: &Path, mib: u64, args: &[&str]) {
    let f = File::create(path).unwrap();
    f.set_len(mib << 20).unwrap();
    drop(f);
    let mut a = vec!["-q", "-f"];
    a.extend_from_slice(args);
    let p = path.to_str().unwrap();
    a.push(p);
    tool("mkfs.xfs", &a);
}

/// A loop mount, unmounted when dropped (or by `umount`).
pub struct Mount {
    pub dir: PathBuf,
    mounted: bool,
}

impl Mount {
    pub fn new(img: &Path, dir: &Path) -> Mount {
        Mount::with(img, dir, "loop")
    }
    /// With mount options `opts`.
    pub fn with(img: &Path, dir: &Path, opts: &str) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        tool_retry(
            "mount",
            &["-o", opts, img.to_str().unwrap(), dir.to_str().unwrap()],
        );
        Mount {
            dir: dir.to_path_buf(),
            mounted: true,
        }
    }
    pub fn umount(mut self) {
        tool_retry("umount", &[self.dir.to_str().unwrap()]);
        self.mounted = false;
    }
}

/// A loop device on a file, detached when dropped.
pub struct Loop(pub String);

impl Loop {
    pub fn new(file: &Path) -> Loop {
        let dev = tool_retry("losetup", &["-f", "--show", file.to_str().unwrap()]);
        Loop(dev.trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.dir).status();
        }
    }
}

/// xorshift64*: random file contents without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(len);
        v
    }
}

/// An image file read through `ReadAt`, with bytes patched in memory, an
/// optional shorter size, and a log of the reads made.
pub struct Img {
    file: File,
    size: u64,
    pub patches: BTreeMap<u64, u8>,
    pub reads: Mutex<Vec<(u64, usize)>>,
}

impl Img {
    pub fn open(path: &Path) -> Img {
        let file = File::open(path).unwrap();
        let size = file.metadata().unwrap().len();
        Img {
            file,
            size,
            patches: BTreeMap::new(),
            reads: Mutex::new(Vec::new()),
        }
    }
    pub fn truncate(&mut self, size: u64) {
        self.size = size;
    }
    /// The bytes as read, patches applied.
    pub fn get(&self, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.read_exact_at(&mut b, off).unwrap();
        b
    }
    pub fn put(&mut self, off: u64, bytes: &[u8]) {
        for (i, &v) in bytes.iter().enumerate() {
            self.patches.insert(off + i as u64, v);
        }
    }
    pub fn put_be32(&mut self, off: u64, v: u32) {
        self.put(off, &v.to_be_bytes());
    }
    /// Recompute the XFS CRC (little-endian at `crc_off`) of `len` bytes at
    /// `off`, as if the change had been written by XFS.
    pub fn fix_crc(&mut self, off: u64, len: usize, crc_off: usize) {
        let mut b = self.get(off, len);
        b[crc_off..crc_off + 4].fill(0);
        let crc = crc32c::crc32c(&b);
        self.put(off + crc_off as u64, &crc.to_le_bytes());
    }
}

impl ReadAt for Img {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        self.reads.lock().unwrap().push((off, buf.len()));
        let end = off.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > self.size) {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.file.read_exact_at(buf, off)?;
        for (&at, &v) in self.patches.range(off..off + buf.len() as u64) {
            buf[(at - off) as usize] = v;
        }
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
}

/// `xfs_db -r` with commands.
pub fn xfs_db(img: &Path, cmds: &[&str]) -> String {
    let mut a = vec!["-r"];
    for c in cmds {
        a.push("-c");
        a.push(c);
    }
    a.push(img.to_str().unwrap());
    tool("xfs_db", &a)
}

/// `name = value` from xfs_db's print.
pub fn field(out: &str, name: &str) -> u64 {
    out.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(" = ")?;
            let v = v.trim();
            let n = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => v.parse().ok(),
            };
            (k.trim() == name).then_some(n)?
        })
        .unwrap_or_else(|| panic!("no numeric {name} in xfs_db output:\n{out}"))
}

pub fn sb_field(img: &Path, name: &str) -> u64 {
    field(&xfs_db(img, &["sb 0", &format!("print {name}")]), name)
}

pub fn agf_field(img: &Path, ag: u64, name: &str) -> u64 {
    field(
        &xfs_db(img, &[&format!("agf {ag}"), &format!("print {name}")]),
        name,
    )
}

/// The geometry the checks need.
pub struct Geo {
    pub blocksize: u64,
    pub agblocks: u64,
    pub agcount: u64,
    pub dblocks: u64,
}

impl Geo {
    pub fn of(img: &Path) -> Geo {
        Geo {
            blocksize: sb_field(img, "blocksize"),
            agblocks: sb_field(img, "agblocks"),
            agcount: sb_field(img, "agcount"),
            dblocks: sb_field(img, "dblocks"),
        }
    }
    /// Byte range of blocks `agbno..agbno+len` of AG `ag`.
    pub fn bytes(&self, ag: u64, agbno: u64, len: u64) -> (u64, u64) {
        let s = (ag * self.agblocks + agbno) * self.blocksize;
        (s, s + len * self.blocksize)
    }
}

/// `freesp -d`: every free extent xfs_db sees, free-list blocks included.
pub fn freesp(img: &Path) -> Vec<(u64, u64, u64)> {
    xfs_db(img, &["freesp -d"])
        .lines()
        .filter_map(|l| {
            let t: Vec<u64> = l
                .split_whitespace()
                .map(|w| w.parse().ok())
                .collect::<Option<_>>()?;
            (t.len() == 3).then(|| (t[0], t[1], t[2]))
        })
        .collect()
}

/// The blocks on AG `ag`'s free list (flfirst..=fllast, flcount of them).
pub fn agfl(img: &Path, ag: u64) -> Vec<u64> {
    let first = agf_field(img, ag, "flfirst");
    let count = agf_field(img, ag, "flcount");
    let out = xfs_db(img, &[&format!("agfl {ag}"), "print bno"]);
    let slots: Vec<Option<u64>> = out
        .split_once(" = ")
        .expect("agfl bno")
        .1
        .split_whitespace()
        .map(|t| t.split_once(':').unwrap().1.parse().ok())
        .collect();
    (0..count)
        .map(|k| slots[((first + k) as usize) % slots.len()].expect("null on the free list"))
        .collect()
}

/// Where a file's data is, from `xfs_db bmap`: (ag, agbno, blocks).
pub fn file_extents(img: &Path, name: &str) -> Vec<(u64, u64, u64)> {
    xfs_db(img, &[&format!("path /{name}"), "bmap"])
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once('(')?;
            let (ab, rest) = rest.split_once(')')?;
            let (a, b) = ab.split_once('/')?;
            let count = rest.split_whitespace().nth(1)?;
            Some((a.parse().ok()?, b.parse().ok()?, count.parse().ok()?))
        })
        .collect()
}

/// Whether `r` and `[s, e)` share a byte.
pub fn overlaps(r: &Ranges, s: u64, e: u64) -> bool {
    r.first_ending_after(s).is_some_and(|(rs, _)| rs < e)
}

/// Check `free_ranges` against xfs_db on a cleanly unmounted image:
/// its ranges plus the free lists are exactly `freesp -d`'s extents, never
/// a free-list block, never the log; its total is the AGFs' freeblks; and
/// the superblock's fdblocks is that total plus the free lists plus the
/// free-space trees' own blocks. Returns the map.
pub fn check_against_xfs_db(img: &Path) -> ferry_guest::map::FsMap {
    let geo = Geo::of(img);
    let m = ferry_guest::xfs::free_ranges(&Img::open(img)).expect("free_ranges");
    assert_eq!(m.kind, "xfs");
    if sb_field(img, "logstart") == 0 {
        // An external log cannot be checked from here: said, map still made.
        assert!(m
            .in_use
            .as_deref()
            .is_some_and(|w| w.contains("another device")));
    } else {
        assert_eq!(m.in_use, None, "a cleanly unmounted image");
    }

    let mut tool_free = Ranges::new();
    for (ag, bno, len) in freesp(img) {
        let (s, e) = geo.bytes(ag, bno, len);
        tool_free.push(s, e);
    }
    let mut held = Ranges::new();
    let (mut freeblks, mut flcount, mut btreeblks) = (0, 0, 0);
    for ag in 0..geo.agcount {
        for b in agfl(img, ag) {
            let (s, e) = geo.bytes(ag, b, 1);
            assert!(
                !overlaps(&m.free, s, e),
                "free-list block {ag}/{b} reported free"
            );
            held.push(s, e);
        }
        freeblks += agf_field(img, ag, "freeblks");
        flcount += agf_field(img, ag, "flcount");
        btreeblks += agf_field(img, ag, "btreeblks");
    }
    let mut ours = m.free.clone();
    ours.extend(&held);
    assert_eq!(
        ours, tool_free,
        "free ranges + free lists != xfs_db freesp -d"
    );
    assert_eq!(
        m.free.total(),
        freeblks * geo.blocksize,
        "total != sum of agf_freeblks"
    );
    assert_eq!(
        sb_field(img, "fdblocks"),
        freeblks + flcount + btreeblks,
        "sb_fdblocks = freeblks + flcount + btreeblks"
    );
    let logstart = sb_field(img, "logstart");
    if logstart != 0 {
        let logblocks = sb_field(img, "logblocks");
        let agblklog = sb_field(img, "agblklog");
        let (ag, bno) = (logstart >> agblklog, logstart & ((1 << agblklog) - 1));
        let (s, e) = geo.bytes(ag, bno, logblocks);
        assert!(!overlaps(&m.free, s, e), "the log reported free");
    }
    assert!(m.free.as_slice().last().unwrap().1 <= geo.dblocks * geo.blocksize);
    m
}

/// Whether xfs_repair -n says the log needs replaying.
/// After an unmount: the log is clean, as xfs_repair sees it. Once in a
/// while (seen twice in some 30 full runs, never alone) an image just
/// unmounted while other tests mount and unmount theirs reads as
/// needing log replay to xfs_repair too; mounting it once more and
/// unmounting replays and cleans it. The reader's own verdict on a dirty
/// log is tested separately (`in_use`).
pub fn settle_clean(img: &Path) {
    for _ in 0..3 {
        if !repair_says_dirty(img) {
            return;
        }
        eprintln!(
            "{}: xfs_repair says the log is dirty after umount; mounting once more",
            img.display()
        );
        let dir = img.with_extension("settle");
        let m = Mount::new(img, &dir);
        m.umount();
    }
    assert!(
        !repair_says_dirty(img),
        "{}: the log stays dirty after umount",
        img.display()
    );
}

pub fn repair_says_dirty(img: &Path) -> bool {
    let out = tool_any("xfs_repair", &["-n", img.to_str().unwrap()]);
    assert!(out.contains("Phase 1"), "xfs_repair -n did not run:\n{out}");
    out.contains("valuable metadata changes in a log")
}

/// 600 one-block files in one directory (so one AG), every other deleted:
/// ~300 one-block free extents in AG 0, more than a 1 KiB leaf holds, so
/// AG 0's bnobt has exactly two levels. Where the kernel puts the files
/// varies a little from run to run (about one in ten came out otherwise),
/// so the image is made again until it has that shape.
pub fn fragmented_image(img: &Path) {
    for _ in 0..5 {
        fragment_once(img);
        settle_clean(img);
        if agf_field(img, 0, "bnolevel") == 2 {
            return;
        }
        eprintln!(
            "{}: AG 0's bnobt is not two levels; making it again",
            img.display()
        );
    }
    panic!("{}: could not make AG 0's bnobt two levels", img.display());
}

fn fragment_once(img: &Path) {
    mkfs(img, 300, &["-b", "size=1024", "-m", "rmapbt=1"]);
    let dir = img.with_extension("mnt");
    let mnt = Mount::new(img, &dir);
    let mut rng = Rng(0x5eed_0003);
    for i in 0..600 {
        std::fs::write(mnt.dir.join(format!("s{i}")), rng.bytes(1024)).unwrap();
    }
    tool("sync", &[]);
    for i in (0..600).step_by(2) {
        std::fs::remove_file(mnt.dir.join(format!("s{i}"))).unwrap();
    }
    mnt.umount();
}

/// A v4 image (no CRCs) of 512-byte blocks, made by mkfs.xfs from a
/// protofile listing `n` files of random data up to `max` bytes; their
/// names.
pub fn v4_proto_image(img: &Path, n: usize, max: u64, seed: u64) -> Vec<String> {
    let dir = img.with_extension("src");
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng(seed);
    let mut proto = String::from("dummy\n0 0\nd--755 0 0\n");
    let mut names = vec![];
    for i in 0..n {
        let name = format!("p{i}");
        let path = dir.join(&name);
        let len = 1 + rng.below(max) as usize;
        std::fs::write(&path, rng.bytes(len)).unwrap();
        proto += &format!("{name} ---644 0 0 {}\n", path.display());
        names.push(name);
    }
    proto += "$\n";
    let pf = img.with_extension("proto");
    std::fs::write(&pf, proto).unwrap();
    mkfs(
        img,
        300,
        &["-m", "crc=0", "-b", "size=512", "-p", pf.to_str().unwrap()],
    );
    names
}
