//! An authenticated, encrypted, framed byte channel over any `Read + Write`
//! pair (a TCP stream, ssh's stdin/stdout), keyed by a pre-shared key.
//!
//! # Wire format (version 5)
//!
//! **Handshake** (see the `handshake` module): the Noise pattern
//! `Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s` (run by the `snow` crate), after
//! a plain 12-byte hello both sides send at once:
//!
//! ```text
//! magic   8  "FERRYCH5"
//! role    1  0 = initiator (the side that connected), 1 = responder
//! rsvd    3  zero
//! ```
//!
//! The prologue is the initiator's hello followed by the responder's, so
//! both are authenticated. The initiator then sends Noise message 1
//! (`psk, e`) and the responder message 2 (`e, ee`), each as a `u16`
//! big-endian length and the message. Each message's payload starts with a
//! flags byte: bit 0, this side has hardware AES; bit 1 (initiator only),
//! this connection joins a session carried by several (version 5): the
//! flags are then followed by a [`Join`], 18 bytes (`token` 16, random and
//! the same on every connection of the session; `index` 1; `count` 1, 2 to
//! [`MAX_CONNECTIONS`], `index < count`); other bits are zero and nothing
//! else follows. A payload that breaks these rules fails the handshake.
//! How the connections of a session are used is `ferry-link`'s `stripe`
//! module. The pre-shared key enters as
//! the 32-byte BLAKE3 `derive_key("ferry-channel v2 psk", key)`. Message 1
//! is sealed under the key, so the responder checks it before it sends
//! anything: a mismatch closes the connection with nothing sent (a client
//! without the key gets nothing to test guesses against), and both sides
//! fail with [`ChannelError::WrongKey`]. Roles must differ (two initiators
//! fail at the hello). The Noise split gives the two directions' 32-byte
//! keys (initiator to responder first). The initiator then sends its key
//! confirmation, as message 3 in the same form: BLAKE3
//! `keyed_hash(derive_key("ferry-channel v2 initiator confirm", i2r key),
//! handshake hash)`, 32 bytes; the responder checks it (constant time)
//! before it calls the peer authenticated, since message 1 alone proves
//! nothing (a recorded one opens again: the hellos carry no nonce), and
//! fails with [`ChannelError::WrongKey`] otherwise. The frame cipher is
//! AES-256-GCM when both flags say AES, otherwise ChaCha20-Poly1305 (the
//! flags travel inside the authenticated handshake, so a man in the middle
//! cannot downgrade it).
//!
//! **Frames.** Each direction is a sequence of frames:
//!
//! ```text
//! len   4  u32 big-endian: length of the sealed body
//! body len AEAD(key_dir, nonce, aad = "FERRYFRM" || len (4 bytes), plaintext)
//! ```
//!
//! A *message frame* has `len` in `17 ..= MAX_PAYLOAD + 17`, nonce
//! `0u32 BE || counter u64 BE` and plaintext `kind (1 byte: 0 data, 1 end
//! of stream) || payload`. `counter` starts at 0 in each direction and
//! increases by one per message frame, so a replayed, reordered, dropped or
//! tampered frame fails authentication. The reader checks `len` before
//! allocating. The *end* frame (kind 1, empty payload) is the authenticated
//! end of stream: a reader that meets EOF before it reports
//! [`ChannelError::Truncated`]; nothing may follow it.
//!
//! A *keepalive frame* has `len` = 16 exactly (an empty plaintext: the body
//! is the tag alone) and nonce `1u32 BE || keepalive counter u64 BE`, a
//! counter of its own that starts at 0 in each direction, so keepalives can
//! be sent between message frames that other threads sealed in advance
//! without renumbering them. A writer with nothing to send for a second
//! sends one ([`ChannelWriter::keepalive`]); the reader authenticates it
//! and skips it. A forged keepalive, or keepalives replayed or reordered
//! among themselves, fail authentication; one moved across message frames
//! or dropped goes unnoticed, which is harmless, since it carries nothing.
//! With an idle timeout ([`IdleRead`]), a peer that has sent no byte, not
//! even a keepalive, for that long is dead. Keepalives may be sent before
//! the end frame only.
//!
use std::io::{self, Read, Write};
use std::sync::Arc;

