//! Library-level send/recv over 127.0.0.1.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ferry_channel::{Psk, Role};
use ferry_stream::{bind, opened, recv_on, send, ErrorKind, Mode, Options, StreamError, Summary};
use rand::{Rng, SeedableRng};

fn opts(key: &str, mode: &str) -> Options {
    let mut o = Options::new(Psk::new(key.as_bytes()).expect("key"));
    o.compress = mode.parse::<Mode>().expect("mode");
    o.buffer = 16 << 20;
    o
}

const KEY: &str = "00112233445566778899aabbccddeeff";

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);
impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn random(n: usize) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(1);
    let mut v = vec![0u8; n];
    r.fill(&mut v[..]);
    v
}

fn text(n: usize) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(2);
    let words = [
        "alpha ",
        "beta ",
        "gamma ",
        "zfs ",
        "send ",
        "receive ",
        "\n",
        "pool/data@snap ",
    ];
    let mut v = Vec::with_capacity(n + 16);
    while v.len() < n {
        v.extend_from_slice(words[r.random_range(0..words.len())].as_bytes());
        v.extend_from_slice(r.random_range(0..1000u32).to_string().as_bytes());
    }
    v.truncate(n);
    v
}

/// Start a receiver on an ephemeral port; returns its address and the join
/// handle of its thread.
fn receiver<W: Write + Send + 'static>(
    o: Options,
    out: W,
) -> (SocketAddr, thread::JoinHandle<Result<Summary, StreamError>>) {
    let l = bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = l.local_addr().expect("addr");
    let h = thread::spawn(move || recv_on(&o, &l, opened(out), &|_, _| {}));
    (addr, h)
}

fn transfer(data: Vec<u8>, mode: &str) {
    let out = Shared::default();
    let (addr, h) = receiver(opts(KEY, mode), out.clone());
    let n = data.len() as u64;
    let digest = blake3::hash(&data).to_hex().to_string();
    let s = send(&opts(KEY, mode), io::Cursor::new(data.clone()), addr).expect("send");
    let r = h.join().expect("join").expect("recv");
    assert_eq!(s.bytes, n);
    assert_eq!(r.bytes, n);
    assert_eq!(s.blake3, digest);
    assert_eq!(r.blake3, digest);
    assert!(*out.0.lock().expect("lock") == data, "output differs");
    eprintln!(
        "{mode}: {n} bytes, {} on the wire, {:?}",
        s.wire_bytes, s.elapsed
    );
}

#[test]
fn transfers_random_data_byte_identical() {
    transfer(random(64 << 20), "auto");
}

#[test]
fn transfers_text_data_byte_identical_with_each_codec() {
    transfer(text(64 << 20), "auto");
    transfer(text(8 << 20), "lz4");
    transfer(text(8 << 20), "zstd:3");
    transfer(text(3 << 20 | 12345), "none");
    transfer(Vec::new(), "auto");
}

#[test]
fn compressible_data_is_smaller_on_the_wire() {
    let data = text(16 << 20);
    let out = Shared::default();
    let (addr, h) = receiver(opts(KEY, "zstd:1"), out.clone());
    let s = send(&opts(KEY, "zstd:1"), io::Cursor::new(data), addr).expect("send");
    h.join().expect("join").expect("recv");
    assert!(
        s.wire_bytes * 2 < s.bytes,
        "{} vs {}",
        s.wire_bytes,
        s.bytes
    );
}

#[test]
fn wrong_key_is_refused_on_both_sides() {
    // The receiver goes on waiting after a refused sender, up to `wait`.
    let mut o = opts(KEY, "auto");
    o.wait = Some(std::time::Duration::from_secs(2));
    let (addr, h) = receiver(o, Shared::default());
    let e = send(
        &opts("ffffffffffffffffffffffffffffffff", "auto"),
        io::Cursor::new(vec![1u8; 1000]),
        addr,
    )
    .expect_err("must fail");
    assert_eq!(e.kind, ErrorKind::WrongKey, "{e}");
    let e = h.join().expect("join").expect_err("must fail");
    assert_eq!(e.kind, ErrorKind::WrongKey, "{e}");
}

