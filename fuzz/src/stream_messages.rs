//! `stream_messages`: the receiving side of `ferry send`/`recv`/`pipe`
//! ([`ferry_stream::recv_over`]) reading a sender's messages (BLOCK, END,
//! ABORT: see the ferry-stream crate docs) from a peer that holds the key.
//!
//! Input: `flags`, then records, each the payload of one channel frame.
//! The harness does the real handshake as the initiator (with the key, so
//! the receiver gets past authentication), sends START at 0 (unless
//! `flags & 4`: then the first record stands in for it), seals every
//! record as a data frame, ends the channel properly unless `flags & 1`,
//! and reads the receiver's replies: its OFFER (of nothing: the output is
//! memory), then its verdict. Asserted:
//!
//! * `recv_over` returns (within [`crate::util::DEADLINE`]), never panics;
//! * success only for a stream that is BLOCKs then one END, closed by the
//!   channel's end frame: the output is exactly END's byte count, has its
//!   BLAKE3 digest, and is as long as the BLOCK headers declared; the
//!   reply is an ACK of that count and digest;
//! * a failure is a peer/integrity failure (never a key, usage or local
//!   I/O one: the peer holds the key and the output is memory), and the
//!   reply, if any, is a FAIL naming that failure's kind.

use std::io::Write;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use ferry_channel::{establish, Frame, Psk, Role};
use ferry_stream::{opened, recv_over, ErrorKind, Options};

use crate::util::{await_done, records, DEADLINE};

/// The pre-shared key both sides of the stream targets hold.
pub const KEY: &[u8] = b"ferry fuzz key 0123456789abcdef";
pub const BLOCK: u8 = 0x01;
pub const END: u8 = 0x02;
pub const START: u8 = 0x04;
pub const ACK: u8 = 0x10;
pub const FAIL: u8 = 0x11;
pub const OFFER: u8 = 0x12;
/// Most frames sent per input.
const MAX_FRAMES: usize = 64;

/// An output shared with the harness.
#[derive(Clone, Default)]
pub struct SharedVec(pub Arc<Mutex<Vec<u8>>>);

