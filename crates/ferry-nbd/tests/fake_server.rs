//! Error paths against a scripted in-process NBD server on a unix socket:
//! misbehaving replies must give a clear error, never a panic or a hang.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_nbd::proto::*;
use ferry_nbd::{Client, ConnectOptions, Error};

const SIZE: u64 = 1 << 20;

/// WRITE_ZEROES requests refused with ENOTSUP because they had FAST_ZERO.
static FAST_ZERO_REFUSED: AtomicUsize = AtomicUsize::new(0);
/// WRITE_ZEROES requests without FAST_ZERO (accepted).
static PLAIN_ZERO: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy, Debug)]
enum Script {
    Hang,
    WrongMagic,
    UnknownCookie,
    ChunkOverrun,
    DataOutsideRequest,
    OverlappingChunks,
    SuccessWithoutData,
    ErrorChunk,
    SimpleError,
    Close,
    HugeBlockStatus,
    /// Block status in pieces of one byte, data and hole (not zero) by
    /// turns, 65,536 of them per reply; every byte reads as 0x5a.
    Confetti,
    Good,
    /// Good on the first connection, with multi-conn offered; later
    /// connections are accepted and never answered.
    MultiSilent,
    /// As MultiSilent, but later connections get their greeting one byte
    /// every 200 ms.
    MultiDrip,
}

struct Fake {
    sock: PathBuf,
    _dir: tempfile::TempDir,
    handle: Option<JoinHandle<()>>,
}

fn opt_reply(s: &mut UnixStream, opt: u32, rep: u32, payload: &[u8]) {
    let mut b = OPT_REPLY_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&rep.to_be_bytes());
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend_from_slice(payload);
    let _ = s.write_all(&b);
}

fn chunk(flags: u16, kind: u16, cookie: u64, payload: &[u8]) -> Vec<u8> {
    let mut b = STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend_from_slice(payload);
    b
}

/// Handshake: structured replies yes, base:allocation id 7, exports "disk" only.
fn handshake(s: &mut UnixStream, multi: bool) -> bool {
    let mut g = NBDMAGIC.to_be_bytes().to_vec();
    g.extend_from_slice(&IHAVEOPT.to_be_bytes());
    g.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    if s.write_all(&g).is_err() {
        return false;
    }
    let mut cf = [0u8; 4];
    if s.read_exact(&mut cf).is_err() {
        return false;
    }
    loop {
        let mut h = [0u8; 16];
        if s.read_exact(&mut h).is_err() {
            return false;
        }
        let opt = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
        let len = u32::from_be_bytes([h[12], h[13], h[14], h[15]]) as usize;
        let mut data = vec![0u8; len];
        if s.read_exact(&mut data).is_err() {
            return false;
        }
        match opt {
            OPT_STRUCTURED_REPLY => opt_reply(s, opt, REP_ACK, &[]),
            OPT_SET_META_CONTEXT => {
                let mut p = 7u32.to_be_bytes().to_vec();
                p.extend_from_slice(b"base:allocation");
                opt_reply(s, opt, REP_META_CONTEXT, &p);
                opt_reply(s, opt, REP_ACK, &[]);
            }
            OPT_GO => {
                let nlen = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
                let name = &data[4..4 + nlen];
                if name != b"disk" {
                    opt_reply(s, opt, REP_ERR_UNKNOWN, b"no such export here");
                    continue;
                }
                let mut p = INFO_EXPORT.to_be_bytes().to_vec();
                p.extend_from_slice(&SIZE.to_be_bytes());
                p.extend_from_slice(
                    &(FLAG_HAS_FLAGS
                        | FLAG_SEND_FLUSH
                        | FLAG_SEND_WRITE_ZEROES
                        | FLAG_SEND_FAST_ZERO
                        | if multi { FLAG_CAN_MULTI_CONN } else { 0 })
                    .to_be_bytes(),
                );
                opt_reply(s, opt, REP_INFO, &p);
                opt_reply(s, opt, REP_ACK, &[]);
                return true;
            }
            _ => opt_reply(s, opt, REP_ERR_UNSUP, &[]),
        }
    }
}

