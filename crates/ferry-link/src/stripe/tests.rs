//! Striping over real loopback connections: in order whatever the
//! interleaving, and every malformed stripe refused.

use super::*;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use ferry_channel::{ChannelReader, ChannelWriter, Psk, Role};
use proptest::prelude::*;

use crate::direct::{accept_authenticated, Accepted, HANDSHAKE_TIMEOUT};

/// `n` connected loopback pairs: (client ends, server ends).
fn lanes(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut a = Vec::new();
    let mut b = Vec::new();
    for _ in 0..n {
        a.push(TcpStream::connect(addr).unwrap());
        b.push(l.accept().unwrap().0);
    }
    (a, b)
}

fn chunk(seq: u64, data: &[u8]) -> Vec<u8> {
    let mut v = seq.to_be_bytes().to_vec();
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

fn read_all(r: &mut StripeReader) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    r.read_to_end(&mut out).map(|_| out)
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn a_writer_and_a_reader_move_bytes_in_order() {
    for n in [2, 3, 8] {
        let (a, b) = lanes(n);
        let data = pattern(9 << 20);
        let sent = data.clone();
        let t = thread::spawn(move || {
            let mut w = StripeWriter::new(a.iter().map(|s| s.try_clone().unwrap()).collect());
            // Writes of odd sizes, large and small.
            let mut off = 0;
            let mut step = 1;
            while off < sent.len() {
                let k = step.min(sent.len() - off);
                w.write_all(&sent[off..off + k]).unwrap();
                off += k;
                step = (step * 3 + 1) % (700 << 10) + 1;
            }
            w.flush().unwrap();
            for s in &a {
                s.shutdown(Shutdown::Write).unwrap();
            }
        });
        let mut r = StripeReader::new(b, Some(Duration::from_secs(10)));
        let got = read_all(&mut r).unwrap();
        t.join().unwrap();
        assert!(got == data, "{n} connections: bytes differ");
    }
}

/// A chunk to put on a lane: (lane, seq, data).
type Placed = (usize, u64, Vec<u8>);

/// Writes the chunks given and ends every lane.
fn stripe(chunks: &[Placed], n: usize) -> std::io::Result<Vec<u8>> {
    let (mut a, b) = lanes(n);
    for (lane, seq, data) in chunks {
        a[*lane].write_all(&chunk(*seq, data)).unwrap();
    }
    for s in &a {
        s.shutdown(Shutdown::Write).unwrap();
    }
    read_all(&mut StripeReader::new(b, Some(Duration::from_secs(5))))
}

#[test]
fn chunks_come_out_in_seq_order_not_arrival_order() {
    let got = stripe(
        &[
            (0, 1, b"world".to_vec()),
            (1, 0, b"hello ".to_vec()),
            (0, 3, b"!".to_vec()),
            (1, 2, b" again".to_vec()),
        ],
        2,
    )
    .unwrap();
    assert_eq!(got, b"hello world again!");
}

#[test]
fn malformed_stripes_fail() {
    let cases: Vec<(&str, Vec<Placed>)> = vec![
        (
            "a chunk again",
            vec![(0, 0, b"a".to_vec()), (1, 0, b"a".to_vec())],
        ),
        (
            "on two connections",
            vec![(0, 1, b"a".to_vec()), (1, 1, b"a".to_vec())],
        ),
        ("a gap", vec![(0, 0, b"a".to_vec()), (1, 2, b"c".to_vec())]),
        ("only later chunks", vec![(0, 5, b"a".to_vec())]),
        ("an empty chunk", vec![(0, 0, Vec::new())]),
    ];
    for (what, chunks) in cases {
        let res = stripe(&chunks, 2);
        let e = res.expect_err(what);
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{what}: {e}");
    }
}

#[test]
fn oversized_chunks_and_cut_chunks_fail() {
    let (mut a, b) = lanes(2);
    let mut head = 0u64.to_be_bytes().to_vec();
    head.extend_from_slice(&((MAX_CHUNK + 1) as u32).to_be_bytes());
    a[0].write_all(&head).unwrap();
    let e = read_all(&mut StripeReader::new(b, None)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");

    let (a, b) = lanes(2);
    let mut c = chunk(0, b"abcdef");
    c.truncate(15);
    (&a[1]).write_all(&c).unwrap();
    drop(a);
    let e = read_all(&mut StripeReader::new(b, None)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");

    let (a, b) = lanes(2);
    (&a[0]).write_all(&chunk(0, b"ab")[..7]).unwrap();
    drop(a);
    let e = read_all(&mut StripeReader::new(b, None)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
}

#[test]
fn a_silent_stripe_times_out_and_a_stalled_lane_too() {
    let (_a, b) = lanes(3);
    let t = Instant::now();
    let e = read_all(&mut StripeReader::new(b, Some(Duration::from_millis(200)))).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    assert!(t.elapsed() >= Duration::from_millis(200));
    // Chunk 1 arrived; chunk 0's connection says nothing: no progress.
    let (a, b) = lanes(2);
    (&a[1]).write_all(&chunk(1, b"later")).unwrap();
    let mut r = StripeReader::new(b, Some(Duration::from_millis(200)));
    let e = r.read(&mut [0u8; 16]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
}

/// One connection ended after its chunk; the other stays open and says
/// nothing (it died without a reset): the read fails after the grace,
/// without any idle timeout set.
#[test]
fn a_connection_that_ended_while_another_went_silent_fails() {
    let (a, b) = lanes(2);
    (&a[0]).write_all(&chunk(0, b"first")).unwrap();
    a[0].shutdown(Shutdown::Write).unwrap();
    let mut r = StripeReader::new(b, None);
    r.set_grace(Duration::from_millis(300));
    let t = Instant::now();
    let e = read_all(&mut r).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
    drop(a);
}

#[test]
fn the_count_follows_the_round_trip() {
    assert_eq!(auto_count(None), 1);
    assert_eq!(auto_count(Some(Duration::from_micros(60))), 1);
    assert_eq!(auto_count(Some(Duration::from_millis(10))), 4);
    assert_eq!(auto_count(Some(Duration::from_millis(100))), 8);
    assert_eq!("auto".parse::<Streams>(), Ok(Streams::Auto));
    assert_eq!("8".parse::<Streams>(), Ok(Streams::Fixed(8)));
    assert!("0".parse::<Streams>().is_err());
    assert!("17".parse::<Streams>().is_err());
    let (a, _b) = lanes(1);
    let rtt = tcp_rtt(&a[0]).expect("a loopback connection has a round trip");
    assert!(rtt < Duration::from_millis(50), "{rtt:?}");
}

const KEY: &[u8] = b"a key for striping 0123456789";

/// The first session on `l` with [`KEY`] (within 20 s); with `strict`, a
/// refused connection fails the test.
fn accept_one(l: &TcpListener, strict: bool) -> (ferry_channel::Session, Conn) {
    let psk = Psk::new(KEY).unwrap();
    let mut refused = |_, e| assert!(!strict, "refused: {e}");
    match accept_authenticated(
        l,
        &psk,
        Some(Duration::from_secs(20)),
        &mut refused,
        &|| false,
    ) {
        Ok(Accepted::Peer(session, conn)) => (session, conn),
        _ => panic!("no session"),
    }
}

/// A session of `n` connections, joined and accepted for real, carrying a
/// channel both ways.
#[test]
fn a_joined_session_carries_a_channel_both_ways() {
    for n in [1u8, 4] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = thread::spawn(move || {
            let (session, conn) = accept_one(&l, true);
            assert_eq!(conn.count(), usize::from(n));
            let mut r = ChannelReader::new(conn.reader(None).unwrap(), &session);
            let mut w = ChannelWriter::new(conn.writer().unwrap(), &session);
            let mut got = Vec::new();
            r.read_to_end(&mut got).unwrap();
            w.write_all(&xxhash_rust::xxh3::xxh3_64(&got).to_le_bytes())
                .unwrap();
            w.finish().unwrap();
            conn.shutdown(Shutdown::Write);
            got.len()
        });
        let psk = Psk::new(KEY).unwrap();
        let first = TcpStream::connect(addr).unwrap();
        let (session, conn) =
            join_client(first, &psk, Streams::Fixed(n), HANDSHAKE_TIMEOUT).unwrap();
        assert_eq!(conn.count(), usize::from(n));
        let data = pattern(5 << 20);
        let mut w = ChannelWriter::new(conn.writer().unwrap(), &session);
        let mut r = ChannelReader::new(conn.reader(None).unwrap(), &session);
        w.write_all(&data).unwrap();
        w.finish().unwrap();
        conn.shutdown(Shutdown::Write);
        let mut back = Vec::new();
        r.read_to_end(&mut back).unwrap();
        assert_eq!(back, xxhash_rust::xxh3::xxh3_64(&data).to_le_bytes());
        assert_eq!(server.join().unwrap(), data.len());
    }
}

/// A session from a real handshake (its keys do not matter here).
fn session() -> ferry_channel::Session {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let t = thread::spawn(move || {
        let psk = Psk::new(KEY).unwrap();
        ferry_channel::handshake(&mut b.try_clone().unwrap(), &mut &b, &psk, Role::Responder)
    });
    let psk = Psk::new(KEY).unwrap();
    let _ = ferry_channel::handshake(&mut a.try_clone().unwrap(), &mut &a, &psk, Role::Initiator);
    t.join().unwrap().unwrap()
}

/// Connections that do not fit their session are refused, and the one
/// that completes it still makes the session.
#[test]
fn groups_refuse_what_does_not_fit() {
    use ferry_channel::Join;
    let j = Join::fresh(3).unwrap();
    let mut g = Groups::new(Duration::from_secs(30));
    let (_a, mut b) = lanes(5);
    assert!(matches!(g.add(j, session(), b.remove(0)), Joined::Waiting));
    let twice = g.add(Join { index: 0, ..j }, session(), b.remove(0));
    assert!(matches!(twice, Joined::Refused(_)));
    let other_count = g.add(
        Join {
            index: 1,
            count: 4,
            ..j
        },
        session(),
        b.remove(0),
    );
    assert!(matches!(other_count, Joined::Refused(_)));
    assert!(matches!(
        g.add(Join { index: 2, ..j }, session(), b.remove(0)),
        Joined::Waiting
    ));
    let Joined::Complete(_, conn) = g.add(Join { index: 1, ..j }, session(), b.remove(0)) else {
        panic!("the third connection completes the session")
    };
    assert_eq!(conn.count(), 3);
}

#[test]
fn incomplete_sessions_hold_a_bounded_number_of_connections() {
    use ferry_channel::Join;
    let mut g = Groups::new(Duration::from_secs(30));
    let (_a, b) = lanes(MAX_HELD + 8);
    for s in b {
        let j = Join::fresh(2).unwrap();
        assert!(matches!(g.add(j, session(), s), Joined::Waiting));
    }
    assert!(g.held() <= MAX_HELD);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]
    /// Any assignment of chunks to connections (in order within each)
    /// reads back as the bytes in seq order.
    #[test]
    fn any_interleaving_reads_back_in_order(
        sizes in proptest::collection::vec(1usize..3000, 1..40),
        lanes_of in proptest::collection::vec(0usize..4, 40),
    ) {
        let mut chunks = Vec::new();
        let mut want = Vec::new();
        for (k, &len) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|i| (i + k * 31) as u8).collect();
            want.extend_from_slice(&data);
            chunks.push((lanes_of[k], k as u64, data));
        }
        // Write lane by lane (each lane's chunks stay in seq order).
        chunks.sort_by_key(|c| c.0);
        prop_assert_eq!(stripe(&chunks, 4).unwrap(), want);
    }
}

/// Silent strangers crowding the listener, before and while a striped
/// client joins: the client's connections are not pushed out by each
/// other, a handshake that finished on a connection cut short never joins
/// a session, and the session that starts carries data.
#[test]
fn a_crowd_of_silent_strangers_does_not_break_a_striped_session() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (session, conn) = accept_one(&l, false);
        let mut r = ChannelReader::new(
            conn.reader(Some(Duration::from_secs(10))).unwrap(),
            &session,
        );
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        got.len()
    });
    let crowd: Vec<TcpStream> = (0..70).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let more = thread::spawn(move || {
        // (Once the session is over, the listener is gone: refused.)
        (0..40)
            .filter_map(|_| {
                thread::sleep(Duration::from_millis(2));
                TcpStream::connect(addr).ok()
            })
            .collect::<Vec<_>>()
    });
    let psk = Psk::new(KEY).unwrap();
    let first = TcpStream::connect(addr).unwrap();
    let (session, conn) = join_client(first, &psk, Streams::Fixed(16), HANDSHAKE_TIMEOUT).unwrap();
    let mut w = ChannelWriter::new(conn.writer().unwrap(), &session);
    w.write_all(&pattern(3 << 20)).unwrap();
    w.finish().unwrap();
    conn.shutdown(Shutdown::Write);
    assert_eq!(server.join().unwrap(), 3 << 20);
    drop((crowd, more.join().unwrap()));
}

/// A daemon's stream follows its request on the same connections: the
/// chunks' numbers go on across reader and writer handles, and what one
/// reader took in ahead is there for the next (found by CI: the client's
/// first reader had read the stream's first chunk with the answer).
#[test]
fn handles_made_one_after_the_other_share_the_stripe() {
    let (a, b) = lanes(3);
    let (a, b) = (Conn::striped(a).unwrap(), Conn::striped(b).unwrap());
    let mut w1 = a.writer().unwrap();
    w1.write_all(b"answer").unwrap();
    w1.flush().unwrap();
    drop(w1);
    let mut w2 = a.writer().unwrap();
    w2.write_all(&pattern(1 << 20)).unwrap();
    w2.flush().unwrap();
    a.shutdown(Shutdown::Write);
    // Everything has arrived before the first reader reads.
    thread::sleep(Duration::from_millis(100));
    let mut r1 = b.reader(Some(Duration::from_secs(5))).unwrap();
    let mut head = [0u8; 6];
    r1.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"answer");
    drop(r1);
    let mut rest = Vec::new();
    b.reader(Some(Duration::from_secs(5)))
        .unwrap()
        .read_to_end(&mut rest)
        .unwrap();
    assert!(rest == pattern(1 << 20));
}
