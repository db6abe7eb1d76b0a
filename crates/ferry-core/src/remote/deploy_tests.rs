//! The decisions of `--deploy` as plain functions, its two sh scripts run
//! here with `sh`, and [`deploy`] end to end through a stand-in for ssh.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use super::*;
use crate::error::Class;

/// An ELF header and `phdrs` program headers of these types.
fn elf(bits64: bool, little: bool, e_type: u16, machine: u16, phdrs: &[u32]) -> Vec<u8> {
    let (ehsize, phentsize) = if bits64 { (64, 56) } else { (52, 32) };
    let mut b = vec![0u8; ehsize + phentsize * phdrs.len() + 100];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = if bits64 { 2 } else { 1 };
    b[5] = if little { 1 } else { 2 };
    b[6] = 1;
    let put16 = |b: &mut Vec<u8>, o: usize, v: u16| {
        let x = if little {
            v.to_le_bytes()
        } else {
            v.to_be_bytes()
        };
        b[o..o + 2].copy_from_slice(&x);
    };
    let put32 = |b: &mut Vec<u8>, o: usize, v: u32| {
        let x = if little {
            v.to_le_bytes()
        } else {
            v.to_be_bytes()
        };
        b[o..o + 4].copy_from_slice(&x);
    };
    put16(&mut b, 16, e_type);
    put16(&mut b, 18, machine);
    let n = phdrs.len() as u16;
    if bits64 {
        let x = if little {
            (ehsize as u64).to_le_bytes()
        } else {
            (ehsize as u64).to_be_bytes()
        };
        b[32..40].copy_from_slice(&x);
        put16(&mut b, 54, phentsize as u16);
        put16(&mut b, 56, n);
    } else {
        put32(&mut b, 28, ehsize as u32);
        put16(&mut b, 42, phentsize as u16);
        put16(&mut b, 44, n);
    }
    for (i, t) in phdrs.iter().enumerate() {
        put32(&mut b, ehsize + i * phentsize, *t);
    }
    b
}

const PT_LOAD: u32 = 1;
const PT_INTERP: u32 = 3;

#[test]
fn elf_headers_say_the_machine_and_whether_a_libc_is_needed() {
    let t = |b: &[u8]| inspect(b, "Linux");
    let x86 = t(&elf(true, true, 3, 62, &[6, PT_INTERP, PT_LOAD])).unwrap();
    assert_eq!((x86.arch, x86.dynamic), (Arch::X86_64, true));
    // A static (or static-pie) build has no interpreter.
    let stat = t(&elf(true, true, 2, 62, &[PT_LOAD, PT_LOAD])).unwrap();
    assert_eq!((stat.arch, stat.dynamic), (Arch::X86_64, false));
    assert_eq!(
        t(&elf(true, true, 3, 183, &[PT_LOAD])).unwrap().arch,
        Arch::Aarch64
    );
    assert_eq!(
        t(&elf(false, true, 2, 40, &[PT_LOAD])).unwrap().arch,
        Arch::Arm
    );
    assert_eq!(
        t(&elf(false, true, 2, 3, &[PT_INTERP])).unwrap().arch,
        Arch::X86
    );
    assert_eq!(
        t(&elf(true, false, 2, 22, &[PT_LOAD])).unwrap().arch,
        Arch::S390x
    );
    assert_eq!(t(&elf(true, false, 2, 21, &[])).unwrap().arch, Arch::Ppc64);
    assert_eq!(t(&elf(true, true, 2, 21, &[])).unwrap().arch, Arch::Ppc64le);
    // Refused: an object file, an unknown machine, cut short, not ELF, a
    // Mach-O file for Linux, an ELF file for macOS.
    assert!(t(&elf(true, true, 1, 62, &[]))
        .unwrap_err()
        .contains("not an executable"));
    assert!(t(&elf(true, true, 2, 9999, &[]))
        .unwrap_err()
        .contains("9999"));
    let mut cut = elf(true, true, 2, 62, &[PT_LOAD, PT_INTERP]);
    cut.truncate(64 + 56 + 2);
    assert!(
        t(&cut).unwrap_err().contains("program headers"),
        "{:?}",
        t(&cut)
    );
    assert!(t(b"\x7fELF").is_err());
    assert!(t(b"#!/bin/sh\nexec ferry \"$@\"\n")
        .unwrap_err()
        .contains("not an executable for Linux"));
    let macho = [0xcf, 0xfa, 0xed, 0xfe, 0x0c, 0, 0, 1, 0, 0, 0, 0];
    assert!(t(&macho).is_err());
    assert_eq!(inspect(&macho, "Darwin").unwrap().arch, Arch::Aarch64);
    assert!(inspect(&elf(true, true, 3, 62, &[]), "Darwin").is_err());
}

