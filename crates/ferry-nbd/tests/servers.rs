//! Tests against real NBD servers (qemu-nbd, nbdkit) started by the tests on
//! unix sockets in temporary directories. Each server is killed by its own
//! guard (by pid, on drop, so also when a test fails). A missing tool makes
//! the test print `SKIPPED: <tool> not installed` and return.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_nbd::{
    copy_from_file, copy_to_file, copy_to_file_with, ConnectOptions, CopyOptions, Error, Reply,
};
use ferry_nbd::{Client, Extent};

struct Server {
    child: Child,
    sock: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        // Child::kill sends SIGKILL to this pid only.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

macro_rules! require {
    ($($tool:expr),+) => {
        $(
            if !have($tool) {
                if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
                    panic!("cannot run under CI: {} not installed", $tool);
                }
                eprintln!("SKIPPED: {} not installed", $tool);
                return;
            }
        )+
    };
}

fn spawn(cmd: &mut Command, sock: &Path) -> Server {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn server");
    let s = Server {
        child,
        sock: sock.to_path_buf(),
    };
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "server socket never appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s
}

fn qemu_nbd(dir: &Path, image: &Path, args: &[&str]) -> Server {
    let sock = dir.join("qemu.sock");
    let mut c = Command::new("qemu-nbd");
    c.args(["-t", "-f", "qcow2", "-k"])
        .arg(&sock)
        .args(args)
        .arg(image);
    spawn(&mut c, &sock)
}

fn nbdkit(dir: &Path, args: &[&str]) -> Server {
    let sock = dir.join("nbdkit.sock");
    let mut c = Command::new("nbdkit");
    c.args(["-f", "--exit-with-parent", "-U"])
        .arg(&sock)
        .args(args);
    spawn(&mut c, &sock)
}

fn connect(uri: &str) -> Client {
    connect_with(uri, ConnectOptions::default())
}

fn connect_with(uri: &str, opts: ConnectOptions) -> Client {
    let t0 = Instant::now();
    loop {
        match Client::connect_with(uri, opts.clone()) {
            Ok(c) => return c,
            Err(Error::Connect { .. }) if t0.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("connect {uri}: {e}"),
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run tool");
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
}

const MIB: u64 = 1 << 20;

/// A 64 MiB qcow2 with data, zero clusters, explicitly written zero bytes,
/// a partly zero data area, and unallocated holes.
fn make_qcow2(dir: &Path) -> PathBuf {
    let img = dir.join("src.qcow2");
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&img)
        .arg("64M"));
    run(Command::new("qemu-io")
        .args(["-f", "qcow2"])
        .args([
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "write -z 4M 1M",
            "-c",
            "write -P 0xcd 10M 512k",
            "-c",
            "write -P 0 20M 1M",
            "-c",
            "write -P 0 40M 1M",
            "-c",
            "write -P 0x22 41951232 4k",
            "-c",
            "write -P 0x33 67104768 1k",
        ])
        .arg(&img));
    img
}

fn read_all(p: &Path) -> Vec<u8> {
    std::fs::read(p).expect("read file")
}

fn data_extents(ext: &[Extent]) -> Vec<(u64, u64)> {
    ext.iter()
        .filter(|e| !e.skippable())
        .map(|e| (e.offset, e.len))
        .collect()
}

fn check_contiguous(ext: &[Extent], offset: u64, len: u64) {
    let mut pos = offset;
    for e in ext {
        assert_eq!(e.offset, pos, "extents not contiguous: {ext:?}");
        assert!(e.len > 0);
        pos += e.len;
    }
    assert_eq!(pos, offset + len, "extents do not cover the range: {ext:?}");
}