mod frame;
mod handshake;
mod idle;
pub use frame::{ChannelReader, ChannelWriter, Frame, Sealer};
pub use handshake::{handshake, handshake_join, Join, MAX_CONNECTIONS};
pub use idle::IdleRead;

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM, CHACHA20_POLY1305};

/// Largest payload of one frame.
pub const MAX_PAYLOAD: usize = (1 << 20) + 256;
/// AEAD tag size.
pub const TAG: usize = 16;
/// Largest sealed body (`len` field) accepted.
pub const MAX_BODY: usize = MAX_PAYLOAD + 1 + TAG;
/// Bytes a frame adds to its payload on the wire.
pub const FRAME_OVERHEAD: usize = 4 + 1 + TAG;
/// Hello magic.
pub const MAGIC: &[u8; 8] = b"FERRYCH5";
const AAD_PREFIX: &[u8; 8] = b"FERRYFRM";
const KIND_DATA: u8 = 0;
const KIND_END: u8 = 1;
/// `len` of a keepalive frame: the tag of an empty plaintext.
const KEEPALIVE_LEN: usize = TAG;
/// Nonce prefixes: message frames and keepalives count separately.
const SPACE_MESSAGE: u32 = 0;
const SPACE_KEEPALIVE: u32 = 1;

/// Which side of the connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that connected.
    Initiator,
    /// The side that accepted.
    Responder,
}

/// The AEAD in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suite {
    Aes256Gcm,
    ChaCha20Poly1305,
}

impl std::fmt::Display for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Suite::Aes256Gcm => "aes-256-gcm",
            Suite::ChaCha20Poly1305 => "chacha20-poly1305",
        })
    }
}

/// Why the channel failed.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("wrong key: the peer could not prove it holds the same pre-shared key")]
    WrongKey,
    #[error("key too short: need at least 16 bytes after trimming whitespace, got {0}")]
    KeyTooShort(usize),
    #[error("peer is not speaking the ferry channel protocol (it sent {0:?})")]
    BadHello(String),
    #[error("stream truncated: the connection ended before the authenticated end of stream")]
    Truncated,
    #[error("frame failed authentication (tampered, replayed or reordered)")]
    BadFrame,
    #[error("frame length {0} out of bounds")]
    BadLength(u64),
    #[error("data after the end of stream")]
    AfterEnd,
    #[error("payload of {0} bytes exceeds the frame limit")]
    TooLarge(usize),
    #[error("no randomness available: {0}")]
    Random(String),
    #[error("cipher refused its key")]
    Cipher,
    #[error("handshake failed: {0}")]
    Handshake(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl ChannelError {
    /// Map into an `io::Error` (for the `Read`/`Write` impls), keeping the
    /// channel error reachable through `get_ref`/`downcast`.
    pub fn into_io(self) -> io::Error {
        match self {
            ChannelError::Io(e) => e,
            ChannelError::Truncated => io::Error::new(io::ErrorKind::UnexpectedEof, self),
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }

    /// Whether a new connection could go past this: the byte pipe ended,
    /// reset or timed out. A wrong key, garbage or a frame that fails
    /// authentication would meet the same peer again.
    pub fn retryable(&self) -> bool {
        match self {
            ChannelError::Truncated => true,
            ChannelError::Io(e) => matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::TimedOut
                    | io::ErrorKind::WouldBlock
            ),
            _ => false,
        }
    }

    /// Recover a channel error from an `io::Error` made by [`into_io`](Self::into_io).
    pub fn from_io(e: io::Error) -> ChannelError {
        if e.get_ref().is_some_and(|r| r.is::<ChannelError>()) {
            if let Some(inner) = e.into_inner() {
                if let Ok(c) = inner.downcast::<ChannelError>() {
                    return *c;
                }
            }
            return ChannelError::BadFrame;
        }
        ChannelError::Io(e)
    }
}

/// A pre-shared key, validated.
#[derive(Clone)]
pub struct Psk(Vec<u8>);

impl Psk {
    /// From raw text (file contents, env var): whitespace is trimmed and at
    /// least 16 bytes must remain.
    pub fn new(raw: &[u8]) -> Result<Psk, ChannelError> {
        let t = raw.trim_ascii();
        if t.len() < 16 {
            return Err(ChannelError::KeyTooShort(t.len()));
        }
        Ok(Psk(t.to_vec()))
    }

    /// A fresh random key of 32 hex digits (for `ferry pipe`).
    pub fn generate_hex() -> Result<String, ChannelError> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).map_err(|e| ChannelError::Random(e.to_string()))?;
        Ok(b.iter().map(|x| format!("{x:02x}")).collect())
    }
}

