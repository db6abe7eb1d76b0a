//! The daemon preamble: what a client of `ferry serve --listen` says first
//! inside the authenticated channel, and the daemon's answer, before both
//! speak the sync protocol as `serve --stdio` would (see `docs/PROTOCOL.md`,
//! "Daemon sessions").
//!
//! Request: [`REQUEST_MAGIC`] (8 bytes), the body length as a big-endian
//! `u32` (at most [`MAX_REQUEST`]), then the body: a big-endian `u16`
//! count of arguments (at most [`MAX_ARGS`]) and each argument as a
//! big-endian `u16` length and that many bytes of UTF-8 without NUL. The
//! arguments are a `ferry serve` command line (`serve --stdio --send|
//! --receive OPTIONS -- PATHS`); the daemon decides which it accepts.
//!
//! Answer: [`ANSWER_MAGIC`] (8 bytes), one [`Status`] byte, a big-endian
//! `u16` length (at most [`MAX_TEXT`]) and that many bytes of UTF-8: why the
//! session was refused, empty when it was accepted.

/// First bytes of a request (protocol version 1 of the preamble).
pub const REQUEST_MAGIC: [u8; 8] = *b"FERRYRQ1";
/// First bytes of an answer.
pub const ANSWER_MAGIC: [u8; 8] = *b"FERRYAN1";
/// Bytes of the request before its body: magic and body length.
pub const REQUEST_HEAD: usize = 12;
/// Bytes of an answer before its text: magic, status, text length.
pub const ANSWER_HEAD: usize = 11;
/// Largest request body.
pub const MAX_REQUEST: usize = 64 << 10;
/// Most arguments in a request.
pub const MAX_ARGS: usize = 1024;
/// Longest answer text.
pub const MAX_TEXT: usize = 4096;

/// A request or answer that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreambleError {
    #[error("not a ferry daemon request or answer (bad magic)")]
    BadMagic,
    #[error("daemon preamble too large ({0} bytes)")]
    TooLarge(usize),
    #[error("daemon preamble truncated")]
    Truncated,
    #[error("daemon preamble holds bytes after its end")]
    Trailing,
    #[error("daemon preamble text is not UTF-8 without NUL")]
    NotText,
    #[error("unknown daemon answer status {0}")]
    Status(u8),
}

/// What the daemon made of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// The session goes on: the sync protocol follows.
    Accepted = 0,
    /// Refused for its arguments (an option the daemon does not take
    /// from clients, a role it does not serve): asking again is useless.
    Usage = 1,
    /// Refused for its paths (missing, outside the root, a symlink).
    Io = 2,
    /// Refused for now: the daemon has as many sessions as it allows.
    Busy = 3,
}

impl Status {
    fn from_u8(b: u8) -> Result<Status, PreambleError> {
        Ok(match b {
            0 => Status::Accepted,
            1 => Status::Usage,
            2 => Status::Io,
            3 => Status::Busy,
            other => return Err(PreambleError::Status(other)),
        })
    }
}

fn text_ok(s: &str) -> bool {
    !s.contains('\0')
}