#[test]
fn qemu_nbd_extents_and_sparse_copy_to_file() {
    require!("qemu-nbd", "qemu-img", "qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let img = make_qcow2(dir.path());
    let reference = dir.path().join("ref.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "qcow2", "-O", "raw"])
        .arg(&img)
        .arg(&reference));
    let srv = qemu_nbd(dir.path(), &img, &["-r", "-e", "4", "-x", "disk"]);
    let c = connect(&srv.uri("disk"));
    assert_eq!(c.size(), 64 * MIB);
    assert!(c.read_only());
    assert!(c.has_block_status());
    eprintln!("qemu-nbd flags: {:?}", c.info());

    let ext = c.extents(0, c.size()).unwrap();
    check_contiguous(&ext, 0, c.size());
    assert_eq!(
        data_extents(&ext),
        vec![
            (0, MIB),
            (10 * MIB, MIB / 2),
            (20 * MIB, MIB),
            (40 * MIB, MIB),
            (64 * MIB - 64 * 1024, 64 * 1024)
        ],
        "{ext:?}"
    );
    // The zero cluster range reads as zero.
    assert!(ext
        .iter()
        .any(|e| e.offset <= 4 * MIB && e.offset + e.len >= 5 * MIB && e.zero));
    // Unaligned sub-range is clipped.
    let sub = c.extents(100, 10 * MIB + 1000 - 100).unwrap();
    check_contiguous(&sub, 100, 10 * MIB + 900);
    assert_eq!(data_extents(&sub)[0], (100, MIB - 100));
    assert_eq!(data_extents(&sub)[1], (10 * MIB, 1000));

    // Random reads match the reference.
    let refb = read_all(&reference);
    for (off, len) in [
        (0u64, 4096usize),
        (MIB - 10, 20),
        (10 * MIB + 7, 3 * MIB as usize),
        (64 * MIB - 1000, 1000),
    ] {
        let mut b = vec![0u8; len];
        c.read_at(off, &mut b).unwrap();
        assert!(
            b == refb[off as usize..off as usize + len],
            "read_at {off}+{len}"
        );
    }

    // Sparse copy, several threads, small requests to exercise pipelining.
    let out_path = dir.path().join("out.raw");
    let out = File::create(&out_path).unwrap();
    let st = copy_to_file_with(
        &c,
        &out,
        &CopyOptions {
            threads: 3,
            request_size: 256 * 1024,
            in_flight: 8,
            segment: 8 * MIB,
            ..CopyOptions::default()
        },
    )
    .unwrap();
    drop(out);
    eprintln!("copy stats: {st:?}");
    assert!(
        read_all(&out_path) == refb,
        "copy differs from qemu-img convert"
    );
    // Only the non-zero data is read-and-written: 1 MiB + 512 KiB + 4 KiB + 1 KiB block.
    let nonzero = MIB + MIB / 2 + 4096 + 4096;
    assert_eq!(st.data_written, nonzero);
    assert!(st.data_transferred <= 5 * MIB / 2 + MIB + 64 * 1024);
    assert!(st.zero_detected >= 2 * MIB - 4096);
    let allocated = std::fs::metadata(&out_path).unwrap().blocks() * 512;
    assert!(
        allocated <= nonzero + 64 * 1024,
        "destination not sparse: {allocated} bytes allocated for {nonzero} bytes of data"
    );

    // The plain entry point gives the same bytes.
    let out2_path = dir.path().join("out2.raw");
    let out2 = File::create(&out2_path).unwrap();
    copy_to_file(&c, &out2, 1).unwrap();
    assert!(read_all(&out2_path) == refb);
}

#[test]
fn qemu_nbd_unknown_export_is_a_clear_error() {
    require!("qemu-nbd", "qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("e.qcow2");
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&img)
        .arg("1M"));
    let srv = qemu_nbd(dir.path(), &img, &["-x", "good"]);
    // Make sure the server is up (the good name works).
    let ok = connect(&srv.uri("good"));
    assert_eq!(ok.size(), MIB);
    drop(ok);
    match Client::connect(&srv.uri("nosuchexport")) {
        Err(e @ Error::ExportNotFound { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("nosuchexport"), "{msg}");
        }
        other => panic!("expected ExportNotFound, got {other:?}"),
    }
}

