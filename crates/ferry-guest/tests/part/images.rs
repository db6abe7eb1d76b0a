//! Real images for the partition table tests, made by the real tools.

use ferry_guest::part::Table;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub const MIB: u64 = 1 << 20;
pub const UNKNOWN_GUID: &str = "ABABABAB-ABAB-ABAB-ABAB-ABABABABABAB";

/// Run a tool; a missing or failing tool fails the test.
pub fn tool(name: &str, args: &[&str], stdin: Option<&str>) -> String {
    let mut cmd = Command::new(name);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{name} is needed by this test and could not be run: {e}"));
    if let Some(input) = stdin {
        let mut w = child.stdin.take().expect("stdin");
        w.write_all(input.as_bytes()).expect("writing to the tool");
    }
    let out = child.wait_with_output().expect("waiting for the tool");
    assert!(
        out.status.success(),
        "{name} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn sparse_file(path: &Path, size: u64) {
    std::fs::File::create(path)
        .and_then(|f| f.set_len(size))
        .expect("creating an image");
}

/// Write `part` into `img` at `sector` (512-byte sectors), as dd does.
pub fn dd_into(img: &Path, part: &Path, sector: u64) {
    tool(
        "dd",
        &[
            &format!("if={}", part.display()),
            &format!("of={}", img.display()),
            "bs=512",
            &format!("seek={sector}"),
            "conv=notrunc",
            "status=none",
        ],
        None,
    );
}

/// A swap area of `size` bytes with pages of `ps` bytes, made by mkswap
/// in its own file: the file, and the usable size mkswap reports.
pub fn mkswap(dir: &Path, name: &str, size: u64, ps: u64) -> (PathBuf, u64) {
    let path = dir.join(name);
    sparse_file(&path, size);
    let out = tool(
        "mkswap",
        &["-p", &ps.to_string(), path.to_str().expect("path")],
        None,
    );
    // "Setting up swapspace version 1, size = 8 MiB (8384512 bytes)"
    let bytes = out
        .split('(')
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("mkswap's output: {out}"));
    (path, bytes)
}

pub fn mkfs_ext4(dir: &Path, size: u64) -> PathBuf {
    let path = dir.join("ext4.part");
    sparse_file(&path, size);
    tool(
        "mkfs.ext4",
        &["-q", "-F", path.to_str().expect("path")],
        None,
    );
    path
}

/// One partition as the tools list it: number, start and size in bytes,
/// and type.
#[derive(Debug, PartialEq, Eq)]
pub struct Listed {
    pub number: u32,
    pub start: u64,
    pub len: u64,
    pub kind: String,
}

/// `sfdisk --json`, extended containers left out.
pub fn sfdisk_json(img: &Path) -> Vec<Listed> {
    let out = tool("sfdisk", &["--json", img.to_str().expect("path")], None);
    let v: serde_json::Value = serde_json::from_str(&out).expect("sfdisk's JSON");
    let t = &v["partitiontable"];
    let ss = t["sectorsize"].as_u64().expect("sectorsize");
    let mut out = Vec::new();
    for p in t["partitions"].as_array().expect("partitions") {
        let kind = p["type"].as_str().expect("type").to_string();
        if ["5", "f", "85"].contains(&kind.as_str()) {
            continue;
        }
        let node = p["node"].as_str().expect("node");
        let digits = node.len() - node.chars().rev().take_while(char::is_ascii_digit).count();
        out.push(Listed {
            number: node[digits..].parse().expect("partition number"),
            start: p["start"].as_u64().expect("start") * ss,
            len: p["size"].as_u64().expect("size") * ss,
            kind,
        });
    }
    out.sort_by_key(|p| p.start);
    out
}

/// Our table in the tools' terms, the type named as we name it.
pub fn ours(t: &Table) -> Vec<Listed> {
    t.parts
        .iter()
        .map(|p| Listed {
            number: p.number,
            start: p.start,
            len: p.len,
            kind: p.type_name.clone(),
        })
        .collect()
}

