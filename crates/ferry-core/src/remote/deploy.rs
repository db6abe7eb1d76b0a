//! `--deploy`: reach a host that has no ferry (or another version) by
//! putting this one there first, over the same ssh (or `-e`) command.
//!
//! One small `sh` command asks the host for its `uname -s` and `uname -m`,
//! its cache directory (`$XDG_CACHE_HOME/ferry`, else `~/.cache/ferry`)
//! and the POSIX `cksum` of `ferry-HASH` there, HASH being the first 32
//! hex digits of the binary's BLAKE3. A host of another OS or architecture
//! is refused; a copy whose CRC and size match is reused; otherwise the
//! binary goes through ssh's stdin into a temporary file in that directory
//! (0700), is checked there with `cksum` again, made 0755 and renamed into
//! place, so that an interrupted or concurrent upload never leaves a torn
//! binary under the cache name. The session then runs that path as the
//! remote ferry; its Hello checks the version.
//!
//! The decisions ([`parse_probe`], [`decide`], the uname names, the ELF and
//! Mach-O headers) are plain functions; [`deploy`] runs them over ssh.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use ferry_link::rsh::{self, Stderr};
use ferry_link::LinkError;

use crate::error::{Error, Result};

/// What [`deploy`] did.
#[derive(Debug)]
pub struct Deployed {
    /// The ferry to run on the host (`--remote-ferry`), absolute.
    pub path: String,
    /// Whether the binary went over the link this time (else the cached
    /// copy was reused).
    pub uploaded: bool,
    /// What the user should know: the upload, a dynamically linked binary.
    pub notices: Vec<String>,
}

/// Make sure `host` (reached with `rsh`) has `binary` (default: this
/// ferry) in its cache directory, uploading it when it is missing or
/// damaged; say where it is.
pub fn deploy(rsh: &str, host: &str, binary: Option<&Path>) -> Result<Deployed> {
    let os = local_os().ok_or_else(|| {
        Error::DeployRefused(format!(
            "--deploy is not supported on {}",
            std::env::consts::OS
        ))
    })?;
    let bin = Binary::open(binary, os)?;
    let probe_out = run_remote(rsh, host, PROBE, &[&bin.hash], None, "look for ferry")?;
    let probe = parse_probe(&probe_out).map_err(|e| {
        Error::NoRemote(format!(
            "--deploy: {host} gave an unexpected answer ({e}); is its login shell printing to stdout?"
        ))
    })?;
    let action = decide(host, os, &bin.target, bin.sum, &probe)?;
    let mut path = format!("{}/ferry-{}", probe.dir, bin.hash);
    let mut notices = Vec::new();
    if action != Action::Reuse {
        let sum = format!("{} {}", bin.sum.0, bin.sum.1);
        let out = run_remote(
            rsh,
            host,
            UPLOAD,
            &[&bin.hash, &sum],
            Some(&bin.read_from),
            "copy ferry",
        )?;
        let dir = parse_upload(&out).map_err(|e| {
            Error::NoRemote(format!("--deploy: {host} did not confirm the upload ({e})"))
        })?;
        path = format!("{dir}/ferry-{}", bin.hash);
        let replaced = if action == Action::Replace {
            " (the cached copy there was damaged)"
        } else {
            ""
        };
        notices.push(format!(
            "deployed ferry ({}) to {host}:{path}{replaced}",
            size(bin.sum.1)
        ));
        if bin.target.dynamic {
            notices.push(dynamic_notice(&bin.shown));
        }
    }
    Ok(Deployed {
        path,
        uploaded: action != Action::Reuse,
        notices,
    })
}

/// A binary's size, for the notice.
fn size(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    } else {
        format!("{} KiB", n.div_ceil(1024))
    }
}

fn dynamic_notice(shown: &Path) -> String {
    let build = if std::env::consts::OS == "linux" {
        format!(
            ": cargo build --profile dist --target {}-unknown-linux-musl -p ferry-cli",
            std::env::consts::ARCH
        )
    } else {
        String::new()
    };
    format!(
        "{} is dynamically linked: it runs only where a compatible libc is installed; a static build avoids that{build}",
        shown.display()
    )
}

