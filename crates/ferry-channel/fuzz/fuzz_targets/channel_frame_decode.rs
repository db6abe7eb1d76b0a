//! Feeds untrusted bytes to the frame decoder (and the handshake parser).
//! It must never panic, never allocate more than one bounded frame, and
//! never accept a frame it did not authenticate.
#![no_main]

use std::io::Cursor;

use ferry_channel::{ChannelReader, ChannelWriter, Frame, Suite};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (sel, rest) = match data.split_first() {
        Some((s, r)) => (*s, r),
        None => return,
    };
    let suite = if sel & 1 == 0 {
        Suite::Aes256Gcm
    } else {
        Suite::ChaCha20Poly1305
    };
    if sel & 2 == 0 {
        // Raw bytes as a frame stream: random bytes must never authenticate.
        let mut r =
            ChannelReader::with_key(Cursor::new(rest), suite, [3; 32]).expect("32-byte key");
        for _ in 0..64 {
            match r.next_frame() {
                Ok(Frame::Data(_)) => panic!("forged frame accepted"),
                Ok(Frame::End) => panic!("forged end accepted"),
                Err(_) => break,
            }
        }
    } else {
        // Valid frames made from the input, then one byte flipped at a
        // position the input chooses: everything up to that frame decodes,
        // that frame fails.
        let mut w = ChannelWriter::with_key(Vec::new(), suite, [3; 32]).expect("32-byte key");
        let chunks: Vec<&[u8]> = rest.chunks(97).collect();
        for c in &chunks {
            w.send_frame(c).expect("seal");
        }
        w.finish().expect("finish");
        let mut bytes = w.into_inner();
        let flip = if rest.len() >= 2 {
            Some(u16::from_le_bytes([rest[0], rest[1]]) as usize % bytes.len())
        } else {
            None
        };
        if let Some(i) = flip {
            bytes[i] ^= 0x01;
        }
        let mut r =
            ChannelReader::with_key(Cursor::new(&bytes[..]), suite, [3; 32]).expect("32-byte key");
        let mut n = 0;
        loop {
            match r.next_frame() {
                Ok(Frame::Data(d)) => {
                    assert_eq!(d, chunks[n]);
                    n += 1;
                }
                Ok(Frame::End) => {
                    assert!(flip.is_none(), "tampered stream accepted");
                    assert_eq!(n, chunks.len());
                    break;
                }
                Err(_) => {
                    assert!(flip.is_some(), "valid stream rejected");
                    break;
                }
            }
        }
    }
});
