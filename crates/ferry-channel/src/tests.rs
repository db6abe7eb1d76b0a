//! The channel's handshake and frames, end to end and under tampering.

use super::*;
use std::os::unix::net::UnixStream;
use std::thread;

fn pair(k1: &[u8], k2: &[u8]) -> (Result<(), ChannelError>, Result<(), ChannelError>) {
    let (a, b) = UnixStream::pair().unwrap();
    let k2 = k2.to_vec();
    let t = thread::spawn(move || {
        let psk = Psk::new(&k2).unwrap();
        establish(b.try_clone().unwrap(), b, &psk, Role::Responder).map(|_| ())
    });
    let psk = Psk::new(k1).unwrap();
    let r1 = establish(a.try_clone().unwrap(), a, &psk, Role::Initiator).map(|_| ());
    (r1, t.join().unwrap())
}

#[test]
fn key_must_be_long_enough() {
    assert!(matches!(
        Psk::new(b"  short \n"),
        Err(ChannelError::KeyTooShort(5))
    ));
    assert!(Psk::new(b"0123456789abcdef\n").is_ok());
    assert_eq!(Psk::generate_hex().unwrap().len(), 32);
}

#[test]
fn wrong_key_fails_on_both_sides() {
    let (a, b) = pair(b"0123456789abcdef0", b"0123456789abcdef1");
    assert!(matches!(a, Err(ChannelError::WrongKey)), "{a:?}");
    assert!(matches!(b, Err(ChannelError::WrongKey)), "{b:?}");
    let (a, b) = pair(b"0123456789abcdef0", b"0123456789abcdef0\n");
    assert!(a.is_ok() && b.is_ok());
}

#[test]
fn garbage_hello_is_reported() {
    let (mut a, b) = UnixStream::pair().unwrap();
    a.write_all(b"SSH-2.0-OpenSSH_9.9 banner text here that is long enough")
        .unwrap();
    let psk = Psk::new(b"0123456789abcdef").unwrap();
    match establish(b.try_clone().unwrap(), b, &psk, Role::Responder) {
        Err(ChannelError::BadHello(t)) => assert!(t.starts_with("SSH-2.0")),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted garbage"),
    }
}

fn connected() -> (ChannelReader<UnixStream>, ChannelWriter<UnixStream>) {
    let (a, b) = UnixStream::pair().unwrap();
    let t = thread::spawn(move || {
        let psk = Psk::new(b"0123456789abcdef").unwrap();
        establish(b.try_clone().unwrap(), b, &psk, Role::Responder).unwrap()
    });
    let psk = Psk::new(b"0123456789abcdef").unwrap();
    let (_r, w, _) = establish(a.try_clone().unwrap(), a, &psk, Role::Initiator).unwrap();
    let (r, _w, _) = t.join().unwrap();
    (r, w)
}

#[test]
fn frames_roundtrip_and_end() {
    let (mut r, mut w) = connected();
    let t = thread::spawn(move || {
        for i in 0..50u32 {
            w.send_frame(&vec![i as u8; (i as usize) * 1000]).unwrap();
        }
        w.write_all(&vec![9u8; 3 << 20]).unwrap();
        w.finish().unwrap();
        assert!(w.send_frame(b"x").is_err());
    });
    for i in 0..50u32 {
        match r.next_frame().unwrap() {
            Frame::Data(d) => assert_eq!(d, &vec![i as u8; (i as usize) * 1000][..]),
            Frame::End => panic!("early end"),
        }
    }
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert_eq!(rest.len(), 3 << 20);
    t.join().unwrap();
    assert_eq!(r.next_frame().unwrap(), Frame::End);
}

/// Capture the sealed bytes of a few frames with a known key.
fn sealed(frames: &[&[u8]], end: bool) -> Vec<u8> {
    let s = Session::with_keys(Suite::ChaCha20Poly1305, &[7; 32], &[7; 32]).unwrap();
    let mut w = ChannelWriter::new(Vec::new(), &s);
    for f in frames {
        w.send_frame(f).unwrap();
    }
    if end {
        w.finish().unwrap();
    }
    w.into_inner()
}

