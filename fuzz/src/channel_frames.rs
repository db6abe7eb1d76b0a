//! `channel_frames`: ferry-channel's frame reader
//! ([`ferry_channel::ChannelReader`]) on bytes from the wire, with a known
//! key. (Supersedes `crates/ferry-channel/fuzz`'s `channel_frame_decode`.)
//!
//! Input: `sel`, two bytes `flip` (u16 LE), then the rest. `sel & 1` picks
//! the cipher suite.
//!
//! * `sel & 2 == 0`: the rest is the byte stream. Whatever the reader
//!   accepts must be exactly the canonical sealing of what it returned, at
//!   that frame number (so nothing is accepted that the key holder did not
//!   seal), and the reader's `Read` side agrees with its frames.
//! * `sel & 2 != 0`: the rest is records, sealed as data frames and ended;
//!   with `sel & 8` a keepalive frame goes before each, and with
//!   `sel & 4` one bit at `flip` is flipped. Untouched, every frame
//!   comes back as sent and then the end; touched, every frame before the
//!   damaged one (a damaged keepalive counts as the frame after it) comes
//!   back, and the stream fails, never ends.

use std::io::Read;

use ferry_channel::{ChannelReader, ChannelWriter, Frame, Suite};

use crate::util::{records, Bytes};

pub const KEY: [u8; 32] = [3; 32];

pub fn suite(sel: u8) -> Suite {
    if sel & 1 == 0 {
        Suite::Aes256Gcm
    } else {
        Suite::ChaCha20Poly1305
    }
}

pub fn run(data: &[u8]) {
    let mut b = Bytes(data);
    let sel = b.u8();
    let flip = b.u16() as usize;
    let rest = b.rest();
    if sel & 2 == 0 {
        raw(suite(sel), rest);
    } else {
        sealed(suite(sel), sel & 4 != 0, sel & 8 != 0, flip, rest);
    }
}

fn raw(suite: Suite, bytes: &[u8]) {
    let mut r = ChannelReader::with_key(bytes, suite, KEY).expect("32-byte key");
    let mut w = ChannelWriter::with_key(Vec::new(), suite, KEY).expect("32-byte key");
    let mut frames = Vec::new();
    let mut ended = false;
    for _ in 0..4096 {
        let before = r.wire_bytes as usize;
        let at = w.get_ref().len();
        let kas = r.keepalives_seen();
        let got = match r.next_frame() {
            Ok(Frame::Data(d)) => Some(Some(d.to_vec())),
            Ok(Frame::End) => Some(None),
            Err(_) => None,
        };
        // The keepalives the reader accepted on the way (also before an
        // error), sealed again.
        for _ in kas..r.keepalives_seen() {
            w.keepalive().expect("keepalive");
        }
        let failed = got.is_none();
        match got {
            Some(Some(d)) => {
                w.send_frame(&d).expect("seal");
                frames.push(d);
            }
            Some(None) => {
                w.finish().expect("finish");
                ended = true;
            }
            None => {}
        }
        assert_eq!(
            &bytes[before..r.wire_bytes as usize],
            &w.get_ref()[at..],
            "the reader ACCEPTED bytes that are not the sealing of what it returned"
        );
        if ended || failed {
            break;
        }
    }
    let mut all = Vec::new();
    let mut rd = ChannelReader::with_key(bytes, suite, KEY).expect("32-byte key");
    match rd.read_to_end(&mut all) {
        Ok(_) => {
            assert!(ended, "Read reached the end where next_frame did not");
            assert_eq!(all, frames.concat(), "Read and next_frame disagree");
        }
        Err(_) => assert!(!ended, "Read failed on a stream next_frame ended"),
    }
}

fn sealed(suite: Suite, damage: bool, keepalives: bool, flip: usize, rest: &[u8]) {
    let chunks: Vec<&[u8]> = records(rest).take(256).collect();
    let mut w = ChannelWriter::with_key(Vec::new(), suite, KEY).expect("32-byte key");
    let mut ends = Vec::new();
    for c in &chunks {
        if keepalives {
            w.keepalive().expect("keepalive");
        }
        w.send_frame(c).expect("seal");
        ends.push(w.get_ref().len());
    }
    w.finish().expect("finish");
    let mut bytes = w.into_inner();
    // The frame the damage lands in (the end frame: chunks.len()).
    let hit = damage.then(|| {
        let bit = flip % (bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        ends.iter().take_while(|&&e| e <= bit / 8).count()
    });
    let mut r = ChannelReader::with_key(&bytes[..], suite, KEY).expect("32-byte key");
    let mut n = 0;
    loop {
        match r.next_frame() {
            Ok(Frame::Data(d)) => {
                assert!(n < chunks.len(), "a frame beyond those sealed");
                assert_eq!(d, chunks[n], "frame {n} changed");
                assert!(
                    hit.is_none_or(|h| n < h),
                    "the damaged frame {n} was ACCEPTED"
                );
                n += 1;
            }
            Ok(Frame::End) => {
                assert!(hit.is_none(), "a damaged stream ENDED cleanly");
                assert_eq!(n, chunks.len(), "frames lost");
                break;
            }
            Err(e) => {
                let h = hit.unwrap_or_else(|| panic!("an intact stream failed: {e}"));
                assert_eq!(n, h, "failed at frame {n}, the damage is in frame {h}");
                break;
            }
        }
    }
}
