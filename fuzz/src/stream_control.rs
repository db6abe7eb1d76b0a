//! `stream_control`: the sending side of a stream
//! ([`ferry_stream::send_over`]) reading the receiver's verdict (ACK or
//! FAIL: see the ferry-stream crate docs) from a peer that holds the key.
//!
//! Input: `flags`, then records, each the payload of one channel frame the
//! receiver sends back after the stream. The harness does the real
//! handshake as the responder, sends an OFFER of nothing (unless
//! `flags & 4`: then the first record stands in for it; an OFFER of
//! anything else gets START at 0 from this input, which is not a file, a
//! FAIL that failure, and any other record an integrity failure), reads the
//! whole stream of a fixed [`INPUT`], then sends the records; with `flags & 2` a 45-byte ACK
//! record gets the true count and digest written in (so the fuzzer
//! reaches the success path); `flags & 1` leaves out the channel's end
//! frame. Asserted, beyond returning and not panicking: the outcome is
//! exactly what the first record says —
//!
//! * an ACK of the true count and digest: success, with the status it
//!   carries (`i32::MIN`: none) and nothing else;
//! * a FAIL of 6 bytes or more: that failure's kind (the receiver's
//!   consumer exiting reads as the peer's consumer) and status;
//! * anything else, or no reply: an integrity failure (a truncated
//!   channel: the peer was killed).

use std::io::Cursor;
use std::net::Shutdown;
use std::sync::mpsc;
use std::thread;

use ferry_channel::{establish, Frame, Role};
use ferry_stream::{send_over, ErrorKind};

use crate::stream_messages::{empty_offer, options, pair, psk, start_msg, ACK, FAIL, OFFER};
use crate::util::{await_done, records};

/// What the sender streams.
pub fn input() -> Vec<u8> {
    b"stream control input; "
        .iter()
        .copied()
        .cycle()
        .take(3000)
        .collect()
}

/// The kind a FAIL's code names (`ErrorKind::code` order).
fn kind_of(code: u8) -> ErrorKind {
    use ErrorKind::*;
    [
        Usage,
        WrongKey,
        AddrInUse,
        Unreachable,
        ConsumerExited,
        PeerConsumerExited,
        ProducerFailed,
        PeerKilled,
        Integrity,
        Io,
        TimedOut,
    ]
    .get(code as usize)
    .copied()
    .unwrap_or(Integrity)
}

pub fn run(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let input = input();
    let digest = *blake3::hash(&input).as_bytes();
    let mut recs: Vec<Vec<u8>> = records(rest).take(16).map(<[u8]>::to_vec).collect();
    let offer = if flags & 4 != 0 && !recs.is_empty() {
        recs.remove(0)
    } else {
        empty_offer()
    };
    let offer_ok = offer.len() == 41 && offer[0] == OFFER;
    if flags & 2 != 0 {
        for r in recs.iter_mut().filter(|r| r.len() == 45 && r[0] == ACK) {
            r[1..9].copy_from_slice(&(input.len() as u64).to_le_bytes());
            r[9..41].copy_from_slice(&digest);
        }
    }
    let threads = crate::util::Threads::before();
    let (h, s) = pair();
    let (done_tx, done_rx) = mpsc::channel();
    let data_in = input.clone();
    let sender = thread::Builder::new()
        .name("fuzz send_over".into())
        .spawn(move || {
            let s2 = s.try_clone().expect("clone");
            let r = send_over(&options(), Cursor::new(data_in), s, s2, None);
            let _ = done_tx.send(());
            r
        })
        .expect("spawn");
    let ctl = h.try_clone().expect("clone");
    let (mut cr, mut cw, _) = establish(h.try_clone().expect("clone"), h, &psk(), Role::Responder)
        .unwrap_or_else(|e| panic!("the handshake with the real sender failed: {e}"));
    let _ = cw.send_frame(&offer);
    if !offer_ok {
        // No stream follows a reply that is not an OFFER.
        let _ = ctl.shutdown(Shutdown::Both);
        await_done(&done_rx, "send_over");
        let res = sender.join().expect("send_over panicked");
        threads.settle("send_over");
        // A FAIL instead of the OFFER (the receiver could not open its
        // output) is reported as that failure; anything else as garbage.
        let want = if offer.len() >= 6 && offer[0] == FAIL {
            match kind_of(offer[1]) {
                ErrorKind::ConsumerExited => ErrorKind::PeerConsumerExited,
                k => k,
            }
        } else {
            ErrorKind::Integrity
        };
        match res {
            Err(e) => assert_eq!(e.kind, want, "{e}"),
            Ok(s) => panic!("success after a first reply that is not an OFFER: {s:?}"),
        }
        return;
    }
    // The whole stream first, as a receiver does: START at 0 (the input
    // is not a file), then the blocks.
    let mut ended = false;
    let mut first = true;
    for _ in 0..1024 {
        match cr.next_frame() {
            Ok(Frame::Data(d)) => {
                if first {
                    assert_eq!(d, &start_msg(0)[..], "the sender's first message");
                }
                first = false;
            }
            Ok(Frame::End) => {
                ended = true;
                break;
            }
            Err(e) => panic!("the real sender's stream failed: {e}"),
        }
    }
    assert!(ended, "the sender's stream did not end");
    let mut sent = 0;
    for r in &recs {
        if cw.send_frame(r).is_err() {
            break;
        }
        sent += 1;
    }
    let finished = flags & 1 == 0 && sent == recs.len() && cw.finish().is_ok();
    let _ = ctl.shutdown(Shutdown::Write);
    await_done(&done_rx, "send_over");
    let res = sender.join().expect("send_over panicked");
    drop((cr, cw, ctl));
    threads.settle("send_over");
    if crate::util::verbose() {
        eprintln!("stream_control: {res:?}");
    }

    let first = recs.first().filter(|_| sent > 0);
    let status = |r: &[u8], at: usize| {
        let s = i32::from_le_bytes(r[at..at + 4].try_into().expect("4 bytes"));
        (s != i32::MIN).then_some(s)
    };
    match first {
        Some(r) if r.len() == 45 && r[0] == ACK => {
            let good = r[1..9] == (input.len() as u64).to_le_bytes() && r[9..41] == digest;
            match &res {
                Ok(s) if good => {
                    assert_eq!(s.bytes, input.len() as u64);
                    assert_eq!(s.remote_status, status(r, 41), "status of the ACK");
                }
                Err(e) if !good => assert_eq!(e.kind, ErrorKind::Integrity, "{e}"),
                other => panic!("ACK (true count and digest: {good}) gave {other:?}"),
            }
        }
        Some(r) if r.len() >= 6 && r[0] == FAIL => {
            let want = match kind_of(r[1]) {
                ErrorKind::ConsumerExited => ErrorKind::PeerConsumerExited,
                k => k,
            };
            match &res {
                Err(e) => {
                    assert_eq!(e.kind, want, "kind of a FAIL {}: {e}", r[1]);
                    assert_eq!(e.remote_status, status(r, 2), "status of a FAIL");
                }
                Ok(s) => panic!("success after a FAIL: {s:?}"),
            }
        }
        Some(_) => match &res {
            Err(e) => assert_eq!(e.kind, ErrorKind::Integrity, "{e}"),
            Ok(s) => panic!("success after an unknown reply: {s:?}"),
        },
        None => match &res {
            Err(e) if finished => assert_eq!(e.kind, ErrorKind::Integrity, "{e}"),
            Err(e) => assert_eq!(e.kind, ErrorKind::PeerKilled, "{e}"),
            Ok(s) => panic!("success without a reply: {s:?}"),
        },
    }
}