fn read_all(bytes: &[u8]) -> Result<Vec<Vec<u8>>, ChannelError> {
    let mut r = ChannelReader::with_key(bytes, Suite::ChaCha20Poly1305, [7; 32]).unwrap();
    let mut v = Vec::new();
    loop {
        match r.next_frame()? {
            Frame::Data(d) => v.push(d.to_vec()),
            Frame::End => return Ok(v),
        }
    }
}

#[test]
fn tamper_replay_reorder_truncate_are_errors() {
    let good = sealed(&[b"hello", b"world"], true);
    assert_eq!(
        read_all(&good).unwrap(),
        vec![b"hello".to_vec(), b"world".to_vec()]
    );
    // Truncated anywhere, including right before the end frame.
    for cut in 0..good.len() {
        assert!(read_all(&good[..cut]).is_err(), "cut {cut}");
    }
    let f1 = 4 + 1 + 5 + TAG;
    assert!(matches!(
        read_all(&good[..2 * f1]),
        Err(ChannelError::Truncated)
    ));
    // Any flipped bit.
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x10;
        assert!(read_all(&bad).is_err(), "flip {i}");
    }
    // Reordered and replayed frames.
    let mut swapped = good[f1..2 * f1].to_vec();
    swapped.extend_from_slice(&good[..f1]);
    swapped.extend_from_slice(&good[2 * f1..]);
    assert!(matches!(read_all(&swapped), Err(ChannelError::BadFrame)));
    let mut replay = good[..f1].to_vec();
    replay.extend_from_slice(&good[..f1]);
    assert!(matches!(read_all(&replay), Err(ChannelError::BadFrame)));
    // Oversized length field refused before allocating.
    let mut huge = vec![0xff, 0xff, 0xff, 0xff];
    huge.extend_from_slice(&[0; 64]);
    assert!(matches!(read_all(&huge), Err(ChannelError::BadLength(_))));
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { failure_persistence: None, ..proptest::test_runner::Config::default() })]
    #[test]
    fn any_frames_roundtrip_and_any_flip_is_caught(
        frames in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000), 0..8),
        flip in proptest::prelude::any::<usize>(),
        bit in 0u8..8,
    ) {
        let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        let good = sealed(&refs, true);
        proptest::prop_assert_eq!(read_all(&good).unwrap(), frames);
        let mut bad = good.clone();
        let i = flip % bad.len();
        bad[i] ^= 1 << bit;
        proptest::prop_assert!(read_all(&bad).is_err());
    }
}

#[test]
fn keepalives_are_skipped_authenticated_and_counted() {
    let s = Session::with_keys(Suite::ChaCha20Poly1305, &[7; 32], &[7; 32]).unwrap();
    let mut w = ChannelWriter::new(Vec::new(), &s);
    w.keepalive().unwrap();
    w.send_frame(b"one").unwrap();
    w.keepalive().unwrap();
    w.keepalive().unwrap();
    w.send_frame(b"two").unwrap();
    w.finish().unwrap();
    assert!(matches!(w.keepalive(), Err(ChannelError::AfterEnd)));
    let good = w.into_inner();
    let mut r = ChannelReader::with_key(&good[..], Suite::ChaCha20Poly1305, [7; 32]).unwrap();
    assert_eq!(r.next_frame().unwrap(), Frame::Data(b"one"));
    assert_eq!(r.next_frame().unwrap(), Frame::Data(b"two"));
    assert_eq!(r.next_frame().unwrap(), Frame::End);
    assert_eq!(r.keepalives_seen(), 3);
    assert_eq!(
        read_all(&good).unwrap(),
        vec![b"one".to_vec(), b"two".to_vec()]
    );
    let ka = 4 + TAG;
    // A flipped bit anywhere in a keepalive fails.
    for i in 0..ka {
        let mut bad = good.clone();
        bad[i] ^= 0x01;
        assert!(read_all(&bad).is_err(), "flip {i}");
    }
    // A keepalive replayed, or moved ahead of an earlier one, fails.
    let mut replay = good[..ka].to_vec();
    replay.extend_from_slice(&good[..]);
    assert!(matches!(read_all(&replay), Err(ChannelError::BadFrame)));
    // Truncated inside a keepalive.
    assert!(matches!(
        read_all(&good[..ka - 3]),
        Err(ChannelError::Truncated)
    ));
    // A message frame's tag cannot pass as a keepalive.
    let mut forged = (TAG as u32).to_be_bytes().to_vec();
    forged.extend_from_slice(&good[good.len() - TAG..]);
    assert!(read_all(&forged).is_err());
}

