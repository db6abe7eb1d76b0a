//! A stream's output file, written around the page cache.
//!
//! `ferry recv > FILE` (or `-o FILE`) writes gigabytes that ferry never
//! reads back. Through the page cache every 4 KiB costs a fresh page, and
//! on VMs that hand free memory back to the host that is most of the
//! receiver's CPU: measured on the 2-core CI VM, 2 GiB cost 7.1-7.9 s of
//! system time, more than decrypting and decompressing them. [`FileOut`]
//! gathers the output in an aligned buffer and writes it with `O_DIRECT`
//! in 4 MiB pieces; the last partial 4 KiB goes through the page cache,
//! and the original descriptor is left positioned after the data, as
//! plain writes would have left it (a shell may write more after us).
//!
//! Anything else (a pipe, a terminal, a file opened for appending or at an
//! unaligned offset, a filesystem that refuses `O_DIRECT`) is written
//! through the original descriptor as before.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

/// Alignment of memory, offsets and lengths for `O_DIRECT`.
const ALIGN: usize = 4096;
/// Bytes gathered per direct write.
const PIECE: usize = 4 << 20;

/// The output: a file written directly where it can be, else `file` itself.
pub struct FileOut {
    file: File,
    direct: Option<File>,
    /// File offset of the first gathered byte.
    pos: u64,
    mem: Vec<u8>,
    /// Offset of the aligned start in `mem`.
    start: usize,
    fill: usize,
}

impl FileOut {
    /// Wrap `file`, writing it directly when it is a regular file at an
    /// aligned offset, not opened for appending, on a filesystem that
    /// takes `O_DIRECT`.
    pub fn new(file: File) -> FileOut {
        let direct = direct_twin(&file);
        let pos = direct
            .as_ref()
            .and_then(|_| rustix::fs::seek(&file, rustix::fs::SeekFrom::Current(0)).ok())
            .unwrap_or(0);
        let mut mem = Vec::new();
        if direct.is_some() {
            mem.resize(PIECE + ALIGN, 0);
        }
        let start = mem.as_ptr().align_offset(ALIGN).min(ALIGN);
        FileOut {
            file,
            direct,
            pos,
            mem,
            start,
            fill: 0,
        }
    }

    /// Whether the output is written around the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Write the gathered bytes: whole 4 KiB directly, with `all` the rest
    /// through the page cache too.
    fn drain(&mut self, all: bool) -> io::Result<()> {
        let n = if all {
            self.fill
        } else {
            self.fill / ALIGN * ALIGN
        };
        if n == 0 {
            return Ok(());
        }
        let aligned = n / ALIGN * ALIGN;
        let buf = &self.mem[self.start..self.start + n];
        if aligned > 0 {
            let res = match &self.direct {
                Some(d) => d.write_all_at(&buf[..aligned], self.pos),
                None => self.file.write_all_at(&buf[..aligned], self.pos),
            };
            match res {
                Err(e) if refused(&e) => {
                    // The filesystem takes no direct writes after all.
                    self.direct = None;
                    self.file.write_all_at(&buf[..aligned], self.pos)?;
                }
                r => r?,
            }
        }
        if n > aligned {
            self.file
                .write_all_at(&buf[aligned..n], self.pos + aligned as u64)?;
        }
        self.pos += n as u64;
        self.mem
            .copy_within(self.start + n..self.start + self.fill, self.start);
        self.fill -= n;
        // Leave the shared descriptor where plain writes would have.
        rustix::fs::seek(&self.file, rustix::fs::SeekFrom::Start(self.pos))?;
        Ok(())
    }
}

fn refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(c) if c == rustix::io::Errno::INVAL.raw_os_error() || c == rustix::io::Errno::OPNOTSUPP.raw_os_error())
}

/// A second descriptor for `file` with `O_DIRECT`, if it is a regular file
/// at an aligned offset and not in append mode.
fn direct_twin(file: &File) -> Option<File> {
    let m = file.metadata().ok()?;
    if !m.is_file() {
        return None;
    }
    let fl = rustix::fs::fcntl_getfl(file).ok()?;
    if fl.contains(rustix::fs::OFlags::APPEND) {
        return None;
    }
    let pos = rustix::fs::seek(file, rustix::fs::SeekFrom::Current(0)).ok()?;
    if !pos.is_multiple_of(ALIGN as u64) {
        return None;
    }
    OpenOptions::new()
        .write(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
}

impl Write for FileOut {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.direct.is_none() && self.fill == 0 {
            return self.file.write(data);
        }
        let n = data.len().min(PIECE - self.fill);
        self.mem[self.start + self.fill..self.start + self.fill + n].copy_from_slice(&data[..n]);
        self.fill += n;
        if self.fill == PIECE {
            self.drain(false)?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.drain(true)?;
        self.file.flush()
    }
}

impl Drop for FileOut {
    fn drop(&mut self) {
        // What arrived before an error is still written, as a plain write
        // would have done.
        let _ = self.drain(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom};

    #[test]
    fn writes_of_any_size_land_in_order_and_leave_the_offset_after_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("out");
        let data: Vec<u8> = (0..(3 * PIECE + 12345))
            .map(|i| (i * 31 + i / 7) as u8)
            .collect();
        let mut f = File::create(&p).expect("create");
        let mut out = FileOut::new(f.try_clone().expect("clone"));
        let mut off = 0;
        for (i, len) in [1usize, 4095, 4097, PIECE, 3, PIECE + 1]
            .iter()
            .cycle()
            .enumerate()
        {
            if off >= data.len() || i > 1000 {
                break;
            }
            let end = (off + len).min(data.len());
            out.write_all(&data[off..end]).expect("write");
            off = end;
        }
        out.flush().expect("flush");
        drop(out);
        // The shared descriptor continues after the data.
        assert_eq!(f.stream_position().expect("pos"), data.len() as u64);
        f.write_all(b"tail").expect("append");
        let mut back = Vec::new();
        File::open(&p)
            .and_then(|mut r| r.read_to_end(&mut back))
            .expect("read");
        assert_eq!(back.len(), data.len() + 4);
        assert!(back[..data.len()] == data[..], "content differs");
        assert_eq!(&back[data.len()..], b"tail");
    }

    #[test]
    fn appending_and_unaligned_files_are_written_plainly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("out");
        std::fs::write(&p, b"abc").expect("seed");
        let f = OpenOptions::new().append(true).open(&p).expect("open");
        let mut out = FileOut::new(f);
        assert!(!out.is_direct());
        out.write_all(b"def").expect("write");
        drop(out);
        let mut f = OpenOptions::new().write(true).open(&p).expect("open");
        f.seek(SeekFrom::Start(5)).expect("seek");
        let mut out = FileOut::new(f);
        assert!(!out.is_direct(), "offset 5 is not aligned");
        out.write_all(b"XY").expect("write");
        drop(out);
        assert_eq!(std::fs::read(&p).expect("read"), b"abcdeXY");
    }
}
