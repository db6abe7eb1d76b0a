//! The channel's handshake: a Noise `NNpsk0` exchange (the `snow` crate, a
//! reviewed implementation of a reviewed pattern) keyed by the pre-shared
//! key, after a plain hello that names the roles. See the crate docs for
//! the bytes.

use std::io::{self, Read, Write};

use crate::{has_hw_aes, read_full, ChannelError, Psk, Role, Session, Suite, MAGIC};

/// Flags bit 0: this side has hardware AES.
const FLAG_AES: u8 = 1;
/// Flags bit 1 (initiator only): this connection is one of several that
/// carry one session; a [`Join`] follows the flags.
const FLAG_JOIN: u8 = 2;
/// Bytes of a join after the flags: token, index, count.
const JOIN_LEN: usize = 16 + 1 + 1;
/// Most connections one session may stripe over.
pub const MAX_CONNECTIONS: u8 = 16;

/// What an initiator says about the connection it opens when one session
/// runs over several: which session (`token`, random, the same on each of
/// them), which connection of it (`index`), and how many there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Join {
    pub token: [u8; 16],
    pub index: u8,
    pub count: u8,
}

impl Join {
    /// Whether the numbers make sense: 2 to [`MAX_CONNECTIONS`]
    /// connections, `index` one of them.
    pub fn valid(&self) -> bool {
        (2..=MAX_CONNECTIONS).contains(&self.count) && self.index < self.count
    }

    /// Connection 0 of a fresh session of `count` connections, with a
    /// random token (the others: the same with their `index`).
    pub fn fresh(count: u8) -> Result<Join, ChannelError> {
        let mut token = [0u8; 16];
        getrandom::fill(&mut token).map_err(|e| ChannelError::Random(e.to_string()))?;
        Ok(Join {
            token,
            index: 0,
            count,
        })
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.token);
        out.push(self.index);
        out.push(self.count);
    }
}

/// The peer's message 1 or 2 payload: its flags, and its join if any.
/// Anything else (unknown flags, a join from a responder, a length that
/// does not match) is a peer that does not speak this version.
fn parse_payload(p: &[u8], role: Role) -> Result<(u8, Option<Join>), ChannelError> {
    let bad =
        || ChannelError::Handshake(format!("unexpected handshake payload ({} bytes)", p.len()));
    let (&flags, rest) = p.split_first().ok_or_else(bad)?;
    if flags & !(FLAG_AES | FLAG_JOIN) != 0 {
        return Err(bad());
    }
    if flags & FLAG_JOIN == 0 {
        return if rest.is_empty() {
            Ok((flags, None))
        } else {
            Err(bad())
        };
    }
    // Only a responder reads an initiator's join.
    if role == Role::Initiator || rest.len() != JOIN_LEN {
        return Err(bad());
    }
    let mut token = [0u8; 16];
    token.copy_from_slice(&rest[..16]);
    let join = Join {
        token,
        index: rest[16],
        count: rest[17],
    };
    if !join.valid() {
        return Err(ChannelError::Handshake(format!(
            "connection {} of {} is not a valid join",
            join.index, join.count
        )));
    }
    Ok((flags, Some(join)))
}

/// The Noise protocol name: pre-shared key first, ephemeral keys only.
const NOISE: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
const HELLO_LEN: usize = 12;
/// A handshake message here is 49 bytes; anything much longer is not one.
const MAX_MSG: usize = 256;

fn hello(role: Role) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8] = match role {
        Role::Initiator => 0,
        Role::Responder => 1,
    };
    h
}

/// The initiator's key confirmation: the handshake hash MACed under a key
/// derived from the initiator-to-responder split key.
fn confirmation(i2r: &[u8; 32], handshake_hash: &[u8]) -> blake3::Hash {
    let key = blake3::derive_key("ferry-channel v2 initiator confirm", i2r);
    blake3::keyed_hash(&key, handshake_hash)
}

/// The peer hung up before the handshake was done.
fn closed_early() -> ChannelError {
    ChannelError::Io(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "connection closed by the peer during the handshake",
    ))
}

fn noise_err(e: snow::Error) -> ChannelError {
    ChannelError::Handshake(e.to_string())
}

fn send_msg<W: Write>(w: &mut W, msg: &[u8]) -> Result<(), ChannelError> {
    let len = u16::try_from(msg.len()).map_err(|_| ChannelError::TooLarge(msg.len()))?;
    w.write_all(&len.to_be_bytes())?;
    w.write_all(msg)?;
    w.flush()?;
    Ok(())
}

