//! `channel_handshake`: ferry-channel's key handshake
//! ([`ferry_channel::handshake`]) against peers that do not hold the key,
//! tamper with it, or replay it. The checks hold whatever the handshake's
//! bytes are (they say only what a handshake promises), and the seeds of
//! the replay and tamper modes are made at run time from real handshakes.
//!
//! Input: `sel`, then bytes. `sel % 4`:
//!
//! * 0 / 1: this side is the responder / initiator and the bytes are all
//!   the peer says. The handshake must fail, never authenticate, and do so
//!   the same way (same error, same number of bytes sent) whichever key
//!   this side holds: nothing it says to a peer that has not proved the
//!   key may depend on the key.
//! * 2: a man in the middle between a real initiator and a real responder
//!   that hold the same key; the bytes are (direction, offset u16, xor)
//!   triples applied to the bytes in transit. Untouched, both sides
//!   succeed with the same cipher suite and can talk; if any byte that
//!   crossed was changed, at least one side fails (and sides that both
//!   succeed can always talk).
//! * 3: a replay: what a real initiator holding the key said in an earlier
//!   session (recorded once per process), with the bytes' (offset, xor)
//!   pairs applied, sent to a fresh responder. It must not authenticate:
//!   a recorded handshake does not prove that whoever replays it holds
//!   the key, and ferry-stream opens its output (truncates a file, starts
//!   a command) once the handshake succeeds.