#[test]
fn the_running_binary_is_one_deploy_can_send() {
    let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let os = local_os().unwrap();
    let t = inspect(&exe[..exe.len().min(HEAD as usize)], os).unwrap();
    assert!(t.arch.runs_on(std::env::consts::ARCH), "{t:?}");
    assert_eq!(uname_os("linux"), Some("Linux"));
    assert_eq!(uname_os("macos"), Some("Darwin"));
    assert_eq!(uname_os("freebsd"), Some("FreeBSD"));
    assert_eq!(uname_os("windows"), None);
}

#[test]
fn uname_machine_names() {
    assert!(Arch::X86_64.runs_on("x86_64") && Arch::X86_64.runs_on("amd64"));
    assert!(Arch::Aarch64.runs_on("aarch64") && Arch::Aarch64.runs_on("arm64"));
    assert!(Arch::Arm.runs_on("armv7l") && !Arch::Arm.runs_on("arm64"));
    assert!(Arch::X86.runs_on("i686") && !Arch::X86.runs_on("x86_64"));
    assert!(!Arch::X86_64.runs_on("aarch64") && !Arch::Aarch64.runs_on("x86_64"));
    assert!(!Arch::Ppc64le.runs_on("ppc64"));
}

#[test]
fn posix_cksum() {
    let sum = |b: &[u8]| {
        let mut c = Cksum::default();
        c.update(b);
        (c.finish(), c.len)
    };
    // What `printf 123456789 | cksum` and `printf '' | cksum` print.
    assert_eq!(sum(b"123456789"), (930766865, 9));
    assert_eq!(sum(b""), (4294967295, 0));
    let mut split = Cksum::default();
    split.update(b"1234");
    split.update(b"56789");
    assert_eq!((split.finish(), split.len), (930766865, 9));
}

fn probe_text(cached: &str) -> String {
    format!(
        "Welcome to the box!\nferry-deploy os=Linux\nferry-deploy arch=x86_64\nferry-deploy cached={cached}\nferry-deploy dir=/home/me/.cache/ferry\n"
    )
}

#[test]
fn the_probe_is_read_past_banners() {
    let p = parse_probe(&probe_text("none")).unwrap();
    assert_eq!(
        p,
        Probe {
            os: "Linux".into(),
            arch: "x86_64".into(),
            dir: "/home/me/.cache/ferry".into(),
            cached: Cached::Missing,
        }
    );
    assert_eq!(
        parse_probe(&probe_text("930766865 9")).unwrap().cached,
        Cached::Sum(930766865, 9)
    );
    assert_eq!(
        parse_probe(&probe_text("   930766865     9 "))
            .unwrap()
            .cached,
        Cached::Sum(930766865, 9)
    );
    assert_eq!(
        parse_probe(&probe_text("")).unwrap().cached,
        Cached::Unreadable
    );
    assert_eq!(
        parse_probe(&probe_text("cksum: not found")).unwrap().cached,
        Cached::Unreadable
    );
    let spaced = "ferry-deploy os=Darwin\nferry-deploy arch=Power Macintosh\nferry-deploy cached=none\nferry-deploy dir=/Users/a b/.cache/ferry\n";
    let p = parse_probe(spaced).unwrap();
    assert_eq!(
        (p.arch.as_str(), p.dir.as_str()),
        ("Power Macintosh", "/Users/a b/.cache/ferry")
    );
    assert!(parse_probe("ferry-deploy os=Linux\n")
        .unwrap_err()
        .contains("no "));
    let relative = probe_text("none").replace("dir=/home", "dir=home");
    assert!(parse_probe(&relative).unwrap_err().contains("not absolute"));
    assert_eq!(parse_upload("x\nferry-deploy dir=/a b\n").unwrap(), "/a b");
    assert!(parse_upload("ferry-deploy dir=rel\n").is_err());
}

