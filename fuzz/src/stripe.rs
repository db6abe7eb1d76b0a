//! `stripe`: ferry-link's reader of a session striped over several
//! connections (`--streams N`, [`ferry_link::stripe::StripeReader`]),
//! against whatever the peer's connections carry.
//!
//! Input: one byte (`2 + b % 3` connections), then records (see
//! [`crate::util::records`]), each `[lane, kind, ...]`: kind 0 appends a
//! well-formed chunk (`seq` from the next byte, the rest as its data) to
//! the lane's bytes, any other kind appends the rest verbatim (so headers,
//! lengths and cuts are fuzzed too). Each lane's bytes go into a Unix
//! socket pair, whose writing end is then closed; the reader reads all.
//!
//! The model, from the module docs: the stripe is well formed when every
//! lane is a sequence of whole chunks (`len` 1 ..= `MAX_CHUNK`), each
//! lane's `seq`s increase, and all of them together are exactly 0, 1, ...,
//! k-1. Then the reader must return the chunks' data in `seq` order and
//! end; otherwise it must fail. Never a panic, never a hang.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use ferry_link::stripe::{StripeReader, HEADER, MAX_CHUNK};

use crate::util::records;

/// The chunks of one lane's bytes, if they are whole chunks.
fn parse_lane(mut b: &[u8]) -> Option<Vec<(u64, &[u8])>> {
    let mut v = Vec::new();
    while !b.is_empty() {
        if b.len() < HEADER {
            return None;
        }
        let seq = u64::from_be_bytes(b[..8].try_into().ok()?);
        let len = u32::from_be_bytes(b[8..12].try_into().ok()?) as usize;
        if len == 0 || len > MAX_CHUNK || b.len() < HEADER + len {
            return None;
        }
        v.push((seq, &b[HEADER..HEADER + len]));
        b = &b[HEADER + len..];
    }
    Some(v)
}

/// What a correct reader returns: `Some(bytes)` for a well-formed stripe.
fn model(lanes: &[Vec<u8>]) -> Option<Vec<u8>> {
    let mut all = Vec::new();
    for l in lanes {
        let chunks = parse_lane(l)?;
        if chunks.windows(2).any(|w| w[0].0 >= w[1].0) {
            return None;
        }
        all.extend(chunks);
    }
    all.sort_by_key(|c| c.0);
    if all.iter().enumerate().any(|(i, c)| c.0 != i as u64) {
        return None;
    }
    Some(all.iter().flat_map(|c| c.1.iter().copied()).collect())
}

pub fn run(data: &[u8]) {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = 2 + usize::from(n % 3);
    let mut lanes = vec![Vec::new(); n];
    for r in records(rest) {
        let [lane, kind, body @ ..] = r else { continue };
        let l = &mut lanes[usize::from(*lane) % n];
        if *kind == 0 {
            let Some((&seq, payload)) = body.split_first() else {
                continue;
            };
            if payload.is_empty() {
                continue;
            }
            l.extend_from_slice(&u64::from(seq).to_be_bytes());
            l.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            l.extend_from_slice(payload);
        } else {
            l.extend_from_slice(body);
        }
    }
    let want = model(&lanes);
    let mut ends = Vec::new();
    for l in &lanes {
        let (mut a, b) = UnixStream::pair().expect("socket pair");
        // Inputs are a few KiB: they fit the socket's buffer.
        a.write_all(l).expect("fill a lane");
        drop(a);
        ends.push(b);
    }
    let mut r = StripeReader::new(ends, Some(Duration::from_secs(5)));
    let mut got = Vec::new();
    let res = r.read_to_end(&mut got);
    match (want, res) {
        (Some(w), Ok(_)) => assert!(got == w, "a well-formed stripe read back wrong"),
        (Some(_), Err(e)) => panic!("a well-formed stripe failed: {e}"),
        (None, Ok(_)) => panic!("a malformed stripe read back {} bytes without an error", got.len()),
        (None, Err(e)) => assert!(
            e.kind() != std::io::ErrorKind::TimedOut,
            "a malformed stripe hung: {e}"
        ),
    }
}
