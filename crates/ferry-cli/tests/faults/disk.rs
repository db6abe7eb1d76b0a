//! The failing disk: a loop device over the file that the in-process
//! FUSE server ([`super::fuse`]) serves, an ext4 filesystem on it, and
//! the Drop guard that takes all of it apart again.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::common::{is_root, skip, which};
use crate::fuse::{lock, serve, Faults};

/// A loop device whose reads and writes go to an in-process FUSE server,
/// which fails them as `faults` says. Dropping it unmounts what it
/// mounted, detaches the loop device and ends the server, each by the
/// name or device it made, even when the test failed halfway.
pub struct FaultyDisk {
    /// `/dev/loopN`.
    pub dev: String,
    size: u64,
    faults: Arc<Mutex<Faults>>,
    /// The backing file the server answers from.
    pub store: PathBuf,
    fuse_mnt: PathBuf,
    /// Where the filesystem on the device is mounted, if it is.
    pub fs_mnt: PathBuf,
    fs_mounted: bool,
    fuse_mounted: bool,
    loop_attached: bool,
    server: Option<std::thread::JoinHandle<()>>,
    dir: Option<tempfile::TempDir>,
}

/// The loop device's largest request, well under one FUSE request
/// (`fuse::MAX_WRITE`), so that no request is split: a split read whose second
/// half failed would come back short, and the loop driver zero-fills a
/// short read instead of failing it.
const LOOP_MAX_SECTORS_KB: u32 = 128;

static DISKS: AtomicUsize = AtomicUsize::new(0);

pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn ok(cmd: &mut Command) {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl FaultyDisk {
    /// A zeroed disk of `size` bytes, or None (after a loud SKIPPED, a
    /// panic under CI) where this machine cannot make one.
    pub fn new(test: &str, size: u64) -> Option<FaultyDisk> {
        if !is_root() {
            skip(&format!("{test} needs root to mount and losetup"));
            return None;
        }
        for tool in ["mkfs.ext4", "filefrag", "losetup", "mount", "umount"] {
            if !which(tool) {
                skip(&format!(
                    "{test}: {tool} not installed (packages e2fsprogs, mount)"
                ));
                return None;
            }
        }
        let Ok(fuse) = OpenOptions::new().read(true).write(true).open("/dev/fuse") else {
            skip(&format!("{test}: no /dev/fuse here"));
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        File::create(&store).unwrap().set_len(size).unwrap();
        let fuse_mnt = dir.path().join("fuse");
        let fs_mnt = dir.path().join("fs");
        fs::create_dir(&fuse_mnt).unwrap();
        fs::create_dir(&fs_mnt).unwrap();
        let faults = Arc::new(Mutex::new(Faults::default()));
        let mut disk = FaultyDisk {
            dev: String::new(),
            size,
            faults: faults.clone(),
            store: store.clone(),
            fuse_mnt: fuse_mnt.clone(),
            fs_mnt,
            fs_mounted: false,
            fuse_mounted: false,
            loop_attached: false,
            server: None,
            dir: Some(dir),
        };
        let server_dev = fuse.try_clone().unwrap();
        // The kernel takes the FUSE connection from the fd that mount(2)
        // is given: the mount command's stdin. -i: no mount.fuse helper.
        let name = format!(
            "ferry-faults-{}-{}",
            std::process::id(),
            DISKS.fetch_add(1, Ordering::Relaxed)
        );
        let out = Command::new("mount")
            .args([
                "-i",
                "-t",
                "fuse",
                "-o",
                "fd=0,rootmode=40000,user_id=0,group_id=0,allow_other",
                &name,
            ])
            .arg(&fuse_mnt)
            .stdin(Stdio::from(fuse))
            .output()
            .unwrap();
        if !out.status.success() {
            skip(&format!(
                "{test}: cannot mount a FUSE filesystem here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return None;
        }
        disk.fuse_mounted = true;
        // Served from here on: /dev/fuse cannot be read before the mount.
        let backing = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&store)
            .unwrap();
        disk.server = Some(
            std::thread::Builder::new()
                .name("faulty-disk".into())
                .spawn(move || serve(server_dev, backing, size, faults))
                .unwrap(),
        );
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=off"])
            .arg(fuse_mnt.join("disk"))
            .output()
            .unwrap();
        if !out.status.success() {
            skip(&format!(
                "{test}: no loop device here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return None;
        }
        disk.dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        disk.loop_attached = true;
        let name = disk.dev.trim_start_matches("/dev/");
        fs::write(
            format!("/sys/block/{name}/queue/max_sectors_kb"),
            LOOP_MAX_SECTORS_KB.to_string(),
        )
        .expect("cap the loop device's request size");
        let kb = fs::read_to_string(format!("/sys/block/{name}/queue/max_sectors_kb")).unwrap();
        assert!(
            kb.trim().parse::<u32>().unwrap() <= LOOP_MAX_SECTORS_KB,
            "max_sectors_kb {kb}"
        );
        let mut f = File::open(&disk.dev).unwrap();
        assert_eq!(f.seek(SeekFrom::End(0)).unwrap(), disk.size, "{}", disk.dev);
        Some(disk)
    }

    /// An ext4 filesystem over the whole disk, mounted at `self.fs_mnt`.
    pub fn mkfs_and_mount(&mut self) {
        ok(Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-b",
                "4096",
                "-E",
                "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
            ])
            .arg(&self.dev));
        self.mount("rw");
    }

    pub fn mount(&mut self, opts: &str) {
        assert!(!self.fs_mounted);
        ok(Command::new("mount")
            .args(["-t", "ext4", "-o", opts, &self.dev])
            .arg(&self.fs_mnt));
        self.fs_mounted = true;
    }

    /// Unmount the filesystem: its cached pages go with it, so the next
    /// mount reads from the (failing) disk again.
    pub fn umount(&mut self) {
        assert!(self.fs_mounted);
        ok(Command::new("umount").arg(&self.fs_mnt));
        self.fs_mounted = false;
    }

    pub fn set(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.faults.lock().unwrap())
    }

    pub fn eio_counts(&self) -> (u64, u64) {
        let f = self.faults.lock().unwrap();
        (f.eio_reads, f.eio_writes)
    }

    /// With bit rot on: how many places hold the rotting block, and how
    /// many reads came back with its bit flipped.
    pub fn rot_counts(&self) -> (usize, u64) {
        let f = self.faults.lock().unwrap();
        let r = f.rot.as_ref().expect("bit rot is on");
        (r.at.len(), r.flipped_reads)
    }

    /// Where on the device the bytes `[start, end)` of `file` (on the
    /// mounted filesystem) live, from `filefrag -e`.
    pub fn device_ranges(&self, file: &Path, start: u64, end: u64) -> Vec<(u64, u64)> {
        let out = run(Command::new("filefrag").args(["-e", "-s"]).arg(file));
        assert!(out.status.success(), "filefrag {}", file.display());
        let text = String::from_utf8_lossy(&out.stdout);
        let bs: u64 = text
            .split("blocks of ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no block size in filefrag output:\n{text}"));
        let mut ranges = Vec::new();
        for line in text.lines() {
            // "   0:        0..    1023:      34816..     35839:   1024:  last,eof"
            let l = line.trim_start();
            let Some((idx, rest)) = l.split_once(':') else {
                continue;
            };
            if idx.parse::<u64>().is_err() {
                continue;
            }
            let n: Vec<u64> = rest
                .replace("..", " ")
                .replace(':', " ")
                .split_whitespace()
                .take(4)
                .map(|t| t.parse().unwrap())
                .collect();
            let (log0, log1, phys0) = (n[0] * bs, (n[1] + 1) * bs, n[2] * bs);
            let (a, b) = (start.max(log0), end.min(log1));
            if a < b {
                ranges.push((phys0 + (a - log0), phys0 + (b - log0)));
            }
        }
        let covered: u64 = ranges.iter().map(|(a, b)| b - a).sum();
        assert_eq!(
            covered,
            end - start,
            "extents of {}:\n{text}",
            file.display()
        );
        ranges
    }
}

impl Drop for FaultyDisk {
    fn drop(&mut self) {
        // Whatever happened, the disk works again while it is taken apart.
        {
            let mut f = lock(&self.faults);
            f.bad_reads.clear();
            f.writes_fail = false;
            f.rot = None;
        }
        let mut clean = true;
        if self.fs_mounted {
            let st = Command::new("umount").arg(&self.fs_mnt).status();
            if !matches!(st, Ok(s) if s.success()) {
                let _ = Command::new("umount").arg("-l").arg(&self.fs_mnt).status();
                clean = false;
            }
        }
        if self.loop_attached {
            let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        }
        if self.fuse_mounted {
            // The loop driver lets go of its file a moment after the
            // detach (in a work item): the mount is busy until then.
            let mut unmounted = false;
            for _ in 0..100 {
                let out = Command::new("umount").arg(&self.fuse_mnt).output();
                if matches!(&out, Ok(o) if o.status.success()) {
                    unmounted = true;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            if !unmounted {
                eprintln!(
                    "faulty disk: {} still busy, unmounting lazily",
                    self.fuse_mnt.display()
                );
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(&self.fuse_mnt)
                    .status();
                clean = false;
            }
        }
        // The server ends when its connection does (the FUSE unmount);
        // after a lazy unmount it may live on, so it is not waited for.
        if let Some(h) = self.server.take() {
            if clean {
                let _ = h.join();
            }
        }
        if !clean {
            // Never delete through a mount point that is still there.
            if let Some(d) = self.dir.take() {
                let _ = d.keep();
            }
        }
    }
}
