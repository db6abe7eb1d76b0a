//! An authenticated, encrypted, framed byte channel over any `Read + Write`
//! pair (a TCP stream, ssh's stdin/stdout), keyed by a pre-shared key.
//!
//! # Wire format (version 2)
//!
//! **Handshake** (see the `handshake` module): the Noise pattern
//! `Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s` (run by the `snow` crate), after
//! a plain 12-byte hello both sides send at once:
//!
//! ```text
//! magic   8  "FERRYCH2"
//! role    1  0 = initiator (the side that connected), 1 = responder
//! rsvd    3  zero
//! ```
//!
//! The prologue is the initiator's hello followed by the responder's, so
//! both are authenticated. The initiator then sends Noise message 1
//! (`psk, e`) and the responder message 2 (`e, ee`), each as a `u16`
//! big-endian length and the message; each message's payload is one flags
//! byte (bit 0: this side has hardware AES). The pre-shared key enters as
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
//! len   4  u32 big-endian: length of the sealed body (plaintext + 16)
//! body len AEAD(key_dir, nonce = 0u32 BE || counter u64 BE,
//!               aad = "FERRYFRM" || len (4 bytes), plaintext)
//! plaintext = kind (1 byte: 0 data, 1 end of stream) || payload
//! ```
//!
//! `counter` starts at 0 in each direction and increases by one per frame,
//! so a replayed, reordered, dropped or tampered frame fails authentication.
//! `len` must be in `17 ..= MAX_PAYLOAD + 17`; the reader checks it before
//! allocating. The *end* frame (kind 1, empty payload) is the authenticated
//! end of stream: a reader that meets EOF before it reports
//! [`ChannelError::Truncated`]; nothing may follow it.

use std::io::{self, Read, Write};
use std::sync::Arc;

