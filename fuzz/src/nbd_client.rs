//! `nbd_client`: ferry-nbd's real client ([`ferry_nbd::Client`]: the
//! handshake and the reply reader thread) against a server played by the
//! input, over a unix socket.
//!
//! Input: `flags`, then records. The fake server sends record 0 (the
//! greeting, …) on connect, then one record after each message the client
//! sends (its flags, each option, each request), then closes; if the
//! client sends nothing for a few milliseconds, the server sends the rest
//! at once. `flags & 1` turns structured replies off, `flags & 2`
//! `base:allocation`. After a successful handshake the client READs, asks
//! for extents, WRITEs, FLUSHes and zeroes what the export allows.
//! Asserted:
//!
//! * the client returns from every call (within
//!   [`crate::util::DEADLINE`]), never panics, never hangs on a server
//!   that stops talking;
//! * what the handshake reports is what the spec allows (no
//!   `base:allocation` without structured replies);
//! * a READ that succeeds hands back a buffer of the length asked for;
//! * extents that succeed tile the range asked for, or a prefix of it (cut
//!   at [`ferry_nbd::MAX_EXTENTS`] extents or [`ferry_nbd::MAX_QUERIES`]
//!   replies), in order, none empty;
//! * a WRITE, FLUSH or WRITE_ZEROES that succeeds is answered `Done`.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use ferry_nbd::proto::{CMD_WRITE, IHAVEOPT, REQUEST_MAGIC};
use ferry_nbd::{Client, ConnectOptions, Reply};

use crate::util::{bounded, records, DEADLINE};

/// How long the server waits for the client's next message before it
/// sends the rest of its script anyway.
const PATIENCE: Duration = Duration::from_millis(5);

struct Server {
    path: PathBuf,
    listener: Mutex<UnixListener>,
}

fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        let path = crate::util::process_dir("nbd").join("nbd.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        Server {
            path,
            listener: Mutex::new(listener),
        }
    })
}

/// One message of the client, as the server reads it; false at the end.
fn read_client_message(s: &mut UnixStream, first: bool) -> std::io::Result<bool> {
    if first {
        let mut f = [0u8; 4];
        s.read_exact(&mut f)?;
        return Ok(true);
    }
    let mut m = [0u8; 4];
    s.read_exact(&mut m)?;
    if m == IHAVEOPT.to_be_bytes()[..4] {
        let mut h = [0u8; 12];
        s.read_exact(&mut h)?;
        let len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
        std::io::copy(&mut s.take(u64::from(len)), &mut std::io::sink())?;
    } else if m == REQUEST_MAGIC.to_be_bytes() {
        let mut h = [0u8; 24];
        s.read_exact(&mut h)?;
        let cmd = u16::from_be_bytes([h[2], h[3]]);
        let len = u32::from_be_bytes([h[20], h[21], h[22], h[23]]);
        if cmd == CMD_WRITE {
            std::io::copy(&mut s.take(u64::from(len)), &mut std::io::sink())?;
        }
    } else {
        return Ok(false);
    }
    Ok(true)
}

fn serve(mut s: UnixStream, recs: Vec<Vec<u8>>) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_write_timeout(Some(DEADLINE / 2));
    let mut patient = true;
    for (i, r) in recs.iter().enumerate() {
        if i > 0 && patient {
            let _ = s.set_read_timeout(Some(PATIENCE));
            match read_client_message(&mut s, i == 1) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    patient = false
                }
                Err(_) => break,
            }
        }
        if s.write_all(r).is_err() {
            break;
        }
    }
    let _ = s.shutdown(Shutdown::Write);
    // Drain until the client hangs up.
    let _ = s.set_read_timeout(Some(DEADLINE / 2));
    let _ = std::io::copy(&mut s, &mut std::io::sink());
}

pub fn run(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let recs: Vec<Vec<u8>> = records(rest).take(32).map(<[u8]>::to_vec).collect();
    let srv = server();
    let threads = crate::util::Threads::before();
    let listener = srv.listener.lock().unwrap_or_else(|p| p.into_inner());
    let uri = format!("nbd+unix:///fuzz?socket={}", srv.path.display());
    let opts = ConnectOptions {
        connect_timeout: DEADLINE / 4,
        io_timeout: DEADLINE / 4,
        max_in_flight: 4,
        structured_replies: flags & 1 == 0,
        block_status: flags & 2 == 0,
    };
    let client = std::thread::spawn(move || match Client::connect_with(&uri, opts) {
        Ok(c) => exercise(&c),
        Err(e) if crate::util::verbose() => eprintln!("nbd_client: connect: {e}"),
        Err(_) => {}
    });
    let start = Instant::now();
    let conn = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(start.elapsed() < DEADLINE, "the client never connected");
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    let srv_thread = std::thread::spawn(move || serve(conn, recs));
    bounded("the NBD client", move || {
        client.join().expect("the client panicked")
    });
    bounded("the fake server", move || {
        srv_thread.join().expect("server")
    });
    threads.settle("the NBD client");
}

fn exercise(c: &Client) {
    let info = c.info().clone();
    let say = |what: &str, r: &dyn std::fmt::Debug| {
        if crate::util::verbose() {
            eprintln!("nbd_client: {what}: {r:?}");
        }
    };
    say("connected", &info);
    assert!(
        info.structured || info.base_allocation.is_none(),
        "base:allocation without structured replies: {info:?}"
    );
    let conn = c.connection();
    let size = info.size;
    if size == 0 {
        return;
    }
    let n = size.min(4096) as usize;
    if n as u64 <= u64::from(info.max_payload()) {
        if let Ok(t) = conn.submit_read(0, vec![0u8; n]) {
            let r = t.wait();
            say("READ", &r.as_ref().map(|_| ()));
            match r {
                Ok(Reply::Data(d)) => assert_eq!(d.len(), n, "READ of {n} bytes"),
                Ok(other) => panic!("READ answered with {other:?}"),
                Err(_) => {}
            }
        }
    }
    let len = size.min(1 << 20);
    let ext = c.extents(0, len);
    say("extents", &ext);
    if let Ok(ext) = ext {
        let mut at = 0;
        for e in &ext {
            assert!(e.offset == at && e.len > 0, "extents {ext:?} of [0, {len})");
            at += e.len;
        }
        // All of it, or a prefix that is not empty (the client stops at
        // MAX_EXTENTS extents or MAX_QUERIES replies).
        assert!(
            at == len || (at > 0 && at < len),
            "extents {ext:?} do not cover a prefix of [0, {len})"
        );
    }
    let done = |what: &str, t: ferry_nbd::Result<ferry_nbd::Ticket>| {
        if let Ok(t) = t {
            let r = t.wait();
            say(what, &r);
            match r {
                Ok(Reply::Done) | Err(_) => {}
                Ok(other) => panic!("{what} answered with {other:?}"),
            }
        }
    };
    if !info.read_only() {
        done(
            "WRITE",
            conn.submit_write(0, &[1, 2, 3, 4][..n.min(4)], false),
        );
    }
    if info.can_flush() {
        done("FLUSH", conn.submit_flush());
    }
    if info.can_zero() && !info.read_only() {
        let _ = c.write_zeroes(0, n as u64);
    }
}