/// The tools' types, named as the table names them.
pub fn named(listed: Vec<Listed>) -> Vec<Listed> {
    let name = |k: &str| -> String {
        match k {
            "83" => "Linux".into(),
            "82" => "Linux swap".into(),
            "0FC63DAF-8483-4772-8E79-3D69D8477DE4" => "Linux filesystem".into(),
            "0657FD6D-A4AB-43C4-84E5-0933C84B4F4F" => "Linux swap".into(),
            "C12A7328-F81F-11D2-BA4B-00A0C93EC93B" => "EFI system".into(),
            k if k.len() <= 2 => format!("type 0x{k:0>2}"),
            k => format!("type {k}"),
        }
    };
    listed
        .into_iter()
        .map(|p| Listed {
            kind: name(&p.kind),
            ..p
        })
        .collect()
}

/// A real image and what its tools said.
pub struct Built {
    pub _dir: tempfile::TempDir,
    pub path: PathBuf,
    /// Each swap partition: number, page size, usable bytes per mkswap.
    pub swaps: Vec<(u32, u64, u64)>,
}

impl Built {
    pub fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.path).expect("reading the image")
    }
}

/// MBR, 64 MiB: 1 ext4 (16M), 2 type 0xda (4M), 3 extended with logical
/// 5 (no filesystem), 6 swap (4 KiB pages), 7 swap (64 KiB pages).
pub fn mbr_image() -> Built {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mbr.img");
    sparse_file(&path, 64 * MIB);
    let script = "label: dos\n2048,16M,83\n,4M,da\n,,5\n,8M,83\n,8M,82\n,8M,82\n";
    tool(
        "sfdisk",
        &["-q", path.to_str().expect("path")],
        Some(script),
    );
    let listed = sfdisk_json(&path);
    let at = |n: u32| start_sector(&listed, n);
    dd_into(&path, &mkfs_ext4(dir.path(), 16 * MIB), at(1));
    let (s6, u6) = mkswap(dir.path(), "swap6", 8 * MIB, 4096);
    dd_into(&path, &s6, at(6));
    let (s7, u7) = mkswap(dir.path(), "swap7", 8 * MIB, 65536);
    dd_into(&path, &s7, at(7));
    Built {
        _dir: dir,
        path,
        swaps: vec![(6, 4096, u6), (7, 65536, u7)],
    }
}

/// GPT, 64 MiB: 1 ext4 (16M), 2 an unknown type (4M), 3 EFI (4M), 4 swap
/// (8M, 16 KiB pages), 5 Linux with no filesystem (4M).
pub fn gpt_image() -> Built {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gpt.img");
    sparse_file(&path, 64 * MIB);
    let t2 = format!("-t2:{UNKNOWN_GUID}");
    let args = [
        "-n1:2048:+16M",
        "-t1:8300",
        "-n2:0:+4M",
        &t2,
        "-n3:0:+4M",
        "-t3:ef00",
        "-n4:0:+8M",
        "-t4:8200",
        "-n5:0:+4M",
        "-t5:8300",
        path.to_str().expect("path"),
    ];
    tool("sgdisk", &args, None);
    let listed = sfdisk_json(&path);
    let at = |n: u32| start_sector(&listed, n);
    dd_into(&path, &mkfs_ext4(dir.path(), 16 * MIB), at(1));
    let (s4, u4) = mkswap(dir.path(), "swap4", 8 * MIB, 16384);
    dd_into(&path, &s4, at(4));
    Built {
        _dir: dir,
        path,
        swaps: vec![(4, 16384, u4)],
    }
}

/// The sectors of the EBRs, from the extended partition's start on.
pub fn ebrs(img: &[u8], ext_start: u64) -> Vec<u64> {
    let mut out = vec![ext_start];
    loop {
        let off = *out.last().expect("one") as usize * 512 + 446 + 16;
        if img[off + 4] == 0 {
            return out;
        }
        let link = u32::from_le_bytes(img[off + 8..off + 12].try_into().expect("4"));
        out.push(ext_start + u64::from(link));
    }
}

pub fn extended_start(b: &Built) -> u64 {
    let out = tool("sfdisk", &["--json", b.path.to_str().expect("path")], None);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    v["partitiontable"]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .find(|p| p["type"] == "5")
        .and_then(|p| p["start"].as_u64())
        .expect("the extended partition")
}

/// The first 512-byte sector of partition `n` as sfdisk lists it.
fn start_sector(listed: &[Listed], n: u32) -> u64 {
    listed
        .iter()
        .find(|p| p.number == n)
        .expect("partition")
        .start
        / 512
}
