//! NBD exports as `ferry sync` sources, against a real qemu-nbd serving a
//! sparse qcow2 image on a unix socket.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Child, Command};

use common::*;

struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A 256 MiB qcow2 with data, written zeros and unallocated space, served
/// read-only on a unix socket; also its raw conversion by qemu-img.
fn serve(dir: &Path, test: &str) -> Option<(Server, String)> {
    if !which("qemu-nbd") || !which("qemu-io") || !which("qemu-img") {
        skip(&format!(
            "{test}: qemu-utils (qemu-nbd, qemu-io, qemu-img) not installed"
        ));
        return None;
    }
    let img = dir.join("img.qcow2");
    let ok = |c: &mut Command| c.status().map(|s| s.success()).unwrap_or(false);
    assert!(ok(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&img)
        .arg("256M")));
    assert!(ok(Command::new("qemu-io")
        .args([
            "-f",
            "qcow2",
            "-c",
            "write -P 0xab 1M 4M",
            "-c",
            "write -z 64M 8M",
            "-c",
            "write -P 0x11 200M 1M"
        ])
        .arg(&img)
        .stdout(std::process::Stdio::null())));
    assert!(ok(Command::new("qemu-img")
        .args(["convert", "-f", "qcow2", "-O", "raw"])
        .arg(&img)
        .arg(dir.join("ref.raw"))));
    let sock = dir.join("s.sock");
    let child = Command::new("qemu-nbd")
        .args(["--read-only", "--persistent", "-f", "qcow2", "-k"])
        .arg(&sock)
        .arg(&img)
        .spawn()
        .expect("start qemu-nbd");
    let server = Server(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !sock.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "qemu-nbd did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Some((server, format!("nbd+unix:///?socket={}", sock.display())))
}

#[test]
fn nbd_export_to_local_file_is_exact_and_sparse() {
    let d = tempfile::tempdir().unwrap();
    let Some((_srv, uri)) = serve(d.path(), "nbd_export_to_local_file_is_exact_and_sparse") else {
        return;
    };
    let out = d.path().join("out.raw");
    let j = ferry_ok(&["sync", &uri, p(&out)]);
    assert!(fs::read(&out).unwrap() == fs::read(d.path().join("ref.raw")).unwrap());
    // qemu-nbd offers multi-conn on a read-only export but, by default
    // (--shared=1), takes one client: ferry goes on with the one it has.
    assert_eq!(j["nbd_connections"], 1, "{j}");
    // Only the 5 MiB of real data is written; zeros and holes stay holes.
    assert_eq!(j["bytes_written"], 5 << 20);
    assert!(
        allocated(&out) <= (5 << 20) + (64 << 10),
        "{}",
        allocated(&out)
    );
    // Into a directory it gets a name of its own.
    let dir = d.path().join("dir");
    fs::create_dir(&dir).unwrap();
    ferry_ok(&["sync", &uri, p(&dir)]);
    assert!(dir.join("nbd-export.img").exists());
    // Re-sync by content: nothing to do.
    let again = ferry_ok(&["sync", "--checksum", &uri, p(&out)]);
    assert_eq!(again["files_transferred"], 0);
}

#[test]
fn nbd_export_pushed_over_ssh() {
    let d = tempfile::tempdir().unwrap();
    let Some((_srv, uri)) = serve(d.path(), "nbd_export_pushed_over_ssh") else {
        return;
    };
    let Some(ssh) = SshServer::start("nbd_export_pushed_over_ssh") else {
        return;
    };
    let bin = ferry_bin();
    let dst = d.path().join("remote.raw");
    ferry_ok(&[
        "sync",
        "-e",
        &ssh.rsh(),
        "--remote-ferry",
        p(&bin),
        &uri,
        &ssh.remote(&dst),
    ]);
    assert!(fs::read(&dst).unwrap() == fs::read(d.path().join("ref.raw")).unwrap());
    assert!(allocated(&dst) <= (5 << 20) + (64 << 10));
}

#[test]
fn missing_nbd_server_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let uri = format!(
        "nbd+unix:///?socket={}",
        d.path().join("nope.sock").display()
    );
    let out = ferry(&["sync", &uri, p(&d.path().join("x"))]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("NBD"), "{err}");
}

