//! Disk images built by the tests with the real tools: ext4 made by
//! `mkfs.ext4 -d` and changed by `debugfs` (no mount), partition tables by
//! `sgdisk` and `sfdisk`, swap by `mkswap`, XFS by `mkfs.xfs` and a loop
//! mount.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Run a tool; panic with its output when it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An ext4 image of `mib` MiB (4 KiB blocks) holding `files`.
pub fn ext4(dir: &Path, name: &str, mib: u64, files: &[(&str, Vec<u8>)], opts: &[&str]) -> PathBuf {
    let content = dir.join(format!("{name}.d"));
    fs::create_dir_all(&content).unwrap();
    for (f, data) in files {
        fs::write(content.join(f), data).unwrap();
    }
    let img = dir.join(name);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096"])
        .args(opts)
        .arg("-d")
        .arg(&content)
        .arg(&img)
        .arg(format!("{mib}M")));
    img
}

fn debugfs(img: &Path, write: bool, req: &str) -> String {
    let mut c = Command::new("debugfs");
    if write {
        c.arg("-w");
    }
    run(c.arg("-R").arg(req).arg(img))
}

/// The blocks (of 4 KiB) that file `name` holds.
pub fn blocks(img: &Path, name: &str) -> Vec<u64> {
    debugfs(img, false, &format!("blocks /{name}"))
        .split_whitespace()
        .map(|b| b.parse().expect("a block number"))
        .collect()
}

/// Delete `name` the way a guest does: its blocks are freed, their bytes
/// stay.
pub fn rm(img: &Path, name: &str) {
    debugfs(img, true, &format!("rm /{name}"));
}

/// Add a file to the image.
pub fn add(img: &Path, dir: &Path, name: &str, data: &[u8]) {
    let f = dir.join(format!("add-{name}"));
    fs::write(&f, data).unwrap();
    debugfs(img, true, &format!("write {} {name}", f.display()));
}

/// The content of file `name` in the image.
pub fn dump(img: &Path, dir: &Path, name: &str) -> Vec<u8> {
    let out = dir.join(format!("dump-{name}"));
    let _ = fs::remove_file(&out);
    debugfs(img, false, &format!("dump /{name} {}", out.display()));
    fs::read(&out).unwrap_or_else(|e| panic!("dump {name} from {}: {e}", img.display()))
}

/// `e2fsck -fn` finds nothing wrong.
pub fn fsck_clean(img: &Path) {
    let out = Command::new("e2fsck").arg("-fn").arg(img).output().unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn {} is not clean: {}{}",
        img.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Bytes `[off, off + len)` of a file.
pub fn read_at(path: &Path, off: u64, len: usize) -> Vec<u8> {
    let mut f = fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).unwrap();
    buf
}

/// Write `data` at `off` into `path` (which grows if needed).
pub fn write_at(path: &Path, off: u64, data: &[u8]) {
    let mut f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(data).unwrap();
}

/// Whether every 4 KiB block of `blocks` reads as zeros in `img` (at
/// `base`).
pub fn all_zero(img: &Path, base: u64, blocks: &[u64]) -> bool {
    blocks
        .iter()
        .all(|b| read_at(img, base + b * 4096, 4096).iter().all(|&x| x == 0))
}

/// Whether none of the blocks reads as zeros (the deleted data is there).
pub fn none_zero(img: &Path, base: u64, blocks: &[u64]) -> bool {
    blocks
        .iter()
        .all(|b| read_at(img, base + b * 4096, 4096).iter().any(|&x| x != 0))
}

/// Copy the file `part` into `disk` at byte `off`.
pub fn put(disk: &Path, off: u64, part: &Path) {
    write_at(disk, off, &fs::read(part).unwrap());
}

/// The block bitmap's block of group 0 (from dumpe2fs).
pub fn bitmap_block(img: &Path) -> u64 {
    let out = run(Command::new("dumpe2fs").arg(img));
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("Block bitmap at "))
        .expect("dumpe2fs lists a block bitmap");
    line.trim_start()["Block bitmap at ".len()..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a block number")
}

/// An attached loop device, detached when dropped.
pub struct Loop(pub String);

impl Loop {
    pub fn attach(img: &Path) -> Loop {
        let dev = run(Command::new("losetup").args(["-f", "--show"]).arg(img));
        Loop(dev.trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// A mounted filesystem, unmounted when dropped.
pub struct Mount(pub PathBuf);

impl Mount {
    pub fn new(img: &Path, at: &Path, ro: bool) -> Mount {
        fs::create_dir_all(at).unwrap();
        let o = if ro { "loop,ro" } else { "loop" };
        run(Command::new("mount").args(["-o", o]).arg(img).arg(at));
        Mount(at.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// After an unmount, an XFS log that xfs_repair finds clean: once in a
/// while an image just unmounted (while other tests mount theirs) still
/// reads as needing replay, and ferry rightly refuses it as in use; one
/// more mount and unmount replays it.
pub fn xfs_settle(img: &Path, at: &Path) {
    for _ in 0..3 {
        let out = Command::new("xfs_repair")
            .arg("-n")
            .arg(img)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        if !text.contains("valuable metadata changes in a log") {
            return;
        }
        drop(Mount::new(img, at, false));
    }
    panic!("{}: the XFS log stays dirty after umount", img.display());
}

/// A qemu-nbd serving an image on a unix socket, killed (by pid) when
/// dropped. Writable, it holds the image's locks as a running VM would.
pub struct QemuNbd(std::process::Child);

impl QemuNbd {
    pub fn start(img: &Path, sock: &Path, read_only: bool) -> QemuNbd {
        let mut c = Command::new("qemu-nbd");
        if read_only {
            c.arg("-r");
        }
        let child = c
            .args(["-f", "raw", "-k"])
            .arg(sock)
            .arg(img)
            .spawn()
            .unwrap();
        for _ in 0..100 {
            if sock.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        QemuNbd(child)
    }
}

impl Drop for QemuNbd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