fn serve(mut s: UnixStream, script: Script) {
    let multi = matches!(script, Script::MultiSilent | Script::MultiDrip);
    if !handshake(&mut s, multi) {
        return;
    }
    let script = if multi { Script::Good } else { script };
    loop {
        let mut r = [0u8; 28];
        if s.read_exact(&mut r).is_err() {
            return;
        }
        let flags = u16::from_be_bytes([r[4], r[5]]);
        let cmd = u16::from_be_bytes([r[6], r[7]]);
        let cookie = u64::from_be_bytes(r[8..16].try_into().unwrap());
        let off = u64::from_be_bytes(r[16..24].try_into().unwrap());
        let len = u32::from_be_bytes(r[24..28].try_into().unwrap());
        if cmd == CMD_DISC {
            return;
        }
        let reply: Vec<u8> = match script {
            Script::Hang => {
                std::thread::sleep(Duration::from_secs(30));
                return;
            }
            Script::Close => return,
            Script::WrongMagic => vec![0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            Script::UnknownCookie => chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie ^ 0xffff, &[]),
            Script::ChunkOverrun => {
                // Claims far more data than was asked for.
                let mut b = chunk(
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_OFFSET_DATA,
                    cookie,
                    &off.to_be_bytes(),
                );
                let l = (len as usize + 8 + 4096) as u32;
                b[16..20].copy_from_slice(&l.to_be_bytes());
                b
            }
            Script::DataOutsideRequest => {
                let mut p = (off + u64::from(len)).to_be_bytes().to_vec();
                p.extend_from_slice(&[1u8; 512]);
                chunk(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, cookie, &p)
            }
            Script::OverlappingChunks => {
                let mut p = off.to_be_bytes().to_vec();
                p.extend_from_slice(&vec![1u8; len as usize]);
                let mut b = chunk(0, REPLY_TYPE_OFFSET_DATA, cookie, &p);
                let mut h = off.to_be_bytes().to_vec();
                h.extend_from_slice(&512u32.to_be_bytes());
                b.extend(chunk(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_HOLE, cookie, &h));
                b
            }
            Script::SuccessWithoutData => chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, &[]),
            Script::ErrorChunk => {
                let mut p = EIO.to_be_bytes().to_vec();
                p.extend_from_slice(&4u16.to_be_bytes());
                p.extend_from_slice(b"boom");
                chunk(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, &p)
            }
            Script::SimpleError => {
                let mut b = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
                b.extend_from_slice(&ENOSPC.to_be_bytes());
                b.extend_from_slice(&cookie.to_be_bytes());
                b
            }
            Script::HugeBlockStatus => {
                let mut b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, &[]);
                b[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
                b
            }
            Script::Confetti if cmd == CMD_READ => {
                let mut p = off.to_be_bytes().to_vec();
                p.extend_from_slice(&vec![0x5a; len as usize]);
                chunk(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, cookie, &p)
            }
            Script::Confetti => {
                let n = len.min(1 << 16);
                let mut p = 7u32.to_be_bytes().to_vec();
                for i in 0..n {
                    let at = off + u64::from(i);
                    p.extend_from_slice(&1u32.to_be_bytes());
                    p.extend_from_slice(&(if at % 2 == 0 { 0 } else { STATE_HOLE }).to_be_bytes());
                }
                chunk(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, &p)
            }
            Script::Good => match cmd {
                CMD_READ => {
                    // Half data, half hole, in reverse order.
                    let half = len / 2;
                    let mut h = (off + u64::from(half)).to_be_bytes().to_vec();
                    h.extend_from_slice(&(len - half).to_be_bytes());
                    let mut b = chunk(0, REPLY_TYPE_OFFSET_HOLE, cookie, &h);
                    let mut p = off.to_be_bytes().to_vec();
                    p.extend_from_slice(&vec![0x5a; half as usize]);
                    b.extend(chunk(0, REPLY_TYPE_OFFSET_DATA, cookie, &p));
                    b.extend(chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, &[]));
                    b
                }
                CMD_BLOCK_STATUS => {
                    // An unknown context first, then ours.
                    let mut p = 99u32.to_be_bytes().to_vec();
                    p.extend_from_slice(&len.to_be_bytes());
                    p.extend_from_slice(&0u32.to_be_bytes());
                    let mut b = chunk(0, REPLY_TYPE_BLOCK_STATUS, cookie, &p);
                    let mut p = 7u32.to_be_bytes().to_vec();
                    let first = len.min(4096);
                    p.extend_from_slice(&first.to_be_bytes());
                    p.extend_from_slice(&0u32.to_be_bytes());
                    if len > first {
                        p.extend_from_slice(&(len - first).to_be_bytes());
                        p.extend_from_slice(&(STATE_HOLE | STATE_ZERO).to_be_bytes());
                    }
                    b.extend(chunk(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, &p));
                    b
                }
                CMD_WRITE_ZEROES if flags & CMD_FLAG_FAST_ZERO != 0 => {
                    FAST_ZERO_REFUSED.fetch_add(1, Ordering::SeqCst);
                    let mut b = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
                    b.extend_from_slice(&ENOTSUP.to_be_bytes());
                    b.extend_from_slice(&cookie.to_be_bytes());
                    b
                }
                _ => {
                    if cmd == CMD_WRITE_ZEROES {
                        PLAIN_ZERO.fetch_add(1, Ordering::SeqCst);
                    }
                    if cmd == CMD_WRITE {
                        let mut sink = vec![0u8; len as usize];
                        if s.read_exact(&mut sink).is_err() {
                            return;
                        }
                    }
                    let mut b = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
                    b.extend_from_slice(&0u32.to_be_bytes());
                    b.extend_from_slice(&cookie.to_be_bytes());
                    b
                }
            },
            // Served as Good (mapped above).
            Script::MultiSilent | Script::MultiDrip => return,
        };
        if s.write_all(&reply).is_err() {
            return;
        }
    }
}