/// The cache directory on the host: `$XDG_CACHE_HOME/ferry` when that is
/// absolute (as the XDG spec says), else `$HOME/.cache/ferry`. POSIX sh,
/// one line, no single quotes (it travels single-quoted, through whatever
/// login shell the user has).
macro_rules! cache_dir {
    () => {
        r#"case "$XDG_CACHE_HOME" in /*) d=$XDG_CACHE_HOME;; *) d=$HOME/.cache;; esac; d=$d/ferry; "#
    };
}

/// `$1`: the hash. Prints `ferry-deploy KEY=VALUE` lines: os, arch, the
/// cached copy's `cksum` (or `none`), dir.
const PROBE: &str = concat!(
    "h=$1; ",
    cache_dir!(),
    r#"f=$d/ferry-$h; s=none; if [ -f "$f" ] && [ -x "$f" ]; then s=$(cksum < "$f"); fi; "#,
    r#"printf "ferry-deploy os=%s\nferry-deploy arch=%s\nferry-deploy cached=%s\nferry-deploy dir=%s\n" "$(uname -s)" "$(uname -m)" "$s" "$d""#
);

/// `$1`: the hash, `$2`: "CRC SIZE" of the binary on stdin. Writes it to a
/// temporary file in the cache directory (0700), checks its `cksum`, and
/// renames it into place (0755); prints `ferry-deploy dir=DIR`.
const UPLOAD: &str = concat!(
    "h=$1; want=$2; set -e; umask 077; ",
    cache_dir!(),
    r#"mkdir -p "$d"; chmod 700 "$d"; t=$d/.ferry-$h.$$; "#,
    r#"trap "rm -f \"\$t\"" EXIT; trap "exit 1" HUP INT TERM PIPE; cat > "$t"; "#,
    r#"set -- $(cksum < "$t"); if [ "$1 $2" != "$want" ]; then "#,
    r#"echo "the copy arrived damaged or short ($2 bytes; CRC and size should be $want)" >&2; exit 3; fi; "#,
    r#"chmod 755 "$t"; mv -f "$t" "$d/ferry-$h"; printf "ferry-deploy dir=%s\n" "$d""#
);

/// Run `sh -c SCRIPT ferry-deploy ARGS` on `host`, with `input`'s bytes
/// on its stdin; its stdout. `what` names the step in errors.
fn run_remote(
    rsh_cmd: &str,
    host: &str,
    script: &str,
    args: &[&str],
    input: Option<&Path>,
    what: &str,
) -> Result<String> {
    let words: Vec<&str> = ["sh", "-c", script, "ferry-deploy"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let cmd = rsh::rsh_command(rsh_cmd, host, &words).map_err(|e| Error::Usage(e.to_string()))?;
    let (mut child, mut stdin, stdout) = rsh::spawn(cmd, Stderr::Tail).map_err(|e| {
        Error::Link(LinkError::Io(format!(
            "cannot run {}: {}",
            e.prog,
            crate::error::describe(&e.source)
        )))
    })?;
    // The output is a few lines: it cannot fill its pipe while we write.
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.take(1 << 20).read_to_string(&mut s);
        s
    });
    let mut sent = Ok(());
    if let Some(path) = input {
        sent = File::open(path)
            .and_then(|mut f| io::copy(&mut f, &mut stdin))
            .map(|_| ());
    }
    drop(stdin);
    let out = reader.join().unwrap_or_default();
    let status = child.wait_with_grace(std::time::Duration::MAX);
    let tail = child.stderr_tail();
    let said = if tail.is_empty() { "no message" } else { &tail };
    match status.ok().and_then(|s| s.code()) {
        Some(0) => match sent {
            Ok(()) => Ok(out),
            // Read locally; the remote did not see it all.
            Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
                Err(Error::io_op("read", input.unwrap_or(Path::new("")), e))
            }
            Err(_) => Err(Error::NoRemote(format!(
                "--deploy: {host} stopped reading the upload"
            ))),
        },
        Some(255) => Err(Error::Ssh {
            host: host.to_string(),
            said: said.to_string(),
        }),
        Some(c) => Err(Error::NoRemote(format!(
            "--deploy: cannot {what} on {host} (exit status {c}): {said}"
        ))),
        None => Err(Error::NoRemote(format!(
            "--deploy: cannot {what} on {host} (killed): {said}"
        ))),
    }
}