#[test]
fn local_image_into_an_nbd_export_and_back() {
    if !need("nbdkit", "local_image_into_an_nbd_export_and_back") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    // A 64 MiB memory export, filled with 0xFF so zero ranges must be
    // written as zeros, not skipped.
    let (_srv, uri) = nbdkit(d.path(), &["data", "data=0xff*67108864"]);
    let img = d.path().join("img");
    let f = fs::File::create(&img).unwrap();
    f.set_len(48 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &bytes(21, 3 << 20), 5 << 20).unwrap();
    drop(f);
    let j = ferry_ok(&["sync", p(&img), &uri]);
    assert_eq!(j["bytes_written"], 3 << 20);
    let back = d.path().join("back");
    ferry_ok(&["sync", &uri, p(&back)]);
    let got = fs::read(&back).unwrap();
    assert_eq!(got.len(), 64 << 20, "the whole export comes back");
    assert!(
        got[..48 << 20] == fs::read(&img).unwrap()[..],
        "image written, zero ranges zeroed"
    );
    assert!(
        got[48 << 20..].iter().all(|&b| b == 0xff),
        "beyond the image the export is untouched"
    );
    // A tree is refused: an export holds one file.
    let out = ferry(&["sync", p(d.path()), &uri]);
    assert_eq!(out.status.code(), Some(1));
}