use std::io::{Cursor, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;

use ferry_channel::{
    handshake, ChannelError, ChannelReader, ChannelWriter, Frame, Psk, Role, Session,
};

use crate::stream_messages::{pair, psk};
use crate::util::{bounded, Threads};

/// Another key, for the checks that the key changes nothing.
pub fn other_psk() -> Psk {
    Psk::new(b"another fuzz key 0123456789abcdef").expect("a long enough key")
}

pub fn run(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    match sel % 4 {
        0 => one_side(Role::Responder, rest),
        1 => one_side(Role::Initiator, rest),
        2 => man_in_the_middle(rest),
        _ => replay(rest),
    }
}

fn attempt(role: Role, peer: &[u8], key: &Psk) -> (Result<Session, ChannelError>, Vec<u8>) {
    let mut r = Cursor::new(peer);
    let mut w = Vec::new();
    let res = handshake(&mut r, &mut w, key, role);
    (res, w)
}

fn one_side(role: Role, peer: &[u8]) {
    let (res, sent) = attempt(role, peer, &psk());
    let Err(e) = res else {
        panic!("the {role:?} AUTHENTICATED a peer that does not hold the key");
    };
    let (res2, sent2) = attempt(role, peer, &other_psk());
    let Err(e2) = res2 else {
        panic!("the {role:?} AUTHENTICATED a peer that does not hold the key");
    };
    assert_eq!(
        std::mem::discriminant(&e),
        std::mem::discriminant(&e2),
        "the {role:?} fails as {e:?} with one key and as {e2:?} with another"
    );
    assert_eq!(
        sent.len(),
        sent2.len(),
        "the {role:?} says {} bytes with one key and {} with another to the same peer",
        sent.len(),
        sent2.len()
    );
}

/// The two sides of a real handshake, holding `ikey` and `rkey`, over
/// sockets whose other ends are returned (initiator's, responder's).
type Sides = (
    std::thread::JoinHandle<Result<Session, ChannelError>>,
    std::thread::JoinHandle<Result<Session, ChannelError>>,
    UnixStream,
    UnixStream,
);

fn sides(ikey: Psk, rkey: Psk) -> Sides {
    let (hi, i) = pair();
    let (hr, r) = pair();
    let side = |s: UnixStream, role, key: Psk| {
        move || -> Result<Session, ChannelError> {
            let mut rd = s.try_clone()?;
            let mut wr = s;
            handshake(&mut rd, &mut wr, &key, role)
        }
    };
    let ti = std::thread::spawn(side(i, Role::Initiator, ikey));
    let tr = std::thread::spawn(side(r, Role::Responder, rkey));
    (ti, tr, hi, hr)
}

/// Copy `from` to `to` until the end, xoring byte `k` with `mask[k]`;
/// returns the bytes copied.
fn relay(mut from: UnixStream, mut to: UnixStream, mask: Vec<u8>) -> usize {
    let mut buf = [0u8; 4096];
    let mut at = 0;
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        for (k, b) in buf[..n].iter_mut().enumerate() {
            *b ^= mask.get(at + k).copied().unwrap_or(0);
        }
        at += n;
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
    at
}

fn man_in_the_middle(triples: &[u8]) {
    const SPAN: usize = 512;
    let mut masks = [vec![0u8; SPAN], vec![0u8; SPAN]];
    for t in triples.chunks_exact(4) {
        let at = u16::from_le_bytes([t[1], t[2]]) as usize % SPAN;
        masks[(t[0] & 1) as usize][at] ^= t[3];
    }
    let threads = Threads::before();
    let (ti, tr, hi, hr) = sides(psk(), psk());
    let (m0, m1) = (masks[0].clone(), masks[1].clone());
    let (hi2, hr2) = (
        hi.try_clone().expect("clone"),
        hr.try_clone().expect("clone"),
    );
    let to_r = std::thread::spawn(move || relay(hi, hr2, m0));
    let to_i = std::thread::spawn(move || relay(hr, hi2, m1));
    let si = bounded("the initiator", move || {
        ti.join().expect("initiator panicked")
    });
    let sr = bounded("the responder", move || {
        tr.join().expect("responder panicked")
    });
    let n_r = bounded("a relay", move || to_r.join().expect("relay"));
    let n_i = bounded("a relay", move || to_i.join().expect("relay"));
    threads.settle("the handshake");
    let touched = masks[0][..n_r.min(SPAN)].iter().any(|&m| m != 0)
        || masks[1][..n_i.min(SPAN)].iter().any(|&m| m != 0);
    let shown = format!(
        "tampered: {touched} ({n_r} bytes to the responder, {n_i} to the initiator); \
         initiator {:?}, responder {:?}",
        si.as_ref().err(),
        sr.as_ref().err()
    );
    match (si, sr) {
        (Ok(si), Ok(sr)) => {
            assert!(
                !touched,
                "both sides AUTHENTICATED through a tampered handshake: {shown}"
            );
            assert_eq!(si.suite, sr.suite, "the two sides chose different ciphers");
            talk(&si, &sr);
            talk(&sr, &si);
        }
        _ => assert!(touched, "an untouched handshake failed: {shown}"),
    }
}

/// A frame sealed by `a` opens at `b`.
fn talk(a: &Session, b: &Session) {
    let mut w = ChannelWriter::new(Vec::new(), a);
    w.send_frame(b"ping").expect("seal");
    w.finish().expect("finish");
    let bytes = w.into_inner();
    let mut r = ChannelReader::new(&bytes[..], b);
    assert_eq!(r.next_frame().expect("open"), Frame::Data(b"ping"));
    assert_eq!(r.next_frame().expect("end"), Frame::End);
}

/// What each side of a real handshake between an initiator holding `ikey`
/// and a responder holding `rkey` said: (initiator's bytes, responder's).
pub fn record(ikey: Psk, rkey: Psk) -> (Vec<u8>, Vec<u8>) {
    let (ti, tr, hi, hr) = sides(ikey, rkey);
    let tee = |from: UnixStream, to: UnixStream| {
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut tee = TeeTo(to, &mut seen);
            let _ = std::io::copy(&mut &from, &mut tee);
            let _ = tee.0.shutdown(Shutdown::Write);
            seen
        })
    };
    let (hi2, hr2) = (
        hi.try_clone().expect("clone"),
        hr.try_clone().expect("clone"),
    );
    let from_i = tee(hi, hr2);
    let from_r = tee(hr, hi2);
    let _ = ti.join().expect("initiator panicked");
    let _ = tr.join().expect("responder panicked");
    (from_i.join().expect("tee"), from_r.join().expect("tee"))
}

/// Everything a real initiator holding the key said in a whole, successful
/// handshake (recorded once per process).
pub fn recorded_initiator() -> &'static [u8] {
    static REC: OnceLock<Vec<u8>> = OnceLock::new();
    REC.get_or_init(|| record(psk(), psk()).0)
}

struct TeeTo<'a>(UnixStream, &'a mut Vec<u8>);

impl Write for TeeTo<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.1.extend_from_slice(b);
        self.0.write_all(b)?;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn replay(pairs: &[u8]) {
    let mut flight = recorded_initiator().to_vec();
    for p in pairs.chunks_exact(2) {
        if !flight.is_empty() {
            let at = p[0] as usize % flight.len();
            flight[at] ^= p[1];
        }
    }
    let (res, _) = attempt(Role::Responder, &flight, &psk());
    assert!(
        res.is_err(),
        "the responder AUTHENTICATED a replay of a recorded handshake ({} bytes, {} changes): \
         whoever replays it need not hold the key",
        flight.len(),
        pairs.len() / 2
    );
}