/// The peer's next handshake message; `None` if it closed the connection
/// instead (a responder does that when the key is wrong).
fn recv_msg<R: Read>(r: &mut R) -> Result<Option<Vec<u8>>, ChannelError> {
    let mut len = [0u8; 2];
    match read_full(r, &mut len)? {
        0 => return Ok(None),
        2 => {}
        _ => return Err(ChannelError::BadHello("a cut handshake message".into())),
    }
    let n = u16::from_be_bytes(len) as usize;
    if n > MAX_MSG {
        return Err(ChannelError::BadLength(n as u64));
    }
    let mut m = vec![0u8; n];
    if read_full(r, &mut m)? < n {
        return Ok(None);
    }
    Ok(Some(m))
}

/// Run the handshake over `r`/`w` as `role`. Returns the session once the
/// peer has proven it holds the same key. A peer that asks to join a
/// session of several connections is refused: use [`handshake_join`]
/// where that is offered.
pub fn handshake<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    psk: &Psk,
    role: Role,
) -> Result<Session, ChannelError> {
    match handshake_join(r, w, psk, role, None)? {
        (session, None) => Ok(session),
        (_, Some(_)) => Err(ChannelError::Handshake(
            "the peer wants parallel connections, which this side does not take".into(),
        )),
    }
}