/// What the host said about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// `uname -s`, `uname -m`.
    pub os: String,
    pub arch: String,
    /// The cache directory, absolute.
    pub dir: String,
    pub cached: Cached,
}

/// The copy under the cache name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cached {
    Missing,
    /// Its POSIX `cksum`: CRC and size.
    Sum(u32, u64),
    /// There, but `cksum` said nothing we could read.
    Unreadable,
}

/// Read the probe's `ferry-deploy KEY=VALUE` lines (anything else, a
/// banner from a login script, is skipped).
pub fn parse_probe(out: &str) -> std::result::Result<Probe, String> {
    let get = |key: &str| {
        out.lines()
            .filter_map(|l| l.strip_prefix("ferry-deploy "))
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
            .ok_or_else(|| format!("no {key}"))
    };
    let (os, arch, dir, cached) = (get("os")?, get("arch")?, get("dir")?, get("cached")?);
    if !dir.starts_with('/') {
        return Err(format!(
            "cache directory {dir:?} is not absolute (is HOME set?)"
        ));
    }
    let cached = if cached == "none" {
        Cached::Missing
    } else {
        parse_sum(&cached).map_or(Cached::Unreadable, |(c, n)| Cached::Sum(c, n))
    };
    Ok(Probe {
        os,
        arch,
        dir,
        cached,
    })
}

/// The directory an upload confirms.
fn parse_upload(out: &str) -> std::result::Result<String, String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("ferry-deploy dir="))
        .next_back()
        .filter(|d| d.starts_with('/'))
        .map(str::to_string)
        .ok_or_else(|| "no directory".to_string())
}

/// `cksum`'s "CRC SIZE" (some add the file name; stdin has none).
fn parse_sum(s: &str) -> Option<(u32, u64)> {
    let mut w = s.split_whitespace();
    Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
}

/// What to do with the host's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The copy there is this binary: run it.
    Reuse,
    /// None there: upload.
    Upload,
    /// One there that is damaged (truncated...): upload over it.
    Replace,
}

/// Whether `target` (from its headers, for `local_os`: a uname name) runs
/// on the host `probe` describes, and then whether its copy there, if
/// any, is this binary (`sum`: its CRC and size).
pub fn decide(
    host: &str,
    local_os: &str,
    target: &Target,
    sum: (u32, u64),
    probe: &Probe,
) -> Result<Action> {
    if probe.os != local_os || !target.arch.runs_on(&probe.arch) {
        return Err(Error::DeployRefused(format!(
            "--deploy: {host} runs {} {}, this ferry is built for {local_os} {}: give a build for that host with --deploy=PATH, or install ferry there",
            probe.os, probe.arch, target.arch.name()
        )));
    }
    Ok(match probe.cached {
        Cached::Missing => Action::Upload,
        Cached::Sum(c, n) if (c, n) == sum => Action::Reuse,
        Cached::Sum(..) | Cached::Unreadable => Action::Replace,
    })
}

/// This build's OS as `uname -s` names it.
pub fn local_os() -> Option<&'static str> {
    uname_os(std::env::consts::OS)
}

/// `uname -s` of a Rust `target_os`.
pub fn uname_os(os: &str) -> Option<&'static str> {
    Some(match os {
        "linux" | "android" => "Linux",
        "macos" => "Darwin",
        "freebsd" => "FreeBSD",
        "netbsd" => "NetBSD",
        "openbsd" => "OpenBSD",
        "dragonfly" => "DragonFly",
        "illumos" | "solaris" => "SunOS",
        _ => return None,
    })
}

/// The machines a binary can be for, as its headers say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
    X86,
    Arm,
    Riscv64,
    Ppc64le,
    Ppc64,
    S390x,
    Loongarch64,
}