/// A sparse source file: data, holes, explicit zero blocks, unaligned tail.
fn make_source(path: &Path, size: u64) -> Vec<u8> {
    let f = File::create(path).unwrap();
    f.set_len(size).unwrap();
    let mut model = vec![0u8; size as usize];
    let mut seed = 0x1234_5678_u64;
    let mut put = |off: u64, len: usize, pattern: Option<u8>, model: &mut Vec<u8>| {
        let mut b = vec![0u8; len];
        for x in b.iter_mut() {
            *x = match pattern {
                Some(p) => p,
                None => {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 33) as u8
                }
            };
        }
        f.write_all_at(&b, off).unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&b);
    };
    put(0, 3 * MIB as usize + 123, None, &mut model);
    put(5 * MIB, 2 * MIB as usize, Some(0), &mut model); // allocated zeroes
    put(9 * MIB + 4096, 8192, Some(7), &mut model);
    put(12 * MIB, 4 * MIB as usize, None, &mut model);
    // zero 4 KiB blocks inside data
    put(13 * MIB, 3 * 4096, Some(0), &mut model);
    put(size - 777, 777, None, &mut model);
    model
}

#[test]
fn nbdkit_memory_round_trip() {
    require!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let size = 24 * MIB + 4096 + 512;
    let src = dir.path().join("src.img");
    let model = make_source(&src, size);
    let srv = nbdkit(dir.path(), &["memory", &size.to_string()]);
    let c = connect(&srv.uri(""));
    assert_eq!(c.size(), size);
    assert!(!c.read_only());
    assert!(c.can_zero());
    eprintln!("nbdkit memory: {:?}", c.info());

    // Dirty the whole destination so that holes really have to be zeroed.
    c.write_at(0, &vec![0xffu8; size as usize]).unwrap();
    let st = copy_from_file(&File::open(&src).unwrap(), &c, 2).unwrap();
    eprintln!("copy_from_file: {st:?}");
    assert!(
        st.data_written < 8 * MIB,
        "zeroes were sent as data: {st:?}"
    );

    // The destination reports the zeroed ranges as zero.
    let ext = c.extents(0, size).unwrap();
    check_contiguous(&ext, 0, size);
    assert!(
        ext.iter()
            .any(|e| e.zero && e.offset <= 5 * MIB && e.offset + e.len >= 7 * MIB),
        "{ext:?}"
    );

    let out_path = dir.path().join("back.img");
    let out = File::create(&out_path).unwrap();
    let st2 = copy_to_file(&c, &out, 2).unwrap();
    eprintln!("copy_to_file: {st2:?}");
    drop(out);
    let back = read_all(&out_path);
    assert_eq!(back.len(), model.len());
    assert!(back == model, "round trip differs");
    assert!(read_all(&src) == model);

    // Other commands.
    c.write_zeroes(MIB, 1000).unwrap();
    let mut b = vec![1u8; 1000];
    c.read_at(MIB, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    if c.can_trim() {
        c.trim(20 * MIB, MIB).unwrap();
    }
    c.flush().unwrap();
    assert!(matches!(
        c.read_at(size - 10, &mut [0u8; 20]),
        Err(Error::OutOfRange { .. })
    ));
}

#[test]
fn nbdkit_without_write_zeroes_or_extents() {
    require!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let size = 6 * MIB;
    let src = dir.path().join("src.img");
    let f = File::create(&src).unwrap();
    f.set_len(size).unwrap();
    f.write_all_at(&[9u8; 10000], 2 * MIB).unwrap();
    drop(f);
    let srv = nbdkit(
        dir.path(),
        &[
            "--filter=nozero",
            "--filter=noextents",
            "memory",
            &size.to_string(),
        ],
    );
    let c = connect(&srv.uri(""));
    assert!(!c.can_zero());
    // Without base:allocation (noextents still lets the server answer; either
    // way extents must cover the range).
    let ext = c.extents(0, size).unwrap();
    check_contiguous(&ext, 0, size);
    c.write_at(0, &vec![0x55u8; size as usize]).unwrap();
    copy_from_file(&File::open(&src).unwrap(), &c, 1).unwrap();
    let mut b = vec![0u8; size as usize];
    c.read_at(0, &mut b).unwrap();
    assert!(b == std::fs::read(&src).unwrap());
}

#[test]
fn nbdkit_error_replies_are_reported() {
    require!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let srv = nbdkit(
        dir.path(),
        &[
            "--filter=error",
            "pattern",
            "16M",
            "error=EIO",
            "error-pread-rate=1",
        ],
    );
    let c = connect(&srv.uri(""));
    let mut b = vec![0u8; 8192];
    match c.read_at(4096, &mut b) {
        Err(e @ Error::Server { .. }) => {
            assert_eq!(e.server_errno(), Some(5));
            assert!(e.to_string().contains("EIO"), "{e}");
        }
        other => panic!("expected a server error, got {other:?}"),
    }
    // The connection survives a command error.
    assert!(c.extents(0, MIB).is_ok());
}

#[test]
fn server_killed_mid_read_fails_fast() {
    require!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    // Reads take 2 s each, so they are surely in flight when the server dies.
    let mut srv = nbdkit(dir.path(), &["--filter=delay", "pattern", "1G", "rdelay=2"]);
    let c = connect_with(
        &srv.uri(""),
        ConnectOptions {
            io_timeout: Duration::from_secs(30),
            ..ConnectOptions::default()
        },
    );
    let conn = c.connection().clone();
    let tickets: Vec<_> = (0..16)
        .map(|i| conn.submit_read(i * MIB, vec![0u8; MIB as usize]).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    srv.child.kill().unwrap();
    let t0 = Instant::now();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r: Vec<bool> = tickets
            .into_iter()
            .map(|t| matches!(t.wait(), Ok(Reply::Data(_))))
            .collect();
        let _ = tx.send(r);
    });
    let ok = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("waiting for replies hung after the server was killed");
    assert!(ok.iter().all(|&o| !o), "no read can have succeeded");
    assert!(t0.elapsed() < Duration::from_secs(5));
    let e = conn
        .submit_read(0, vec![0u8; 4096])
        .err()
        .expect("dead connection");
    assert!(matches!(e, Error::ConnectionLost(_)), "{e:?}");

    // A whole copy also fails (no hang) when the server dies under it.
    let dir2 = tempfile::tempdir().unwrap();
    let mut srv2 = nbdkit(
        dir2.path(),
        &["--filter=delay", "pattern", "1G", "rdelay=50ms"],
    );
    let c2 = connect(&srv2.uri(""));
    let out = tempfile::tempfile().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(copy_to_file(&c2, &out, 2).map(|_| ()));
    });
    std::thread::sleep(Duration::from_millis(400));
    srv2.child.kill().unwrap();
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Err(e)) => eprintln!("copy failed as expected: {e}"),
        Ok(Ok(())) => panic!("copy cannot have succeeded"),
        Err(_) => panic!("copy hung after the server was killed"),
    }
}

