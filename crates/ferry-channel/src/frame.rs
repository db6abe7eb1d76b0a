//! Frames on an established channel: sealing and writing them
//! ([`ChannelWriter`], [`Sealer`] for other threads), reading and opening
//! them ([`ChannelReader`]), keepalives included. The format is in the
//! crate's documentation.

use std::io::{self, Read, Write};
use std::sync::Arc;

use crate::{
    read_full, ChannelError, Cipher, Session, Suite, AAD_PREFIX, FRAME_OVERHEAD, KEEPALIVE_LEN,
    KIND_DATA, KIND_END, MAX_BODY, MAX_PAYLOAD, SPACE_KEEPALIVE, SPACE_MESSAGE, TAG,
};

fn aad(len: &[u8; 4]) -> [u8; 12] {
    let mut aad = [0u8; 12];
    aad[..8].copy_from_slice(AAD_PREFIX);
    aad[8..].copy_from_slice(len);
    aad
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
    let tag = cipher.seal(
        SPACE_MESSAGE,
        counter,
        &aad(&blen.to_be_bytes()),
        &mut frame[4..],
    )?;
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
    keepalives: u64,
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
            keepalives: 0,
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

    /// Send a keepalive frame and flush: tells the peer this side is alive
    /// while it has nothing else to say. Not after the end frame.
    pub fn keepalive(&mut self) -> Result<(), ChannelError> {
        if self.ended {
            return Err(ChannelError::AfterEnd);
        }
        let len = (KEEPALIVE_LEN as u32).to_be_bytes();
        let tag = self
            .cipher
            .seal(SPACE_KEEPALIVE, self.keepalives, &aad(&len), &mut [])?;
        let mut frame = [0u8; 4 + KEEPALIVE_LEN];
        frame[..4].copy_from_slice(&len);
        frame[4..].copy_from_slice(&tag);
        self.keepalives += 1;
        self.w.write_all(&frame)?;
        self.w.flush()?;
        self.wire_bytes += frame.len() as u64;
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
    keepalives: u64,
    buf: Vec<u8>,
    /// Unread payload in `buf` for the `Read` impl.
    pos: usize,
    end: usize,
    ended: bool,
    /// Bytes of the frames read and authenticated so far, headers and
    /// tags included.
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
            keepalives: 0,
            buf: Vec::new(),
            pos: 0,
            end: 0,
            ended: false,
            wire_bytes: 0,
        }
    }

    /// Read and authenticate the next message frame, skipping keepalives.
    pub fn next_frame(&mut self) -> Result<Frame<'_>, ChannelError> {
        if self.ended {
            return Ok(Frame::End);
        }
        loop {
            let mut len = [0u8; 4];
            let got = read_full(&mut self.r, &mut len)?;
            if got < 4 {
                return Err(ChannelError::Truncated);
            }
            let body = u32::from_be_bytes(len) as usize;
            if body == KEEPALIVE_LEN {
                self.open_keepalive(&len)?;
                continue;
            }
            if !(1 + TAG..=MAX_BODY).contains(&body) {
                return Err(ChannelError::BadLength(body as u64));
            }
            self.buf.resize(body, 0);
            let got = read_full(&mut self.r, &mut self.buf)?;
            if got < body {
                return Err(ChannelError::Truncated);
            }
            let (text, tag) = self.buf.split_at_mut(body - TAG);
            self.cipher
                .open(SPACE_MESSAGE, self.counter, &aad(&len), text, tag)?;
            self.wire_bytes += 4 + body as u64;
            self.counter += 1;
            return match text[0] {
                KIND_DATA => Ok(Frame::Data(&self.buf[1..body - TAG])),
                KIND_END if body == 1 + TAG => {
                    self.ended = true;
                    Ok(Frame::End)
                }
                _ => Err(ChannelError::BadFrame),
            };
        }
    }

    /// Read and authenticate a keepalive's tag (its length already read).
    fn open_keepalive(&mut self, len: &[u8; 4]) -> Result<(), ChannelError> {
        let mut tag = [0u8; TAG];
        if read_full(&mut self.r, &mut tag)? < TAG {
            return Err(ChannelError::Truncated);
        }
        self.cipher
            .open(SPACE_KEEPALIVE, self.keepalives, &aad(len), &mut [], &tag)?;
        self.wire_bytes += (4 + TAG) as u64;
        self.keepalives += 1;
        Ok(())
    }

    /// Keepalive frames read so far.
    pub fn keepalives_seen(&self) -> u64 {
        self.keepalives
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

    /// The reader underneath (to change its timeouts).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.r
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