impl Arch {
    /// The name `uname -m` gives on Linux.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
            Arch::X86 => "i686",
            Arch::Arm => "armv7l",
            Arch::Riscv64 => "riscv64",
            Arch::Ppc64le => "ppc64le",
            Arch::Ppc64 => "ppc64",
            Arch::S390x => "s390x",
            Arch::Loongarch64 => "loongarch64",
        }
    }

    /// Whether a host whose `uname -m` is `m` runs it (the BSDs and macOS
    /// say amd64/arm64).
    pub fn runs_on(self, m: &str) -> bool {
        match self {
            Arch::X86_64 => matches!(m, "x86_64" | "amd64"),
            Arch::Aarch64 => matches!(m, "aarch64" | "arm64"),
            Arch::X86 => matches!(m, "i386" | "i486" | "i586" | "i686" | "i86pc" | "x86"),
            Arch::Arm => m.starts_with("arm") && m != "arm64",
            Arch::Riscv64 => m == "riscv64",
            Arch::Ppc64le => m == "ppc64le",
            Arch::Ppc64 => m == "ppc64",
            Arch::S390x => m == "s390x",
            Arch::Loongarch64 => m == "loongarch64",
        }
    }
}

/// What a binary's headers say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub arch: Arch,
    /// It names an ELF interpreter (the dynamic loader): it needs the
    /// host's libc.
    pub dynamic: bool,
}

/// The target of an executable for `os` (a uname name) from its first
/// bytes: the ELF header and program headers, or on macOS a Mach-O header.
pub fn inspect(b: &[u8], os: &str) -> std::result::Result<Target, String> {
    let macho = b.starts_with(&[0xcf, 0xfa, 0xed, 0xfe]) && b.len() >= 8;
    if os != "Darwin" && b.starts_with(b"\x7fELF") {
        return inspect_elf(b);
    }
    if os == "Darwin" && macho {
        // Mach-O, 64-bit, little-endian: its CPU type.
        let arch = match u32::from_le_bytes([b[4], b[5], b[6], b[7]]) {
            0x0100_0007 => Arch::X86_64,
            0x0100_000c => Arch::Aarch64,
            t => return Err(format!("a Mach-O executable for CPU type {t:#x}")),
        };
        return Ok(Target {
            arch,
            dynamic: false,
        });
    }
    Err(format!("not an executable for {os}"))
}

fn inspect_elf(b: &[u8]) -> std::result::Result<Target, String> {
    let short = || "its ELF header is cut short".to_string();
    let (bits64, little) = match (b.get(4), b.get(5)) {
        (Some(1), Some(d @ (1 | 2))) => (false, *d == 1),
        (Some(2), Some(d @ (1 | 2))) => (true, *d == 1),
        _ => return Err("an ELF file of unknown class or byte order".into()),
    };
    let u16_at = |o: usize| -> Option<u64> {
        let s: [u8; 2] = b.get(o..o + 2)?.try_into().ok()?;
        Some(if little {
            u16::from_le_bytes(s)
        } else {
            u16::from_be_bytes(s)
        } as u64)
    };
    let u32_at = |o: usize| -> Option<u64> {
        let s: [u8; 4] = b.get(o..o + 4)?.try_into().ok()?;
        Some(if little {
            u32::from_le_bytes(s)
        } else {
            u32::from_be_bytes(s)
        } as u64)
    };
    let u64_at = |o: usize| -> Option<u64> {
        let s: [u8; 8] = b.get(o..o + 8)?.try_into().ok()?;
        Some(if little {
            u64::from_le_bytes(s)
        } else {
            u64::from_be_bytes(s)
        })
    };
    let e_type = u16_at(16).ok_or_else(short)?;
    if e_type != 2 && e_type != 3 {
        return Err(format!(
            "an ELF file that is not an executable (type {e_type})"
        ));
    }
    let machine = u16_at(18).ok_or_else(short)?;
    let arch = match (machine, bits64, little) {
        (62, true, true) => Arch::X86_64,
        (183, true, true) => Arch::Aarch64,
        (3, false, true) => Arch::X86,
        (40, false, true) => Arch::Arm,
        (243, true, true) => Arch::Riscv64,
        (21, true, true) => Arch::Ppc64le,
        (21, true, false) => Arch::Ppc64,
        (22, true, false) => Arch::S390x,
        (258, true, true) => Arch::Loongarch64,
        _ => {
            return Err(format!(
                "an ELF executable for a machine ferry does not know (e_machine {machine})"
            ))
        }
    };
    let (phoff, phentsize, phnum) = if bits64 {
        (u64_at(32), u16_at(54), u16_at(56))
    } else {
        (u32_at(28), u16_at(42), u16_at(44))
    };
    let (Some(phoff), Some(size), Some(num)) = (phoff, phentsize, phnum) else {
        return Err(short());
    };
    let mut dynamic = false;
    for i in 0..num {
        // PT_INTERP: the program asks for a dynamic loader.
        let p_type = usize::try_from(phoff + i * size)
            .ok()
            .and_then(u32_at)
            .ok_or_else(|| "its program headers are not where the ELF header says".to_string())?;
        dynamic |= p_type == 3;
    }
    Ok(Target { arch, dynamic })
}