impl Psk {
    /// The key's bytes (whitespace trimmed).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Psk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Psk({} bytes)", self.0.len())
    }
}

/// Whether this CPU has hardware AES.
pub fn has_hw_aes() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// The AEAD of a session: ring's, whose AES-GCM uses AES-NI, VAES and
/// carry-less multiply where the CPU has them (it measured several times
/// faster than a portable implementation here).
struct Cipher(LessSafeKey);

impl Cipher {
    /// Both suites take 32-byte keys, so this does not fail in practice;
    /// if ring ever says otherwise, the handshake reports it.
    fn new(suite: Suite, key: &[u8; 32]) -> Result<Cipher, ChannelError> {
        let alg = match suite {
            Suite::Aes256Gcm => &AES_256_GCM,
            Suite::ChaCha20Poly1305 => &CHACHA20_POLY1305,
        };
        let k = UnboundKey::new(alg, key).map_err(|_| ChannelError::Cipher)?;
        Ok(Cipher(LessSafeKey::new(k)))
    }

    fn nonce(space: u32, counter: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[..4].copy_from_slice(&space.to_be_bytes());
        n[4..].copy_from_slice(&counter.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    fn seal(
        &self,
        space: u32,
        counter: u64,
        aad: &[u8],
        buf: &mut [u8],
    ) -> Result<[u8; TAG], ChannelError> {
        let tag = self
            .0
            .seal_in_place_separate_tag(Self::nonce(space, counter), Aad::from(aad), buf)
            .map_err(|_| ChannelError::BadFrame)?;
        let mut t = [0u8; TAG];
        t.copy_from_slice(tag.as_ref());
        Ok(t)
    }

    fn open(
        &self,
        space: u32,
        counter: u64,
        aad: &[u8],
        buf: &mut [u8],
        tag: &[u8],
    ) -> Result<(), ChannelError> {
        let tag: [u8; TAG] = tag.try_into().map_err(|_| ChannelError::BadFrame)?;
        self.0
            .open_in_place_separate_tag(
                Self::nonce(space, counter),
                Aad::from(aad),
                Tag::from(tag),
                buf,
                0..,
            )
            .map(|_| ())
            .map_err(|_| ChannelError::BadFrame)
    }
}

/// Session keys and suite agreed by a handshake.
pub struct Session {
    pub suite: Suite,
    send: Arc<Cipher>,
    recv: Arc<Cipher>,
}

impl Session {
    pub(crate) fn with_keys(
        suite: Suite,
        send_key: &[u8; 32],
        recv_key: &[u8; 32],
    ) -> Result<Session, ChannelError> {
        Ok(Session {
            suite,
            send: Arc::new(Cipher::new(suite, send_key)?),
            recv: Arc::new(Cipher::new(suite, recv_key)?),
        })
    }
}

/// Read until `buf` is full or the input ends; returns the bytes read
/// (short only at end of input). Retries interrupted reads.
pub fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<usize, io::Error> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A new random 256-bit key as 64 hex digits (`ferry keygen`).
pub fn generate_key_hex() -> Result<String, ChannelError> {
    let mut k = [0u8; 32];
    getrandom::fill(&mut k).map_err(|e| ChannelError::Random(e.to_string()))?;
    Ok(k.iter().map(|b| format!("{b:02x}")).collect())
}

/// Handshake and split into halves.
pub fn establish<R: Read, W: Write>(
    mut r: R,
    mut w: W,
    psk: &Psk,
    role: Role,
) -> Result<(ChannelReader<R>, ChannelWriter<W>, Suite), ChannelError> {
    let s = handshake(&mut r, &mut w, psk, role)?;
    Ok((
        ChannelReader::new(r, &s),
        ChannelWriter::new(w, &s),
        s.suite,
    ))
}

#[cfg(test)]
mod tests;