#[test]
fn another_os_or_machine_is_refused_and_a_good_copy_reused() {
    let x86 = Target {
        arch: Arch::X86_64,
        dynamic: false,
    };
    let probe = |os: &str, arch: &str, cached| Probe {
        os: os.into(),
        arch: arch.into(),
        dir: "/c".into(),
        cached,
    };
    let sum = (7, 1000);
    let d = |p: &Probe| decide("me@box", "Linux", &x86, sum, p);
    for (os, arch) in [
        ("Darwin", "arm64"),
        ("Linux", "aarch64"),
        ("FreeBSD", "amd64"),
    ] {
        let e = d(&probe(os, arch, Cached::Missing)).unwrap_err();
        assert!(matches!(e, Error::DeployRefused(_)), "{e:?}");
        assert_eq!(e.class(), Class::Usage);
        assert!(!e.retryable());
        let line = e.to_string();
        assert!(
            line.contains(&format!("me@box runs {os} {arch}")) && line.contains("Linux x86_64"),
            "{line}"
        );
        assert!(!line.contains('\n'));
    }
    assert_eq!(
        d(&probe("Linux", "x86_64", Cached::Missing)).unwrap(),
        Action::Upload
    );
    assert_eq!(
        d(&probe("Linux", "x86_64", Cached::Sum(7, 1000))).unwrap(),
        Action::Reuse
    );
    // Truncated, or damaged in place.
    assert_eq!(
        d(&probe("Linux", "x86_64", Cached::Sum(7, 10))).unwrap(),
        Action::Replace
    );
    assert_eq!(
        d(&probe("Linux", "x86_64", Cached::Sum(8, 1000))).unwrap(),
        Action::Replace
    );
    assert_eq!(
        d(&probe("Linux", "x86_64", Cached::Unreadable)).unwrap(),
        Action::Replace
    );
    // A BSD calls it amd64.
    let bsd = decide(
        "h",
        "FreeBSD",
        &x86,
        sum,
        &probe("FreeBSD", "amd64", Cached::Missing),
    );
    assert_eq!(bsd.unwrap(), Action::Upload);
}