/// As [`handshake`]; the initiator may say which connection of a session
/// of several this is (`join`), and the responder gets the initiator's
/// join back (`None` for a session of one connection). `join` is ignored
/// on the responder's side.
pub fn handshake_join<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    psk: &Psk,
    role: Role,
    join: Option<&Join>,
) -> Result<(Session, Option<Join>), ChannelError> {
    let mine = hello(role);
    w.write_all(&mine)?;
    w.flush()?;
    let mut theirs = [0u8; HELLO_LEN];
    let got = read_full(r, &mut theirs)?;
    if got == 0 {
        return Err(closed_early());
    }
    let want_role = match role {
        Role::Initiator => 1,
        Role::Responder => 0,
    };
    if got < HELLO_LEN || &theirs[..8] != MAGIC || theirs[8] != want_role || theirs[9..] != [0; 3] {
        // Show what arrived: often a shell banner or an error text.
        return Err(ChannelError::BadHello(
            String::from_utf8_lossy(&theirs[..got]).trim().to_string(),
        ));
    }
    let mut prologue = Vec::with_capacity(2 * HELLO_LEN);
    match role {
        Role::Initiator => prologue.extend_from_slice(&[mine, theirs].concat()),
        Role::Responder => prologue.extend_from_slice(&[theirs, mine].concat()),
    }
    let key = blake3::derive_key("ferry-channel v2 psk", psk.bytes());
    let params = NOISE
        .parse()
        .map_err(|e: snow::Error| ChannelError::Handshake(e.to_string()))?;
    let builder = snow::Builder::new(params)
        .prologue(&prologue)
        .map_err(noise_err)?
        .psk(0, &key)
        .map_err(noise_err)?;
    let mut hs = match role {
        Role::Initiator => builder.build_initiator(),
        Role::Responder => builder.build_responder(),
    }
    .map_err(noise_err)?;
    let aes = if has_hw_aes() { FLAG_AES } else { 0 };
    let mut buf = [0u8; MAX_MSG];
    let mut payload = [0u8; MAX_MSG];
    let (peer_flags, peer_join) = match role {
        Role::Initiator => {
            let mut mine = vec![aes];
            if let Some(j) = join {
                if !j.valid() {
                    return Err(ChannelError::Handshake(format!(
                        "connection {} of {} is not a valid join",
                        j.index, j.count
                    )));
                }
                mine[0] |= FLAG_JOIN;
                j.encode(&mut mine);
            }
            let n = hs.write_message(&mine, &mut buf).map_err(noise_err)?;
            send_msg(w, &buf[..n])?;
            // A responder that could not open message 1 sends nothing.
            let m = recv_msg(r)?.ok_or(ChannelError::WrongKey)?;
            let n = hs
                .read_message(&m, &mut payload)
                .map_err(|_| ChannelError::WrongKey)?;
            parse_payload(&payload[..n], role)?
        }
        Role::Responder => {
            let m = recv_msg(r)?.ok_or_else(closed_early)?;
            // Checked before anything derived from the key is sent.
            let n = hs
                .read_message(&m, &mut payload)
                .map_err(|_| ChannelError::WrongKey)?;
            let peer = parse_payload(&payload[..n], role)?;
            let n = hs.write_message(&[aes], &mut buf).map_err(noise_err)?;
            send_msg(w, &buf[..n])?;
            peer
        }
    };
    if !hs.is_handshake_finished() {
        return Err(ChannelError::Handshake("handshake did not finish".into()));
    }
    // Initiator to responder first.
    let (i2r, r2i) = hs.dangerously_get_raw_split();
    // Key confirmation. Message 1 alone proves nothing to the responder:
    // the hellos carry no nonce, so one recorded from an earlier session
    // opens again. Only the live initiator has the split keys (its
    // ephemeral key is in them), so the responder returns only after the
    // initiator has shown it holds them.
    let confirm = confirmation(&i2r, hs.get_handshake_hash());
    match role {
        Role::Initiator => send_msg(w, confirm.as_bytes())?,
        Role::Responder => {
            let m = recv_msg(r)?.ok_or_else(closed_early)?;
            let got: [u8; 32] = m
                .as_slice()
                .try_into()
                .map_err(|_| ChannelError::WrongKey)?;
            // blake3::Hash compares in constant time.
            if blake3::Hash::from_bytes(got) != confirm {
                return Err(ChannelError::WrongKey);
            }
        }
    }
    let suite = if aes == FLAG_AES && peer_flags & FLAG_AES == FLAG_AES {
        Suite::Aes256Gcm
    } else {
        Suite::ChaCha20Poly1305
    };
    let (send, recv) = match role {
        Role::Initiator => (i2r, r2i),
        Role::Responder => (r2i, i2r),
    };
    Ok((Session::with_keys(suite, &send, &recv)?, peer_join))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// A client holding another key sends its hello and message 1; the
    /// responder fails with `WrongKey` having sent only its plain hello:
    /// nothing derived from the key to test guesses against.
    #[test]
    fn a_responder_sends_nothing_keyed_to_a_client_without_the_key() {
        let (mut client, server) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let psk = Psk::new(b"the responder's key 0123").unwrap();
            handshake(
                &mut server.try_clone().unwrap(),
                &mut &server,
                &psk,
                Role::Responder,
            )
        });
        let mine = hello(Role::Initiator);
        client.write_all(&mine).unwrap();
        let mut theirs = [0u8; HELLO_LEN];
        client.read_exact(&mut theirs).unwrap();
        let prologue = [mine, theirs].concat();
        let key = blake3::derive_key("ferry-channel v2 psk", b"a guessed key 0123456789");
        let mut hs = snow::Builder::new(NOISE.parse().unwrap())
            .prologue(&prologue)
            .unwrap()
            .psk(0, &key)
            .unwrap()
            .build_initiator()
            .unwrap();
        let mut buf = [0u8; MAX_MSG];
        let n = hs.write_message(&[0], &mut buf).unwrap();
        send_msg(&mut client, &buf[..n]).unwrap();
        assert!(matches!(t.join().unwrap(), Err(ChannelError::WrongKey)));
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).unwrap();
        assert!(
            rest.is_empty(),
            "the responder sent {} more bytes",
            rest.len()
        );
    }

    /// A writer that keeps a copy of what goes through it.
    struct Tee(UnixStream, std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Tee {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.1.lock().unwrap().extend_from_slice(b);
            self.0.write_all(b)?;
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// What a real initiator holding the key said in a whole handshake,
    /// replayed to a fresh responder (found by `fuzz/`'s
    /// `channel_handshake`, replay mode): it proves nothing, so the
    /// responder must not call the peer authenticated (`ferry recv` would
    /// open its output for whoever recorded a handshake).
    #[test]
    fn a_replayed_handshake_authenticates_nothing() {
        let psk = Psk::new(b"the shared key 0123456789").unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let said = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let tee = Tee(a.try_clone().unwrap(), said.clone());
        let key = psk.clone();
        let t = std::thread::spawn(move || {
            handshake(&mut b.try_clone().unwrap(), &mut &b, &key, Role::Responder).map(|_| ())
        });
        let mut w = tee;
        handshake(&mut a.try_clone().unwrap(), &mut w, &psk, Role::Initiator).unwrap();
        t.join().unwrap().unwrap();
        let recorded = said.lock().unwrap().clone();
        let mut out = Vec::new();
        let res = handshake(&mut &recorded[..], &mut out, &psk, Role::Responder);
        assert!(
            matches!(res, Err(ChannelError::WrongKey)),
            "a replay of {} recorded bytes gave {:?}",
            recorded.len(),
            res.map(|_| ())
        );
        // Without the confirmation (message 1 alone), the end of input.
        let cut = &recorded[..recorded.len() - 34];
        let res = handshake(&mut &cut[..], &mut Vec::new(), &psk, Role::Responder);
        assert!(res.is_err(), "message 1 alone authenticated");
    }
}