/// nbdkit serving `args` on a unix socket in `dir` (the server stops with
/// the returned guard).
fn nbdkit(dir: &Path, args: &[&str]) -> (Server, String) {
    let sock = dir.join("kit.sock");
    // A server that came before left its socket behind.
    let _ = fs::remove_file(&sock);
    let child = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "-U"])
        .arg(&sock)
        .args(args)
        .spawn()
        .expect("start nbdkit");
    let srv = Server(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !sock.exists() {
        assert!(std::time::Instant::now() < deadline, "nbdkit did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    (srv, format!("nbd+unix:///?socket={}", sock.display()))
}

/// How many requests named `what` (`Read`, `Write`) each connection
/// served, from nbdkit's log filter.
fn per_connection(log: &Path, what: &str) -> std::collections::BTreeMap<u32, usize> {
    let text = fs::read_to_string(log).unwrap();
    let mut m = std::collections::BTreeMap::new();
    for l in text.lines().filter(|l| l.contains(&format!(" {what} id="))) {
        let id = l
            .split_whitespace()
            .find_map(|w| w.strip_prefix("connection="))
            .and_then(|n| n.parse().ok())
            .expect("connection id");
        *m.entry(id).or_insert(0) += 1;
    }
    m
}

/// nbdkit with its log filter (written to `dir/log`), `filters` and then
/// the `plugin` words; also an image of `mib` MiB of random bytes.
fn logged_nbdkit(
    dir: &Path,
    log: &str,
    filters: &[&str],
    plugin: &[&str],
) -> (Server, String, std::path::PathBuf) {
    let log = dir.join(log);
    let logarg = format!("logfile={}", log.display());
    let mut args = vec!["--filter=log"];
    args.extend(filters);
    args.extend(plugin);
    args.push(&logarg);
    let (srv, uri) = nbdkit(dir, &args);
    (srv, uri, log)
}

/// A random image of `mib` MiB in `dir`, and its `file=` argument.
fn image(dir: &Path, seed: u64, mib: usize) -> (std::path::PathBuf, String) {
    let img = dir.join("img");
    fs::write(&img, bytes(seed, mib << 20)).unwrap();
    let arg = format!("file={}", img.display());
    (img, arg)
}

#[test]
fn nbd_multi_conn_spreads_reads_and_writes_over_connections() {
    if !need(
        "nbdkit",
        "nbd_multi_conn_spreads_reads_and_writes_over_connections",
    ) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (img, imgarg) = image(d.path(), 7, 24);
    // A source that offers multi-conn: reads go over 4 connections.
    let (srv, uri, log) = logged_nbdkit(d.path(), "read.log", &[], &["file", &imgarg]);
    let out = d.path().join("out");
    let j = ferry_ok(&["sync", &uri, p(&out)]);
    drop(srv);
    assert!(fs::read(&out).unwrap() == fs::read(&img).unwrap());
    assert_eq!(j["nbd_connections"], 4, "{j}");
    let reads = per_connection(&log, "Read");
    assert_eq!(reads.len(), 4, "reads per connection: {reads:?}");
    assert!(reads.values().all(|&n| n >= 3), "{reads:?}");
    // A destination that offers it: writes go over 4 connections too.
    let (srv, uri, log) = logged_nbdkit(d.path(), "write.log", &[], &["memory", "24M"]);
    let j = ferry_ok(&["sync", p(&img), &uri]);
    assert_eq!(j["nbd_connections"], 4, "{j}");
    let back = d.path().join("back");
    ferry_ok(&["sync", &uri, p(&back)]);
    drop(srv);
    assert!(fs::read(&back).unwrap() == fs::read(&img).unwrap());
    let writes = per_connection(&log, "Write");
    assert_eq!(writes.len(), 4, "writes per connection: {writes:?}");
}

/// The data extents of `f` (SEEK_DATA / SEEK_HOLE), as offset ranges.
fn data_extents(f: &fs::File) -> Vec<(u64, u64)> {
    use std::os::fd::AsFd;
    let size = f.metadata().unwrap().len();
    let mut v = Vec::new();
    let mut pos = 0;
    while pos < size {
        let Ok(a) = rustix::fs::seek(f.as_fd(), rustix::fs::SeekFrom::Data(pos)) else {
            break;
        };
        let b = rustix::fs::seek(f.as_fd(), rustix::fs::SeekFrom::Hole(a)).unwrap();
        v.push((a, b));
        pos = b;
    }
    v
}

#[test]
fn a_sparse_export_of_many_regions_is_exact_and_each_map_asked_once() {
    // 4 GiB, sixteen of the 256 MiB regions ferry asks the allocation of
    // at a time, with data at the start, across a region boundary, at an
    // odd offset, in many segments of one region and at the very end.
    if !need(
        "nbdkit",
        "a_sparse_export_of_many_regions_is_exact_and_each_map_asked_once",
    ) {
        return;
    }
    use std::os::unix::fs::FileExt;
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    let size = 4u64 << 30;
    let f = fs::File::create(&img).unwrap();
    f.set_len(size).unwrap();
    let mut pieces = vec![
        (0, 4096),
        ((256 << 20) - 2048, 4096),
        ((1 << 30) + 123, 5000),
        (size - 10, 10),
    ];
    // One piece in each of 20 segments of the third region.
    pieces.extend((0..20u64).map(|i| ((2 << 30) + i * (8 << 20) + 777, 65536)));
    for (i, &(off, len)) in pieces.iter().enumerate() {
        f.write_all_at(&bytes(i as u64 + 1, len), off).unwrap();
    }
    drop(f);
    let imgarg = format!("file={}", img.display());
    let (srv, uri, log) = logged_nbdkit(d.path(), "map.log", &[], &["file", &imgarg]);
    let out = d.path().join("out");
    let j = ferry_ok(&["sync", &uri, p(&out)]);
    drop(srv);
    // The bytes: every data extent of either file compared, the rest are
    // holes in both (zeros).
    let (a, b) = (fs::File::open(&img).unwrap(), fs::File::open(&out).unwrap());
    assert_eq!(b.metadata().unwrap().len(), size);
    let mut spans = data_extents(&a);
    spans.extend(data_extents(&b));
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    for (s, e) in spans {
        for at in (s..e).step_by(1 << 20) {
            let n = (e - at).min(1 << 20) as usize;
            a.read_exact_at(&mut x[..n], at).unwrap();
            b.read_exact_at(&mut y[..n], at).unwrap();
            assert!(x[..n] == y[..n], "bytes differ in {at}..{}", at + n as u64);
        }
    }
    let data: u64 = pieces.iter().map(|p| p.1 as u64).sum();
    assert!(
        allocated(&out) <= data + 24 * (64 << 10),
        "{}",
        allocated(&out)
    );
    assert_eq!(j["bytes_written"].as_u64().unwrap() % 4096, 0, "{j}");
    // The planner and the readers share the maps: a region's is asked for
    // once (a reader only gets segments the planner has mapped), not again
    // by each reader; one map kept at a time took 27-36 requests here
    // (16 when each region is answered in one reply, as nbdkit does).
    let asked: usize = per_connection(&log, "Extents").values().sum();
    assert!((16..=20).contains(&asked), "{asked} BLOCK_STATUS requests");
}

#[test]
fn nbd_without_multi_conn_uses_one_connection() {
    if !need("nbdkit", "nbd_without_multi_conn_uses_one_connection") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (img, imgarg) = image(d.path(), 8, 6);
    let (srv, uri, log) = logged_nbdkit(
        d.path(),
        "kit.log",
        &["--filter=multi-conn"],
        &["file", &imgarg, "multi-conn-mode=disable"],
    );
    let out = d.path().join("out");
    let j = ferry_ok(&["sync", &uri, p(&out)]);
    drop(srv);
    assert!(fs::read(&out).unwrap() == fs::read(&img).unwrap());
    assert_eq!(j["nbd_connections"], 1, "{j}");
    let text = fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches(" Connect ").count(), 1, "{text}");
}

/// Read-ahead over 4 connections of a server that answers each request
/// late (nbdkit's delay filter, so replies overtake each other): data
/// extents of odd lengths at odd places, holes between them, come back
/// exact and sparse.
#[test]
fn nbd_read_ahead_over_a_slow_server_is_exact() {
    if !need("nbdkit", "nbd_read_ahead_over_a_slow_server_is_exact") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    let f = fs::File::create(&img).unwrap();
    f.set_len(40 << 20).unwrap();
    for (i, (off, len)) in [
        (4096u64, (3 << 20) + 12288),
        (9 << 20, (1 << 20) - 4096),
        ((17 << 20) + 8192, (6 << 20) + 4096),
        ((39 << 20) + 4096, 1 << 19),
    ]
    .into_iter()
    .enumerate()
    {
        let data = bytes(40 + i as u64, len);
        std::os::unix::fs::FileExt::write_all_at(&f, &data, off).unwrap();
    }
    drop(f);
    let imgarg = format!("file={}", img.display());
    let (srv, uri, log) = logged_nbdkit(
        d.path(),
        "kit.log",
        &["--filter=delay"],
        &["file", &imgarg, "rdelay=3ms"],
    );
    let out = d.path().join("out");
    let j = ferry_ok(&["sync", &uri, p(&out)]);
    drop(srv);
    assert!(fs::read(&out).unwrap() == fs::read(&img).unwrap());
    assert_eq!(j["nbd_connections"], 4, "{j}");
    assert!(allocated(&out) <= 12 << 20, "{}", allocated(&out));
    // Nothing read twice, nothing read from the holes.
    let text = fs::read_to_string(&log).unwrap();
    let read: u64 = text
        .lines()
        .filter(|l| l.contains(" Read id="))
        .filter_map(|l| l.split("count=0x").nth(1))
        .filter_map(|c| u64::from_str_radix(c.split_whitespace().next()?, 16).ok())
        .sum();
    let data = (3 << 20) + 12288 + (1 << 20) - 4096 + (6 << 20) + 4096 + (1 << 19);
    assert_eq!(read, data, "bytes read from the export");
}

/// `--partial-dir` with an NBD export as destination: a copy that is
/// killed keeps its journal there; the next run reads back what the export
/// holds and sends only the rest, and a kept range that was changed on the
/// export in between is caught and sent again.
#[test]
fn an_interrupted_copy_into_an_nbd_export_resumes_with_partial_dir() {
    if !need(
        "nbdkit",
        "an_interrupted_copy_into_an_nbd_export_resumes_with_partial_dir",
    ) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    fs::write(&img, bytes(31, 256 << 20)).unwrap();
    let target = d.path().join("export");
    fs::write(&target, vec![0xee; 256 << 20]).unwrap();
    let arg = format!("file={}", target.display());
    let (_srv, uri) = nbdkit(d.path(), &["file", &arg]);
    let jdir = d.path().join("journals");
    fs::create_dir(&jdir).unwrap();
    let journal = || {
        fs::read_dir(&jdir)
            .unwrap()
            .filter_map(|x| x.ok())
            .find(|x| x.file_name().to_string_lossy().ends_with(".ferry-journal"))
    };
    // 100 MiB/s: about 2.6 s for the image; killed after 1.8 s, past the
    // first journal appends (every 64 MiB).
    let killed = || {
        killed_after(
            &[
                "sync",
                "-q",
                "--bwlimit",
                "100M",
                "--partial-dir",
                p(&jdir),
                p(&img),
                &uri,
            ],
            1800,
        );
        assert!(journal().is_some(), "no journal in --partial-dir");
    };
    killed();
    let j = ferry_ok(&["sync", "--partial-dir", p(&jdir), p(&img), &uri]);
    let resumed = j["bytes_resumed"].as_u64().unwrap();
    assert!(resumed >= 64 << 20, "resumed only {resumed} bytes: {j}");
    assert_eq!(
        j["bytes_written"].as_u64().unwrap() + resumed,
        256 << 20,
        "{j}"
    );
    assert!(fs::read(&target).unwrap() == fs::read(&img).unwrap());
    assert!(journal().is_none(), "journal left after the copy completed");

    // Again into a fresh export, and the export's first MiB (in the kept
    // range) changed behind ferry's back before the resume.
    fs::write(&target, vec![0xee; 256 << 20]).unwrap();
    killed();
    let f = fs::OpenOptions::new().write(true).open(&target).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0x5a; 1 << 20], 0).unwrap();
    drop(f);
    let j = ferry_ok(&["sync", "--partial-dir", p(&jdir), p(&img), &uri]);
    assert_eq!(j["files_transferred"], 1, "{j}");
    assert!(
        fs::read(&target).unwrap() == fs::read(&img).unwrap(),
        "a changed kept range is sent again"
    );
    assert!(journal().is_none());
}