impl Write for SharedVec {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("output").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn psk() -> Psk {
    Psk::new(KEY).expect("a long enough key")
}

/// Small rings and blocks, one compressor: cheap sessions.
pub fn options() -> Options {
    let mut o = Options::new(psk());
    o.buffer = 1 << 20;
    o.block_size = 64 << 10;
    o.workers = 1;
    o.connect_timeout = DEADLINE;
    o
}

/// A connected pair whose harness end gives up on a read or write after
/// half the deadline (the code under test hanging is caught elsewhere).
pub fn pair() -> (UnixStream, UnixStream) {
    let (h, s) = UnixStream::pair().expect("socketpair");
    let t = Some(DEADLINE / 2);
    h.set_read_timeout(t).expect("timeout");
    h.set_write_timeout(t).expect("timeout");
    (h, s)
}

/// A BLOCK message header: codec, level or stream, raw length.
pub fn block_head(codec: u8, level_or_stream: u8, raw_len: u32) -> Vec<u8> {
    let mut h = vec![BLOCK, codec, level_or_stream];
    h.extend_from_slice(&raw_len.to_le_bytes());
    h
}

/// START at `offset`.
pub fn start_msg(offset: u64) -> Vec<u8> {
    let mut m = vec![START];
    m.extend_from_slice(&offset.to_le_bytes());
    m
}

/// OFFER of nothing: what a receiver with nothing to resume sends first.
pub fn empty_offer() -> Vec<u8> {
    let mut m = vec![OFFER];
    m.extend_from_slice(&0u64.to_le_bytes());
    m.extend_from_slice(blake3::hash(b"").as_bytes());
    m
}

pub fn end_msg(data: &[u8]) -> Vec<u8> {
    let mut m = vec![END];
    m.extend_from_slice(&(data.len() as u64).to_le_bytes());
    m.extend_from_slice(blake3::hash(data).as_bytes());
    m
}

pub fn run(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let recs: Vec<&[u8]> = records(rest).take(MAX_FRAMES).collect();
    let start = start_msg(0);
    // What goes on the wire: START (the harness's, or the first record).
    let (head, recs): (&[u8], Vec<&[u8]>) = match recs.split_first() {
        Some((first, more)) if flags & 4 != 0 => (first, more.to_vec()),
        _ => (&start, recs),
    };
    let threads = crate::util::Threads::before();
    let (h, s) = pair();
    let out = SharedVec::default();
    let output = out.clone();
    let (done_tx, done_rx) = mpsc::channel();
    let receiver = thread::Builder::new()
        .name("fuzz recv_over".into())
        .spawn(move || {
            let s2 = s.try_clone().expect("clone");
            let r = recv_over(&options(), s, s2, opened(output), None);
            let _ = done_tx.send(());
            r
        })
        .expect("spawn");
    let ctl = h.try_clone().expect("clone");
    let (mut cr, mut cw, _) = establish(h.try_clone().expect("clone"), h, &psk(), Role::Initiator)
        .unwrap_or_else(|e| panic!("the handshake with the real receiver failed: {e}"));
    for r in std::iter::once(&head).chain(&recs) {
        if cw.send_frame(r).is_err() {
            break;
        }
    }
    let finished = flags & 1 == 0 && cw.finish().is_ok();
    let _ = ctl.shutdown(Shutdown::Write);
    let mut replies = Vec::new();
    for _ in 0..8 {
        match cr.next_frame() {
            Ok(Frame::Data(d)) => replies.push(d.to_vec()),
            Ok(Frame::End) | Err(_) => break,
        }
    }
    if !replies.is_empty() {
        assert_eq!(replies.remove(0), empty_offer(), "the receiver's first reply");
    }
    await_done(&done_rx, "recv_over");
    let res = receiver.join().expect("recv_over panicked");
    drop((cr, cw, ctl));
    threads.settle("recv_over");
    let out = out.0.lock().expect("output").clone();
    if crate::util::verbose() {
        eprintln!("stream_messages: {res:?}; replies {replies:?}");
    }

    match &res {
        Ok(s) => {
            assert!(finished, "success without the channel's end frame");
            assert_eq!(head, &start[..], "success without a START at 0");
            let (last, blocks) = recs.split_last().expect("success from no message at all");
            assert!(
                last.len() == 41 && last[0] == END,
                "success, but the last message is not an END"
            );
            let total = u64::from_le_bytes(last[1..9].try_into().expect("8 bytes"));
            let digest: [u8; 32] = last[9..41].try_into().expect("32 bytes");
            assert_eq!(s.bytes, total, "summary byte count");
            assert_eq!(out.len() as u64, total, "output length");
            assert_eq!(*blake3::hash(&out).as_bytes(), digest, "output digest");
            assert_eq!(
                s.blake3,
                blake3::Hash::from_bytes(digest).to_hex().to_string()
            );
            let mut declared = 0u64;
            for b in blocks {
                assert!(
                    b.len() >= 7 && b[0] == BLOCK,
                    "success with a non-BLOCK message"
                );
                declared += u64::from(u32::from_le_bytes(b[3..7].try_into().expect("4")));
            }
            assert_eq!(
                declared, total,
                "output is not what the BLOCK headers declared"
            );
            let mut ack = vec![ACK];
            ack.extend_from_slice(&last[1..41]);
            ack.extend_from_slice(&i32::MIN.to_le_bytes());
            assert_eq!(replies, vec![ack], "the reply to a good stream");
        }
        Err(e) => {
            assert!(
                matches!(
                    e.kind,
                    ErrorKind::Integrity | ErrorKind::PeerKilled | ErrorKind::ProducerFailed
                ),
                "recv_over failed as {:?}: {e}",
                e.kind
            );
            assert!(replies.len() <= 1, "more than one reply: {replies:?}");
            if let Some(r) = replies.first() {
                assert!(
                    r.len() >= 6 && r[0] == FAIL && r[1] == e.kind.code(),
                    "the reply to a failed stream is not its FAIL: {r:?} for {e:?}"
                );
            }
        }
    }
}