/// Run one of the scripts here as ssh would have the remote shell run it.
fn run_script(
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
    input: &[u8],
) -> (i32, String, String) {
    use std::io::Write;
    let mut c = Command::new("sh");
    c.args(["-c", script, "ferry-deploy"]).args(args);
    c.env_remove("XDG_CACHE_HOME");
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_scripts_find_the_cache_and_upload_atomically() {
    let d = tempfile::tempdir().unwrap();
    let home = d.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let home_s = home.to_str().unwrap();
    // XDG_CACHE_HOME unset or relative: ~/.cache; absolute: it.
    for xdg in [None, Some("relative/cache")] {
        let mut env = vec![("HOME", home_s)];
        env.extend(xdg.map(|x| ("XDG_CACHE_HOME", x)));
        let (code, out, err) = run_script(PROBE, &["abc"], &env, b"");
        assert_eq!(code, 0, "{err}");
        let p = parse_probe(&out).unwrap();
        assert_eq!(p.dir, format!("{home_s}/.cache/ferry"));
        assert_eq!(p.cached, Cached::Missing);
        assert_eq!(Some(p.os.as_str()), local_os());
        assert!(Arch::X86_64.runs_on(&p.arch) || !Arch::X86_64.runs_on(std::env::consts::ARCH));
    }
    let xdg = d.path().join("ca che 'q' $x");
    let xdg_s = xdg.to_str().unwrap();
    let env = [("HOME", home_s), ("XDG_CACHE_HOME", xdg_s)];
    let data = b"not really ferry, but bytes".repeat(1000);
    let mut c = Cksum::default();
    c.update(&data);
    let want = format!("{} {}", c.finish(), c.len);
    // A short upload is refused and leaves nothing.
    let (code, _, err) = run_script(UPLOAD, &["abc", &want], &env, &data[..100]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("damaged or short"), "{err}");
    let dir = xdg.join("ferry");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let (code, out, err) = run_script(UPLOAD, &["abc", &want], &env, &data);
    assert_eq!(code, 0, "{err}");
    assert_eq!(parse_upload(&out).unwrap(), dir.to_str().unwrap());
    let file = dir.join("ferry-abc");
    assert!(std::fs::read(&file).unwrap() == data);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!((mode(&dir), mode(&file)), (0o700, 0o755));
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "no temporary file left"
    );
    let (_, out, _) = run_script(PROBE, &["abc"], &env, b"");
    assert_eq!(
        parse_probe(&out).unwrap().cached,
        Cached::Sum(c.finish(), c.len)
    );
    assert!(!home.join(".cache").exists());
}

#[test]
fn deploy_uploads_once_then_reuses_and_replaces_a_damaged_copy() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("remote cache");
    // ssh's stand-in: the host, then the line the remote shell runs.
    let rsh = d.path().join("fake-ssh");
    std::fs::write(
        &rsh,
        format!(
            "#!/bin/sh\nshift\nXDG_CACHE_HOME='{}' exec sh -c \"$1\"\n",
            cache.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&rsh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let arch = match std::env::consts::ARCH {
        "aarch64" => 183,
        _ => 62,
    };
    let bin = d.path().join("ferry-static");
    std::fs::write(&bin, elf(true, true, 3, arch, &[PT_LOAD, PT_INTERP])).unwrap();
    let rsh = rsh.to_str().unwrap();
    let first = deploy(rsh, "me@box", Some(&bin)).unwrap();
    assert!(first.uploaded);
    assert!(first.path.starts_with(cache.to_str().unwrap()), "{first:?}");
    assert!(
        first.notices[0].starts_with("deployed ferry (1 KiB) to me@box:"),
        "{first:?}"
    );
    assert!(first.notices[1].contains("dynamically linked"), "{first:?}");
    assert!(std::fs::read(&first.path).unwrap() == std::fs::read(&bin).unwrap());
    let again = deploy(rsh, "me@box", Some(&bin)).unwrap();
    assert!(!again.uploaded && again.notices.is_empty(), "{again:?}");
    assert_eq!(again.path, first.path);
    // Truncated in the cache: replaced.
    std::fs::File::options()
        .write(true)
        .open(&first.path)
        .unwrap()
        .set_len(10)
        .unwrap();
    let fixed = deploy(rsh, "me@box", Some(&bin)).unwrap();
    assert!(
        fixed.uploaded && fixed.notices[0].contains("damaged"),
        "{fixed:?}"
    );
    assert!(std::fs::read(&fixed.path).unwrap() == std::fs::read(&bin).unwrap());
    // Not an executable: refused before anything is sent.
    let script = d.path().join("script");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    let e = deploy(rsh, "me@box", Some(&script)).unwrap_err();
    assert!(matches!(e, Error::DeployRefused(_)), "{e:?}");
    // ssh failing says so.
    let e = deploy("false", "me@box", Some(&bin)).unwrap_err();
    assert!(
        e.to_string().contains("cannot look for ferry on me@box"),
        "{e}"
    );
}