/// How much of a binary [`inspect`] reads.
const HEAD: u64 = 1 << 20;

/// The binary to upload: what it is, its name in the cache and its sum.
struct Binary {
    /// As the user knows it.
    shown: PathBuf,
    /// Where its bytes are read (this ferry: `/proc/self/exe`, which stays
    /// the running binary even if its file was replaced since).
    read_from: PathBuf,
    target: Target,
    hash: String,
    /// POSIX cksum: CRC and size.
    sum: (u32, u64),
}

impl Binary {
    fn open(given: Option<&Path>, os: &str) -> Result<Binary> {
        let (shown, read_from) = match given {
            Some(p) => (p.to_path_buf(), p.to_path_buf()),
            None => {
                let exe = std::env::current_exe()
                    .map_err(|e| Error::io_op("find", "the running ferry", e))?;
                let proc_exe = Path::new("/proc/self/exe");
                let from = if proc_exe.exists() {
                    proc_exe.to_path_buf()
                } else {
                    exe.clone()
                };
                (exe, from)
            }
        };
        let err = |op, e| Error::io_op(op, &shown, e);
        let mut f = File::open(&read_from).map_err(|e| err("open", e))?;
        let mut head = Vec::new();
        (&mut f)
            .take(HEAD)
            .read_to_end(&mut head)
            .map_err(|e| err("read", e))?;
        let target = inspect(&head, os).map_err(|why| {
            Error::DeployRefused(format!(
                "--deploy: {} is not an executable ferry can upload: {why}",
                shown.display()
            ))
        })?;
        let mut hasher = blake3::Hasher::new();
        let mut crc = Cksum::default();
        hasher.update(&head);
        crc.update(&head);
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(err("read", e)),
            };
            hasher.update(&buf[..n]);
            crc.update(&buf[..n]);
        }
        let hash = hasher.finalize().to_hex()[..32].to_string();
        Ok(Binary {
            shown,
            read_from,
            target,
            hash,
            sum: (crc.finish(), crc.len),
        })
    }
}

/// The POSIX `cksum` CRC (polynomial 0x04C11DB7, most significant bit
/// first, the length appended), what every host can compute.
#[derive(Default)]
pub struct Cksum {
    crc: u32,
    len: u64,
}

const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = (i as u32) << 24;
        let mut k = 0;
        while k < 8 {
            c = if c & 0x8000_0000 != 0 {
                (c << 1) ^ 0x04C1_1DB7
            } else {
                c << 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

impl Cksum {
    fn byte(crc: u32, b: u8) -> u32 {
        (crc << 8) ^ CRC_TABLE[((crc >> 24) as u8 ^ b) as usize]
    }

    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.crc = Self::byte(self.crc, b);
        }
        self.len += data.len() as u64;
    }

    /// The CRC `cksum` prints.
    pub fn finish(&self) -> u32 {
        let (mut crc, mut n) = (self.crc, self.len);
        while n != 0 {
            crc = Self::byte(crc, n as u8);
            n >>= 8;
        }
        !crc
    }
}

#[cfg(test)]
#[path = "deploy_tests.rs"]
mod tests;