impl Fake {
    fn start(script: Script) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("fake.sock");
        let l = UnixListener::bind(&sock).unwrap();
        let handle = std::thread::spawn(move || {
            // Serve connections until the listener errors (test end).
            l.set_nonblocking(false).unwrap();
            for (i, s) in l.incoming().take(4).enumerate() {
                match s {
                    Ok(s) if i > 0 && matches!(script, Script::MultiSilent) => {
                        std::thread::spawn(move || {
                            std::thread::sleep(Duration::from_secs(10));
                            drop(s)
                        });
                    }
                    Ok(mut s) if i > 0 && matches!(script, Script::MultiDrip) => {
                        std::thread::spawn(move || {
                            for b in NBDMAGIC.to_be_bytes() {
                                std::thread::sleep(Duration::from_millis(200));
                                if s.write_all(&[b]).is_err() {
                                    return;
                                }
                            }
                        });
                    }
                    Ok(s) => {
                        std::thread::spawn(move || serve(s, script));
                    }
                    Err(_) => return,
                }
            }
        });
        Fake {
            sock,
            _dir: dir,
            handle: Some(handle),
        }
    }
    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        // The accept thread is detached; it exits with the process.
        let _ = self.handle.take();
    }
}

fn opts() -> ConnectOptions {
    ConnectOptions {
        io_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(5),
        ..ConnectOptions::default()
    }
}

/// Runs one READ against `script` in a thread; fails the test on a hang.
fn read_error(script: Script) -> Error {
    let f = Fake::start(script);
    let c = Client::connect_with(&f.uri("disk"), opts()).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut b = vec![0u8; 8192];
        let _ = tx.send(c.read_at(4096, &mut b));
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(())) => panic!("{script:?}: read cannot succeed"),
        Ok(Err(e)) => {
            eprintln!("{script:?}: {e}");
            e
        }
        Err(_) => panic!("{script:?}: read hung"),
    }
}

#[test]
fn hang_times_out() {
    let t0 = Instant::now();
    assert!(matches!(read_error(Script::Hang), Error::Timeout { .. }));
    assert!(t0.elapsed() < Duration::from_secs(6));
}

#[test]
fn malformed_replies_are_protocol_errors() {
    for s in [
        Script::WrongMagic,
        Script::UnknownCookie,
        Script::ChunkOverrun,
        Script::DataOutsideRequest,
        Script::OverlappingChunks,
        Script::SuccessWithoutData,
    ] {
        let e = read_error(s);
        assert!(matches!(e, Error::Protocol(_)), "{s:?}: {e:?}");
    }
}

#[test]
fn huge_block_status_is_refused_without_allocating() {
    let f = Fake::start(Script::HugeBlockStatus);
    let c = Client::connect_with(&f.uri("disk"), opts()).unwrap();
    let e = c.extents(0, SIZE).unwrap_err();
    assert!(
        matches!(e, Error::Protocol(ProtoError::TooLong { .. })),
        "{e:?}"
    );
}