#[test]
fn nbdkit_over_tcp_loopback() {
    require!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    // Pick a free port on 127.0.0.1 (tiny race with other processes; retried).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pidfile = dir.path().join("nbdkit.pid");
    let mut cmd = Command::new("nbdkit");
    cmd.args(["-f", "--exit-with-parent", "-i", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .arg("-P")
        .arg(&pidfile)
        .args(["pattern", "8M"]);
    // The pid file appears once nbdkit listens.
    let srv = spawn(&mut cmd, &pidfile);
    let c = connect(&format!("nbd://127.0.0.1:{port}/"));
    assert_eq!(c.size(), 8 * MIB);
    // The pattern plugin stores each 8-byte big-endian offset at that offset.
    let mut b = vec![0u8; 16];
    c.read_at(4 * MIB, &mut b).unwrap();
    assert_eq!(u64::from_be_bytes(b[..8].try_into().unwrap()), 4 * MIB);
    assert_eq!(u64::from_be_bytes(b[8..].try_into().unwrap()), 4 * MIB + 8);
    drop(c);
    drop(srv);
}

#[test]
fn copy_into_zeroed_export_skips_zeroing() {
    require!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let size = 8 * MIB;
    let src = dir.path().join("src.img");
    let f = File::create(&src).unwrap();
    f.set_len(size).unwrap();
    f.write_all_at(&[1u8; 8192], MIB).unwrap();
    drop(f);
    let srv = nbdkit(dir.path(), &["memory", &size.to_string()]);
    let c = connect(&srv.uri(""));
    let st = ferry_nbd::copy_from_file_with(
        &File::open(&src).unwrap(),
        &c,
        &CopyOptions {
            destination_is_zero: true,
            ..CopyOptions::default()
        },
    )
    .unwrap();
    assert_eq!(st.data_written, 8192);
    let mut b = vec![9u8; size as usize];
    c.read_at(0, &mut b).unwrap();
    assert!(b == std::fs::read(&src).unwrap());
}