/// The request carrying `args`.
pub fn encode_request(args: &[String]) -> Result<Vec<u8>, PreambleError> {
    if args.len() > MAX_ARGS {
        return Err(PreambleError::TooLarge(args.len()));
    }
    let mut body = Vec::new();
    body.extend_from_slice(&(args.len() as u16).to_be_bytes());
    for a in args {
        if !text_ok(a) {
            return Err(PreambleError::NotText);
        }
        let n = u16::try_from(a.len()).map_err(|_| PreambleError::TooLarge(a.len()))?;
        body.extend_from_slice(&n.to_be_bytes());
        body.extend_from_slice(a.as_bytes());
    }
    if body.len() > MAX_REQUEST {
        return Err(PreambleError::TooLarge(body.len()));
    }
    let mut out = Vec::with_capacity(REQUEST_HEAD + body.len());
    out.extend_from_slice(&REQUEST_MAGIC);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// The body length a request header announces, checked against
/// [`MAX_REQUEST`] before anything is allocated for it.
pub fn request_body_len(head: &[u8; REQUEST_HEAD]) -> Result<usize, PreambleError> {
    if head[..8] != REQUEST_MAGIC {
        return Err(PreambleError::BadMagic);
    }
    let n = u32::from_be_bytes([head[8], head[9], head[10], head[11]]) as usize;
    if n > MAX_REQUEST {
        return Err(PreambleError::TooLarge(n));
    }
    Ok(n)
}

/// A cursor over untrusted bytes.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PreambleError> {
        if self.0.len() < n {
            return Err(PreambleError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u16(&mut self) -> Result<usize, PreambleError> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn text(&mut self, n: usize) -> Result<String, PreambleError> {
        let s = std::str::from_utf8(self.take(n)?).map_err(|_| PreambleError::NotText)?;
        if !text_ok(s) {
            return Err(PreambleError::NotText);
        }
        Ok(s.to_string())
    }
}

/// The arguments of a request body (what follows the header).
pub fn decode_request_body(body: &[u8]) -> Result<Vec<String>, PreambleError> {
    if body.len() > MAX_REQUEST {
        return Err(PreambleError::TooLarge(body.len()));
    }
    let mut c = Cur(body);
    let n = c.u16()?;
    if n > MAX_ARGS {
        return Err(PreambleError::TooLarge(n));
    }
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        let len = c.u16()?;
        args.push(c.text(len)?);
    }
    if !c.0.is_empty() {
        return Err(PreambleError::Trailing);
    }
    Ok(args)
}

/// The answer `status` with `text` (cut to [`MAX_TEXT`] bytes at a
/// character boundary; NULs replaced).
pub fn encode_answer(status: Status, text: &str) -> Vec<u8> {
    let mut t = text.replace('\0', " ");
    if t.len() > MAX_TEXT {
        let mut end = MAX_TEXT;
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        t.truncate(end);
    }
    let mut out = Vec::with_capacity(ANSWER_HEAD + t.len());
    out.extend_from_slice(&ANSWER_MAGIC);
    out.push(status as u8);
    out.extend_from_slice(&(t.len() as u16).to_be_bytes());
    out.extend_from_slice(t.as_bytes());
    out
}

/// Status and text length of an answer header (the length checked
/// against [`MAX_TEXT`]).
pub fn answer_head(head: &[u8; ANSWER_HEAD]) -> Result<(Status, usize), PreambleError> {
    if head[..8] != ANSWER_MAGIC {
        return Err(PreambleError::BadMagic);
    }
    let status = Status::from_u8(head[8])?;
    let n = usize::from(u16::from_be_bytes([head[9], head[10]]));
    if n > MAX_TEXT {
        return Err(PreambleError::TooLarge(n));
    }
    Ok((status, n))
}

/// An answer's text.
pub fn answer_text(b: &[u8]) -> Result<String, PreambleError> {
    Cur(b).text(b.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn split(req: &[u8]) -> ([u8; REQUEST_HEAD], &[u8]) {
        let (h, b) = req.split_at(REQUEST_HEAD);
        (h.try_into().unwrap(), b)
    }

    #[test]
    fn a_request_round_trips() {
        let args: Vec<String> = ["serve", "--stdio", "--receive", "--", "dir/ü x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let req = encode_request(&args).unwrap();
        let (h, body) = split(&req);
        assert_eq!(request_body_len(&h).unwrap(), body.len());
        assert_eq!(decode_request_body(body).unwrap(), args);
    }

    #[test]
    fn bad_requests_are_refused() {
        assert_eq!(
            encode_request(&["a\0b".into()]),
            Err(PreambleError::NotText)
        );
        assert!(encode_request(&vec!["x".into(); MAX_ARGS + 1]).is_err());
        let mut h = [0u8; REQUEST_HEAD];
        assert_eq!(request_body_len(&h), Err(PreambleError::BadMagic));
        h[..8].copy_from_slice(&REQUEST_MAGIC);
        h[8..].copy_from_slice(&(MAX_REQUEST as u32 + 1).to_be_bytes());
        assert!(matches!(
            request_body_len(&h),
            Err(PreambleError::TooLarge(_))
        ));
        // One argument announced, none there; a stray byte after the end.
        assert_eq!(decode_request_body(&[0, 1]), Err(PreambleError::Truncated));
        assert_eq!(
            decode_request_body(&[0, 0, 7]),
            Err(PreambleError::Trailing)
        );
        assert_eq!(
            decode_request_body(&[0, 1, 0, 2, 0xff, 0xfe]),
            Err(PreambleError::NotText)
        );
    }

    #[test]
    fn answers_round_trip_and_long_texts_are_cut() {
        let a = encode_answer(Status::Io, &"é".repeat(MAX_TEXT));
        let (status, n) = answer_head(a[..ANSWER_HEAD].try_into().unwrap()).unwrap();
        assert_eq!(status, Status::Io);
        assert!(n <= MAX_TEXT);
        assert_eq!(answer_text(&a[ANSWER_HEAD..]).unwrap().len(), n);
        let mut bad = encode_answer(Status::Accepted, "");
        bad[8] = 9;
        assert_eq!(
            answer_head(bad[..ANSWER_HEAD].try_into().unwrap()),
            Err(PreambleError::Status(9))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn any_body_decodes_or_fails_cleanly(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(args) = decode_request_body(&body) {
                let req = encode_request(&args).unwrap();
                prop_assert_eq!(&req[REQUEST_HEAD..], &body[..]);
            }
        }
    }
}