#[test]
fn only_a_cut_pipe_is_worth_a_retry() {
    assert!(ChannelError::Truncated.retryable());
    for k in [
        io::ErrorKind::ConnectionReset,
        io::ErrorKind::BrokenPipe,
        io::ErrorKind::TimedOut,
        io::ErrorKind::UnexpectedEof,
    ] {
        assert!(ChannelError::Io(k.into()).retryable(), "{k:?}");
    }
    assert!(!ChannelError::Io(io::ErrorKind::PermissionDenied.into()).retryable());
    assert!(!ChannelError::WrongKey.retryable());
    assert!(!ChannelError::BadFrame.retryable());
    assert!(!ChannelError::BadHello("SSH-2.0".into()).retryable());
    assert!(!ChannelError::BadLength(1 << 30).retryable());
}

/// Both sides of a handshake over a socket pair, the initiator saying
/// `join`: the initiator's result and the responder's.
type Sides = (
    Result<(Session, Option<Join>), ChannelError>,
    Result<(Session, Option<Join>), ChannelError>,
);

fn joined(join: Option<Join>, plain_responder: bool) -> Sides {
    let (a, b) = UnixStream::pair().unwrap();
    let t = thread::spawn(move || {
        let psk = Psk::new(b"0123456789abcdef0").unwrap();
        let (mut r, mut w) = (b.try_clone().unwrap(), b);
        if plain_responder {
            handshake(&mut r, &mut w, &psk, Role::Responder).map(|s| (s, None))
        } else {
            handshake_join(&mut r, &mut w, &psk, Role::Responder, None)
        }
    });
    let psk = Psk::new(b"0123456789abcdef0").unwrap();
    let (mut r, mut w) = (a.try_clone().unwrap(), a);
    let i = handshake_join(&mut r, &mut w, &psk, Role::Initiator, join.as_ref());
    drop((r, w));
    (i, t.join().unwrap())
}

#[test]
fn a_join_reaches_the_responder_inside_the_handshake() {
    let j = Join {
        index: 2,
        ..Join::fresh(5).unwrap()
    };
    let (i, r) = joined(Some(j), false);
    assert!(matches!(i, Ok((_, None))));
    let (_, got) = r.unwrap();
    assert_eq!(got, Some(j));
    // Without one, none.
    let (i, r) = joined(None, false);
    assert!(i.is_ok());
    assert_eq!(r.unwrap().1, None);
    // Tokens are fresh each time.
    assert_ne!(Join::fresh(2).unwrap().token, Join::fresh(2).unwrap().token);
}

#[test]
fn a_side_that_takes_no_joins_refuses_one_and_bad_joins_never_leave() {
    let j = Join::fresh(4).unwrap();
    let (_, r) = joined(Some(j), true);
    assert!(
        matches!(r, Err(ChannelError::Handshake(_))),
        "{:?}",
        r.map(|_| ())
    );
    for bad in [
        Join { count: 1, ..j },
        Join {
            count: MAX_CONNECTIONS + 1,
            ..j
        },
        Join { index: 4, ..j },
    ] {
        assert!(!bad.valid());
        let (i, r) = joined(Some(bad), false);
        assert!(matches!(i, Err(ChannelError::Handshake(_))), "{bad:?}");
        assert!(r.is_err(), "{bad:?}");
    }
}
