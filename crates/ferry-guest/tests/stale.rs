//! A disk formatted whole and partitioned later keeps the old filesystem's
//! (or swap area's) signature at offset 0 beside the new partition table:
//! sfdisk does not wipe it, and Linux goes by the table. Which one is stale
//! cannot be told, so nothing may be taken for free space. (Both images
//! were data loss before: the stale map was applied to the whole disk.)

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use ferry_guest::{map_image, MapOptions, ReadAt, RegionKind};

fn run(cmd: &str, args: &[&str], stdin: Option<&str>) {
    let mut c = Command::new(cmd)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd} (is it installed?): {e}"));
    if let Some(s) = stdin {
        c.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Img(Vec<u8>);

impl ReadAt for Img {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        self.0.as_slice().read_exact_at(buf, off)
    }
    fn size(&self) -> u64 {
        self.0.len() as u64
    }
}

/// `disk` (64 MiB, `old` at offset 0 made by `mkfs`) partitioned with one
/// partition from 1 MiB holding an ext4 with 20 MiB of data.
fn partitioned_over(dir: &Path, name: &str, mkfs: &[&str]) -> Vec<u8> {
    let data = dir.join("d");
    fs::create_dir_all(&data).unwrap();
    let bytes: Vec<u8> = (0..20u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(data.join("data.bin"), bytes).unwrap();
    let part = dir.join(format!("{name}-p1.img"));
    fs::File::create(&part).unwrap().set_len(63 << 20).unwrap();
    run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-d",
            data.to_str().unwrap(),
            part.to_str().unwrap(),
        ],
        None,
    );
    let disk = dir.join(name);
    fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
    let mut args = mkfs[1..].to_vec();
    args.push(disk.to_str().unwrap());
    run(mkfs[0], &args, None);
    run(
        "sfdisk",
        &[
            "-q",
            "--no-reread",
            "--no-tell-kernel",
            disk.to_str().unwrap(),
        ],
        Some("start=2048, type=83\n"),
    );
    let mut img = fs::read(&disk).unwrap();
    let p = fs::read(&part).unwrap();
    img[1 << 20..(1 << 20) + p.len()].copy_from_slice(&p);
    img
}

#[test]
fn a_stale_signature_beside_a_partition_table_frees_nothing() {
    let t = tempfile::tempdir().unwrap();
    for (name, mkfs) in [
        ("swap.img", &["mkswap", "-q"][..]),
        ("ext4.img", &["mkfs.ext4", "-q", "-F"][..]),
    ] {
        let img = Img(partitioned_over(t.path(), name, mkfs));
        let map = map_image(&img, &MapOptions::default()).unwrap();
        assert!(map.free.is_empty(), "{name}: {:?}", map.summary_lines());
        assert_eq!(map.regions.len(), 1, "{name}");
        match &map.regions[0].kind {
            RegionKind::Whole { why } => assert!(why.contains("stale"), "{name}: {why}"),
            other => panic!("{name}: {other:?}"),
        }
        // The same table without the stale signature maps the partition.
        let mut clean = img.0.clone();
        clean[..1 << 20].iter_mut().skip(512).for_each(|b| *b = 0);
        let map = map_image(&Img(clean), &MapOptions::default()).unwrap();
        assert!(
            matches!(map.regions[0].kind, RegionKind::Mapped { kind: "ext4", .. }),
            "{name}: {:?}",
            map.summary_lines()
        );
    }
}