#[test]
fn port_in_use_is_reported() {
    let l = bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let e = bind(l.local_addr().expect("addr")).expect_err("must fail");
    assert_eq!(e.kind, ErrorKind::AddrInUse);
}

#[test]
fn unreachable_peer_is_reported() {
    let l = bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    let e = send(&opts(KEY, "auto"), io::Cursor::new(vec![0u8; 10]), addr).expect_err("must fail");
    assert_eq!(e.kind, ErrorKind::Unreachable);
}

#[test]
fn truncated_stream_is_detected() {
    let out = Shared::default();
    let (addr, h) = receiver(opts(KEY, "auto"), out);
    // A sender that speaks the protocol, sends one block and dies.
    let s = std::net::TcpStream::connect(addr).expect("connect");
    let psk = Psk::new(KEY.as_bytes()).expect("key");
    let (r, mut w, _) =
        ferry_channel::establish(s.try_clone().expect("clone"), s, &psk, Role::Initiator)
            .expect("hs");
    // START at 0 (see docs/PROTOCOL.md), then one BLOCK.
    let mut start = vec![0x04];
    start.extend_from_slice(&0u64.to_le_bytes());
    w.send_frame(&start).expect("frame");
    let mut m = vec![0x01, 0, 0];
    m.extend_from_slice(&5u32.to_le_bytes());
    m.extend_from_slice(b"hello");
    w.send_frame(&m).expect("frame");
    drop((r, w));
    let e = h.join().expect("join").expect_err("must fail");
    assert_eq!(e.kind, ErrorKind::PeerKilled, "{e}");
    assert!(e.msg.contains("truncated"), "{e}");
}

/// Produces endless data, like a `zfs send` that has much more to say.
struct Endless;
impl Read for Endless {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        b.fill(0x5a);
        Ok(b.len())
    }
}

/// Accepts `left` bytes, then fails like a pipe whose reader exited.
struct Closes {
    left: usize,
}
impl Write for Closes {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Err(io::Error::from(io::ErrorKind::BrokenPipe));
        }
        let n = b.len().min(self.left);
        self.left -= n;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn consumer_exit_stops_the_sender_promptly() {
    let (addr, h) = receiver(opts(KEY, "none"), Closes { left: 5 << 20 });
    let t = Instant::now();
    let e = send(&opts(KEY, "none"), Endless, addr).expect_err("must fail");
    assert_eq!(e.kind, ErrorKind::PeerConsumerExited, "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    let e = h.join().expect("join").expect_err("must fail");
    assert_eq!(e.kind, ErrorKind::ConsumerExited, "{e}");
}

struct FailsAfter {
    left: usize,
}
impl Read for FailsAfter {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Err(io::Error::other("disk on fire"));
        }
        let n = b.len().min(self.left);
        b[..n].fill(1);
        self.left -= n;
        Ok(n)
    }
}

#[test]
fn producer_failure_fails_both_sides() {
    let (addr, h) = receiver(opts(KEY, "auto"), Shared::default());
    let e = send(&opts(KEY, "auto"), FailsAfter { left: 3 << 20 }, addr).expect_err("must fail");
    assert_eq!(e.kind, ErrorKind::ProducerFailed, "{e}");
    let e = h.join().expect("join").expect_err("must fail");
    assert_eq!(e.kind, ErrorKind::ProducerFailed, "{e}");
    assert!(e.msg.contains("disk on fire"), "{e}");
}

/// Twenty connections that say nothing (more than the handshakes recv
/// runs at once) do not lock out the real sender.
#[test]
fn a_flood_of_silent_connections_does_not_lock_the_sender_out() {
    let out = Shared::default();
    let (addr, h) = receiver(opts(KEY, "auto"), out.clone());
    let silent: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(addr).expect("connect"))
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let data = vec![7u8; 100_000];
    send(&opts(KEY, "auto"), io::Cursor::new(data.clone()), addr).expect("send");
    h.join().expect("join").expect("recv");
    assert!(out.0.lock().expect("lock").as_slice() == data.as_slice());
    drop(silent);
}
