//! `ferry demo`: a sample tree and sparse image, synced, changed, re-synced.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use clap::Args;
use ferry_core::{Report, SyncOptions};

use crate::{exit, human};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Keep the sample directory instead of removing it.
    #[arg(long)]
    keep: bool,
    /// Build the sample here instead of a temp dir.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// A small deterministic generator so every demo run builds the same data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
    fn text(&mut self, n: usize) -> Vec<u8> {
        const WORDS: [&str; 12] = [
            "ferry ",
            "moves ",
            "data ",
            "between ",
            "hosts ",
            "and ",
            "keeps ",
            "holes ",
            "sparse ",
            "every ",
            "byte ",
            "verified\n",
        ];
        let mut v = Vec::with_capacity(n + 16);
        while v.len() < n {
            v.extend_from_slice(WORDS[self.below(WORDS.len() as u64) as usize].as_bytes());
        }
        v.truncate(n);
        v
    }
}

const IMAGE_SIZE: u64 = 256 << 20;

fn build(src: &Path, rng: &mut Rng) -> std::io::Result<()> {
    for d in 0..10 {
        let dir = src.join(format!("dir{d:02}"));
        fs::create_dir_all(&dir)?;
        for f in 0..30 {
            let p = dir.join(format!(
                "file{f:03}.{}",
                if f % 3 == 0 { "bin" } else { "txt" }
            ));
            let data = if f % 3 == 0 {
                let n = 16_384 + rng.below(240 << 10) as usize;
                rng.bytes(n)
            } else {
                let n = 100 + rng.below(16 << 10) as usize;
                rng.text(n)
            };
            fs::write(p, data)?;
        }
    }
    fs::create_dir_all(src.join("empty"))?;
    std::os::unix::fs::symlink("dir00/file001.txt", src.join("link-to-file"))?;
    fs::hard_link(src.join("dir01/file001.txt"), src.join("hardlink.txt"))?;
    // A sparse disk image: 256 MiB, 20 MiB of data, 4 MiB of written zeros.
    let img = File::create(src.join("disk.img"))?;
    img.set_len(IMAGE_SIZE)?;
    for i in 0..10u64 {
        let off = i * (IMAGE_SIZE / 10);
        img.write_all_at(&rng.bytes(2 << 20), off)?;
    }
    img.write_all_at(&vec![0u8; 4 << 20], 100 << 20)?;
    Ok(())
}

fn change(src: &Path, rng: &mut Rng) -> std::io::Result<()> {
    // Rewrite a tenth of the files, grow a few, delete a few.
    for d in 0..10 {
        let dir = src.join(format!("dir{d:02}"));
        for f in (0..30).step_by(10) {
            let p = dir.join(format!("file{f:03}.bin"));
            let n = 16_384 + rng.below(64 << 10) as usize;
            fs::write(&p, rng.bytes(n))?;
        }
        let mut a = fs::OpenOptions::new()
            .append(true)
            .open(dir.join("file001.txt"))?;
        a.write_all(&rng.text(1000))?;
        fs::remove_file(dir.join("file029.txt"))?;
    }
    // Two new extents in the image.
    let img = fs::OpenOptions::new()
        .write(true)
        .open(src.join("disk.img"))?;
    img.write_all_at(&rng.bytes(1 << 20), 50 << 20)?;
    img.write_all_at(&rng.bytes(1 << 20), 200 << 20)?;
    Ok(())
}