mod handshake;
pub use handshake::handshake;

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
pub const MAGIC: &[u8; 8] = b"FERRYCH2";
const AAD_PREFIX: &[u8; 8] = b"FERRYFRM";
const KIND_DATA: u8 = 0;
const KIND_END: u8 = 1;

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

    fn nonce(counter: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&counter.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    fn seal(&self, counter: u64, aad: &[u8], buf: &mut [u8]) -> Result<[u8; TAG], ChannelError> {
        let tag = self
            .0
            .seal_in_place_separate_tag(Self::nonce(counter), Aad::from(aad), buf)
            .map_err(|_| ChannelError::BadFrame)?;
        let mut t = [0u8; TAG];
        t.copy_from_slice(tag.as_ref());
        Ok(t)
    }

    fn open(
        &self,
        counter: u64,
        aad: &[u8],
        buf: &mut [u8],
        tag: &[u8],
    ) -> Result<(), ChannelError> {
        let tag: [u8; TAG] = tag.try_into().map_err(|_| ChannelError::BadFrame)?;
        self.0
            .open_in_place_separate_tag(
                Self::nonce(counter),
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

/// Seal one frame (`kind`, payload = `head` + `body`) with frame number
/// `counter` into `frame` (cleared first).
fn seal_into(
    cipher: &Cipher,
    counter: u64,
    kind: u8,
    head: &[u8],
    body: &[u8],
    frame: &mut Vec<u8>,
) -> Result<(), ChannelError> {
    let plen = head.len() + body.len();
    if plen > MAX_PAYLOAD {
        return Err(ChannelError::TooLarge(plen));
    }
    let blen = (1 + plen + TAG) as u32;
    frame.clear();
    frame.reserve(4 + blen as usize);
    frame.extend_from_slice(&blen.to_be_bytes());
    frame.push(kind);
    frame.extend_from_slice(head);
    frame.extend_from_slice(body);
    let mut aad = [0u8; 12];
    aad[..8].copy_from_slice(AAD_PREFIX);
    aad[8..].copy_from_slice(&blen.to_be_bytes());
    let tag = cipher.seal(counter, &aad, &mut frame[4..])?;
    frame.extend_from_slice(&tag);
    Ok(())
}

/// Seals data frames for a [`ChannelWriter`] from any thread.
#[derive(Clone)]
pub struct Sealer {
    cipher: Arc<Cipher>,
}

impl Sealer {
    /// Seal a data frame (payload `head` + `body`) as frame number
    /// `counter` into `out`; hand it to [`ChannelWriter::write_sealed`].
    pub fn seal_data(
        &self,
        counter: u64,
        head: &[u8],
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ChannelError> {
        seal_into(&self.cipher, counter, KIND_DATA, head, body, out)
    }
}

/// Seals frames onto a byte sink. Also a buffered [`Write`]: data written
/// is packed into frames of up to `MAX_PAYLOAD` bytes.
pub struct ChannelWriter<W: Write> {
    w: W,
    cipher: Arc<Cipher>,
    counter: u64,
    buf: Vec<u8>,
    ended: bool,
    /// Bytes written to the sink, frame headers and tags included.
    pub wire_bytes: u64,
}

impl<W: Write> ChannelWriter<W> {
    pub fn new(w: W, session: &Session) -> Self {
        Self::with_cipher(w, session.send.clone())
    }

    /// A writer with a known key (tests and fuzzing).
    pub fn with_key(w: W, suite: Suite, key: [u8; 32]) -> Result<Self, ChannelError> {
        Ok(Self::with_cipher(w, Arc::new(Cipher::new(suite, &key)?)))
    }

    fn with_cipher(w: W, cipher: Arc<Cipher>) -> Self {
        ChannelWriter {
            w,
            cipher,
            counter: 0,
            buf: Vec::with_capacity(MAX_PAYLOAD + FRAME_OVERHEAD),
            ended: false,
            wire_bytes: 0,
        }
    }

    fn seal_and_write(&mut self, kind: u8, payload: &[u8]) -> Result<(), ChannelError> {
        self.seal_parts(kind, &[], payload)
    }

    fn seal_parts(&mut self, kind: u8, head: &[u8], body_part: &[u8]) -> Result<(), ChannelError> {
        if self.ended {
            return Err(ChannelError::AfterEnd);
        }
        let mut frame = std::mem::take(&mut self.buf);
        let res = seal_into(
            &self.cipher,
            self.counter,
            kind,
            head,
            body_part,
            &mut frame,
        )
        .and_then(|()| self.w.write_all(&frame).map_err(ChannelError::Io));
        self.counter += 1;
        self.wire_bytes += frame.len() as u64;
        self.buf = frame;
        res
    }

    /// A handle that seals data frames on other threads, so encryption can
    /// run in parallel; see [`ChannelWriter::write_sealed`].
    pub fn sealer(&self) -> Sealer {
        Sealer {
            cipher: self.cipher.clone(),
        }
    }

    /// Write a frame made by [`Sealer::seal_data`]. `counter` must be this
    /// writer's next frame number (frames are written in counter order).
    pub fn write_sealed(&mut self, counter: u64, frame: &[u8]) -> Result<(), ChannelError> {
        if self.ended {
            return Err(ChannelError::AfterEnd);
        }
        if counter != self.counter {
            return Err(ChannelError::BadFrame);
        }
        self.w.write_all(frame)?;
        self.counter += 1;
        self.wire_bytes += frame.len() as u64;
        Ok(())
    }

    /// Number of the next frame this writer sends.
    pub fn next_counter(&self) -> u64 {
        self.counter
    }

    /// Send one frame carrying `payload` (at most [`MAX_PAYLOAD`] bytes).
    pub fn send_frame(&mut self, payload: &[u8]) -> Result<(), ChannelError> {
        self.seal_and_write(KIND_DATA, payload)
    }

    /// Send one frame whose payload is `head` followed by `body` (saves the
    /// caller a copy).
    pub fn send_frame2(&mut self, head: &[u8], body: &[u8]) -> Result<(), ChannelError> {
        self.seal_parts(KIND_DATA, head, body)
    }

    /// Send the authenticated end-of-stream frame and flush. Nothing may be
    /// written after it.
    pub fn finish(&mut self) -> Result<(), ChannelError> {
        self.seal_and_write(KIND_END, &[])?;
        self.ended = true;
        self.w.flush()?;
        Ok(())
    }

    /// Flush the underlying sink.
    pub fn flush_sink(&mut self) -> io::Result<()> {
        self.w.flush()
    }

    pub fn get_ref(&self) -> &W {
        &self.w
    }

    pub fn into_inner(self) -> W {
        self.w
    }
}

impl<W: Write> Write for ChannelWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(MAX_PAYLOAD);
        self.send_frame(&data[..n]).map_err(ChannelError::into_io)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
}

/// One decoded frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Data(&'a [u8]),
    End,
}

/// Opens frames from a byte source. Also a [`Read`] over the payloads that
/// returns `Ok(0)` only after the authenticated end frame; EOF before it is
/// an error ([`ChannelError::Truncated`], as `ErrorKind::UnexpectedEof`).
pub struct ChannelReader<R: Read> {
    r: R,
    cipher: Arc<Cipher>,
    counter: u64,
    buf: Vec<u8>,
    /// Unread payload in `buf` for the `Read` impl.
    pos: usize,
    end: usize,
    ended: bool,
    /// Bytes read from the source, frame headers and tags included.
    pub wire_bytes: u64,
}

impl<R: Read> ChannelReader<R> {
    pub fn new(r: R, session: &Session) -> Self {
        Self::with_cipher(r, session.recv.clone())
    }

    /// A reader with a known key (tests and fuzzing).
    pub fn with_key(r: R, suite: Suite, key: [u8; 32]) -> Result<Self, ChannelError> {
        Ok(Self::with_cipher(r, Arc::new(Cipher::new(suite, &key)?)))
    }

    fn with_cipher(r: R, cipher: Arc<Cipher>) -> Self {
        ChannelReader {
            r,
            cipher,
            counter: 0,
            buf: Vec::new(),
            pos: 0,
            end: 0,
            ended: false,
            wire_bytes: 0,
        }
    }

    /// Read and authenticate the next frame.
    pub fn next_frame(&mut self) -> Result<Frame<'_>, ChannelError> {
        if self.ended {
            return Ok(Frame::End);
        }
        let mut len = [0u8; 4];
        let got = read_full(&mut self.r, &mut len)?;
        if got < 4 {
            return Err(ChannelError::Truncated);
        }
        let body = u32::from_be_bytes(len) as usize;
        if !(1 + TAG..=MAX_BODY).contains(&body) {
            return Err(ChannelError::BadLength(body as u64));
        }
        self.buf.resize(body, 0);
        let got = read_full(&mut self.r, &mut self.buf)?;
        if got < body {
            return Err(ChannelError::Truncated);
        }
        self.wire_bytes += 4 + body as u64;
        let mut aad = [0u8; 12];
        aad[..8].copy_from_slice(AAD_PREFIX);
        aad[8..].copy_from_slice(&len);
        let (text, tag) = self.buf.split_at_mut(body - TAG);
        self.cipher.open(self.counter, &aad, text, tag)?;
        self.counter += 1;
        match text[0] {
            KIND_DATA => Ok(Frame::Data(&self.buf[1..body - TAG])),
            KIND_END if body == 1 + TAG => {
                self.ended = true;
                Ok(Frame::End)
            }
            _ => Err(ChannelError::BadFrame),
        }
    }

    /// After the end frame: check that the source has nothing more.
    pub fn expect_eof(&mut self) -> Result<(), ChannelError> {
        let mut b = [0u8; 1];
        match read_full(&mut self.r, &mut b)? {
            0 => Ok(()),
            _ => Err(ChannelError::AfterEnd),
        }
    }

    pub fn is_ended(&self) -> bool {
        self.ended
    }

    pub fn get_ref(&self) -> &R {
        &self.r
    }
}

impl<R: Read> Read for ChannelReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.end {
            match self.next_frame().map_err(ChannelError::into_io)? {
                Frame::End => return Ok(0),
                Frame::Data(d) => {
                    let n = d.len();
                    self.pos = 1;
                    self.end = 1 + n;
                }
            }
        }
        let n = out.len().min(self.end - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
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
mod tests {
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
        w.w
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
}