#[test]
fn a_map_in_one_byte_pieces_is_kept_bounded() {
    // A megabyte described byte by byte would be a million extents: the
    // client keeps MAX_EXTENTS, contiguous from the start, and says how far
    // they reach; asking again from there goes on.
    let f = Fake::start(Script::Confetti);
    let c = Client::connect_with(&f.uri("disk"), opts()).unwrap();
    let ext = c.extents(0, SIZE).unwrap();
    assert_eq!(ext.len(), ferry_nbd::MAX_EXTENTS);
    let mut at = 0;
    for e in &ext {
        assert_eq!((e.offset, e.len, e.hole), (at, 1, at % 2 == 1));
        // A hole the server does not say reads as zeros is read.
        assert!(!e.skippable());
        at += 1;
    }
    let more = c.extents(at, SIZE - at).unwrap();
    assert_eq!(more.len(), ferry_nbd::MAX_EXTENTS);
    assert_eq!(more[0].offset, at);
    // A copy reads past what it could keep of the map, and reads the
    // holes: every byte arrives.
    let d = tempfile::tempdir().unwrap();
    let out = std::fs::File::create(d.path().join("out")).unwrap();
    ferry_nbd::copy_to_file(&c, &out, 1).unwrap();
    let got = std::fs::read(d.path().join("out")).unwrap();
    assert!(got.len() == SIZE as usize && got.iter().all(|&b| b == 0x5a));
}

#[test]
fn server_errors_are_named() {
    let e = read_error(Script::ErrorChunk);
    assert_eq!(e.server_errno(), Some(EIO));
    let m = e.to_string();
    assert!(
        m.contains("EIO") && m.contains("boom") && m.contains("READ"),
        "{m}"
    );
    let e = read_error(Script::SimpleError);
    assert!(e.to_string().contains("ENOSPC"), "{e}");
}

#[test]
fn server_closing_is_connection_lost() {
    let e = read_error(Script::Close);
    assert!(matches!(e, Error::ConnectionLost(_)), "{e:?}");
}

#[test]
fn unknown_export_names_the_export() {
    let f = Fake::start(Script::Good);
    let e = Client::connect_with(&f.uri("other"), opts()).unwrap_err();
    assert!(
        matches!(e, Error::ExportNotFound { ref export, .. } if export == "other"),
        "{e:?}"
    );
    let m = e.to_string();
    assert!(
        m.contains("\"other\"") && m.contains("no such export here"),
        "{m}"
    );
}

#[test]
fn good_server_chunks_and_contexts() {
    let f = Fake::start(Script::Good);
    let c = Client::connect_with(&f.uri("disk"), opts()).unwrap();
    assert_eq!(c.size(), SIZE);
    assert!(c.has_block_status() && c.can_zero() && c.can_flush() && c.can_fast_zero());
    let mut b = vec![1u8; 10000];
    c.read_at(100, &mut b).unwrap();
    assert!(b[..5000].iter().all(|&x| x == 0x5a) && b[5000..].iter().all(|&x| x == 0));
    let ext = c.extents(8192, 65536).unwrap();
    assert_eq!(ext.len(), 2);
    assert!(!ext[0].skippable() && ext[0].len == 4096);
    assert!(ext[1].hole && ext[1].zero && ext[1].offset == 8192 + 4096);
    c.write_at(0, &[3u8; 5000]).unwrap();
    // FAST_ZERO refused with ENOTSUP: retried without it, and not tried again.
    c.write_zeroes(0, 4096).unwrap();
    c.write_zeroes(8192, 4096).unwrap();
    assert_eq!(FAST_ZERO_REFUSED.load(Ordering::SeqCst), 1);
    assert_eq!(PLAIN_ZERO.load(Ordering::SeqCst), 2);
    c.flush().unwrap();
    // Many requests in flight from several threads on one connection.
    let conn = c.connection().clone();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let conn = conn.clone();
            s.spawn(move || {
                let tickets: Vec<_> = (0..32u64)
                    .map(|i| {
                        conn.submit_read((t * 32 + i) * 4096, vec![0u8; 4096])
                            .unwrap()
                    })
                    .collect();
                for tk in tickets {
                    tk.wait().unwrap();
                }
            });
        }
    });
    assert_eq!(conn.in_flight(), 0);
}

#[test]
fn tls_is_refused_clearly() {
    let e = Client::connect("nbds://127.0.0.1/disk").unwrap_err();
    assert!(e.to_string().contains("TLS not supported yet"), "{e}");
}

#[test]
fn extra_connections_that_do_not_answer_are_left_out() {
    for script in [Script::MultiSilent, Script::MultiDrip] {
        let f = Fake::start(script);
        let t0 = Instant::now();
        let pool = ferry_nbd::Pool::connect(&f.uri("disk"), 4).unwrap();
        // The extra handshakes get 0.25 s in all, not each and not per read.
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "{script:?}: {:?}",
            t0.elapsed()
        );
        assert_eq!(pool.connections(), 1, "{script:?}");
        let mut b = vec![0u8; 8192];
        pool.read_at(4096, &mut b).unwrap();
    }
}