/// Compare two trees: same names, types, contents and modification times.
fn same_tree(a: &Path, b: &Path) -> std::io::Result<Option<String>> {
    let mut names: Vec<_> = fs::read_dir(a)?.flatten().map(|e| e.file_name()).collect();
    names.sort();
    let mut other: Vec<_> = fs::read_dir(b)?.flatten().map(|e| e.file_name()).collect();
    other.sort();
    if names != other {
        return Ok(Some(format!(
            "{} and {} list different names",
            a.display(),
            b.display()
        )));
    }
    for n in names {
        let (pa, pb) = (a.join(&n), b.join(&n));
        let (ma, mb) = (fs::symlink_metadata(&pa)?, fs::symlink_metadata(&pb)?);
        if ma.file_type() != mb.file_type() {
            return Ok(Some(format!("{}: type differs", pb.display())));
        }
        if ma.is_dir() {
            if let Some(d) = same_tree(&pa, &pb)? {
                return Ok(Some(d));
            }
        } else if ma.is_file() {
            if fs::read(&pa)? != fs::read(&pb)?
                || ma.mtime() != mb.mtime()
                || ma.mode() != mb.mode()
            {
                return Ok(Some(format!(
                    "{}: content or metadata differs",
                    pb.display()
                )));
            }
        } else if fs::read_link(&pa)? != fs::read_link(&pb)? {
            return Ok(Some(format!("{}: link target differs", pb.display())));
        }
    }
    Ok(None)
}

pub fn run(a: DemoArgs) -> i32 {
    match demo(&a) {
        Ok(true) => exit::OK,
        Ok(false) => exit::IO,
        Err(e) => {
            errln!("ferry demo: {e}");
            exit::IO
        }
    }
}

fn demo(a: &DemoArgs) -> Result<bool, Box<dyn std::error::Error>> {
    let tmp = match &a.dir {
        Some(_) => None,
        None => Some(tempfile::Builder::new().prefix("ferry-demo-").tempdir()?),
    };
    let base = match (&a.dir, &tmp) {
        (Some(d), _) => {
            fs::create_dir_all(d)?;
            d.clone()
        }
        (None, Some(t)) => t.path().to_path_buf(),
        (None, None) => unreachable!("a temp dir is made when no --dir is given"),
    };
    let src = base.join("src");
    let dst = base.join("dst");
    let mut rng = Rng(0x5eed_f3e7);
    outln!("ferry demo: building a sample in {}", base.display());
    build(&src, &mut rng)?;
    let mut src_arg = src.clone().into_os_string();
    src_arg.push("/");
    let src_arg = PathBuf::from(src_arg);

    let opts = SyncOptions {
        delete: true,
        ..SyncOptions::default()
    };
    let mut rows: Vec<(&str, Report)> = Vec::new();
    rows.push((
        "initial sync",
        ferry_core::sync_paths(&[&src_arg], &dst, &opts)?,
    ));
    rows.push((
        "re-run, nothing changed",
        ferry_core::sync_paths(&[&src_arg], &dst, &opts)?,
    ));
    change(&src, &mut rng)?;
    rows.push((
        "after changes, --delete",
        ferry_core::sync_paths(&[&src_arg], &dst, &opts)?,
    ));

    outln!("");
    outln!(
        "{:<26} {:>6} {:>6} {:>7} {:>11} {:>11} {:>11} {:>9}",
        "run",
        "files",
        "sent",
        "deleted",
        "changed",
        "on wire",
        "written",
        "time"
    );
    for (name, r) in &rows {
        outln!(
            "{:<26} {:>6} {:>6} {:>7} {:>11} {:>11} {:>11} {:>9}",
            name,
            r.files_total,
            r.files_transferred,
            r.files_deleted,
            human::bytes(r.bytes_transferred),
            human::bytes(r.bytes_wire),
            human::bytes(r.bytes_written),
            human::secs(r.seconds)
        );
    }
    let si = fs::metadata(src.join("disk.img"))?;
    let di = fs::metadata(dst.join("disk.img"))?;
    outln!("");
    outln!(
        "disk.img: {} logical; allocated {} at the source, {} at the destination",
        human::bytes(si.len()),
        human::bytes(si.blocks() * 512),
        human::bytes(di.blocks() * 512)
    );
    let ok = match same_tree(&src, &dst)? {
        None => {
            outln!(
                "verified: destination is identical to the source (contents, modes, mtimes, links)"
            );
            true
        }
        Some(d) => {
            outln!("MISMATCH: {d}");
            false
        }
    };
    if let (true, Some(t)) = (a.keep, tmp) {
        outln!("kept {}", t.keep().display());
    }
    Ok(ok)
}
