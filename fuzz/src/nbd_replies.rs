//! `nbd_replies`: ferry-nbd's pure decoders of what an NBD server sends
//! ([`ferry_nbd::proto`]). (Supersedes `crates/ferry-nbd/fuzz`'s
//! `nbd_reply_decode`.)
//!
//! Input: `structured` (bit 0), `sel`, then bytes, read three ways:
//!
//! * transmission replies ([`decode_reply`]) answering five requests in
//!   flight (cookies 1..=5): whatever is decoded is exactly the bytes it
//!   used (re-encoded from the spec, texts compared lossily), keeps the
//!   bounds of the request it answers, and every READ's coverage
//!   ([`ReadCoverage`]) agrees with a model of disjoint ranges;
//! * option replies ([`parse_opt_reply_header`], [`parse_opt_reply`]): what
//!   is decoded re-encodes to the bytes it came from;
//! * the greeting ([`parse_greeting`]).

use ferry_nbd::proto::*;

use crate::util::Bytes;

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn requests(sel: u8) -> [RequestInfo; 5] {
    [
        RequestInfo {
            cmd: CMD_READ,
            offset: 0,
            len: 4096,
        },
        RequestInfo {
            cmd: CMD_READ,
            offset: u64::MAX - 100,
            len: 64,
        },
        RequestInfo {
            cmd: CMD_BLOCK_STATUS,
            offset: 1 << 20,
            len: 1 << 30,
        },
        RequestInfo {
            cmd: CMD_WRITE,
            offset: 512,
            len: 512,
        },
        RequestInfo {
            cmd: u16::from(sel % 8),
            offset: u64::from(sel) << 9,
            len: u32::from(sel) * 8,
        },
    ]
}

pub fn run(data: &[u8]) {
    let mut b = Bytes(data);
    let structured = b.u8() & 1 != 0;
    let sel = b.u8();
    let body = b.rest();
    transmission(structured, sel, body);
    options(body);
    if body.len() >= 18 {
        let g: [u8; 18] = body[..18].try_into().expect("18 bytes");
        if let Ok(gr) = parse_greeting(&g) {
            assert_eq!(g[..8], NBDMAGIC.to_be_bytes());
            assert_eq!(g[8..16], IHAVEOPT.to_be_bytes());
            assert_eq!(gr.handshake_flags.to_be_bytes(), g[16..18]);
        }
    }
}

/// The model of one READ's coverage: disjoint ranges inside the request.
struct Cover {
    req: RequestInfo,
    ranges: Vec<(u64, u64)>,
}

impl Cover {
    /// What [`ReadCoverage::add`] must answer.
    fn add(&mut self, off: u64, len: u64) -> bool {
        let req_end = self.req.offset.saturating_add(self.req.len.into());
        let Some(end) = off.checked_add(len) else {
            return false;
        };
        if off < self.req.offset || end > req_end {
            return false;
        }
        if len == 0 {
            return true;
        }
        if self.ranges.iter().any(|&(s, e)| off < e && s < end) {
            return false;
        }
        self.ranges.push((off, end));
        true
    }
    fn complete(&self) -> bool {
        self.ranges.iter().map(|(s, e)| e - s).sum::<u64>() == u64::from(self.req.len)
    }
}

fn transmission(structured: bool, sel: u8, body: &[u8]) {
    let reqs = requests(sel);
    let lookup = |c: u64| (1..=5).contains(&c).then(|| reqs[(c - 1) as usize]);
    let mut cov: Vec<ReadCoverage> = reqs.iter().map(ReadCoverage::new).collect();
    let mut model: Vec<Cover> = reqs
        .iter()
        .map(|r| Cover {
            req: *r,
            ranges: Vec::new(),
        })
        .collect();
    let mut rest = body;
    for _ in 0..1024 {
        let Ok(Some((msg, used))) = decode_reply(rest, structured, &lookup) else {
            break;
        };
        assert!(
            used > 0 && used <= rest.len(),
            "used {used} of {}",
            rest.len()
        );
        let raw = &rest[..used];
        match &msg {
            Decoded::Simple {
                cookie,
                error,
                data,
            } => {
                let req = reqs[(*cookie - 1) as usize];
                assert_eq!(raw[..4], SIMPLE_REPLY_MAGIC.to_be_bytes());
                assert_eq!(raw[4..8], error.to_be_bytes());
                assert_eq!(raw[8..16], cookie.to_be_bytes());
                assert_eq!(&raw[16..], *data, "simple reply data");
                if !data.is_empty() {
                    assert!(
                        req.cmd == CMD_READ && *error == 0 && !structured,
                        "simple reply data for {req:?}"
                    );
                    assert_eq!(data.len(), req.len as usize, "simple READ reply length");
                }
            }
            Decoded::Chunk {
                cookie,
                flags,
                chunk,
            } => {
                let i = (*cookie - 1) as usize;
                let req = reqs[i];
                assert!(structured, "a chunk without structured replies");
                assert_eq!(raw[..4], STRUCTURED_REPLY_MAGIC.to_be_bytes());
                assert_eq!(raw[4..6], flags.to_be_bytes());
                assert_eq!(raw[8..16], cookie.to_be_bytes());
                assert_eq!(raw[16..20], ((used - 20) as u32).to_be_bytes());
                let kind = u16::from_be_bytes([raw[6], raw[7]]);
                check_chunk(kind, *flags, chunk, &raw[20..], &req);
                let added = match chunk {
                    Chunk::OffsetData { offset, data } => Some((*offset, data.len() as u64)),
                    Chunk::OffsetHole { offset, len } => Some((*offset, u64::from(*len))),
                    _ => None,
                };
                if let Some((o, l)) = added.filter(|_| req.cmd == CMD_READ) {
                    let got = cov[i].add(o, l).is_ok();
                    assert_eq!(got, model[i].add(o, l), "ReadCoverage::add({o}, {l})");
                    assert_eq!(cov[i].complete(), model[i].complete(), "complete()");
                }
            }
        }
        rest = &rest[used..];
    }
}

/// A chunk is its payload, re-encoded from the spec, and keeps the bounds
/// of the request.
fn check_chunk(kind: u16, flags: u16, chunk: &Chunk<'_>, payload: &[u8], req: &RequestInfo) {
    let in_req = |o: u64, l: u64| {
        o >= req.offset
            && o.checked_add(l)
                .is_some_and(|e| e <= req.offset.saturating_add(req.len.into()))
    };
    let mut enc = Vec::new();
    match chunk {
        Chunk::None => {
            assert_eq!(kind, REPLY_TYPE_NONE);
            assert!(flags & REPLY_FLAG_DONE != 0, "NONE without DONE");
        }
        Chunk::OffsetData { offset, data } => {
            assert_eq!(kind, REPLY_TYPE_OFFSET_DATA);
            assert!(req.cmd == CMD_READ && !data.is_empty());
            assert!(in_req(*offset, data.len() as u64), "data outside {req:?}");
            enc.extend_from_slice(&offset.to_be_bytes());
            enc.extend_from_slice(data);
        }
        Chunk::OffsetHole { offset, len } => {
            assert_eq!(kind, REPLY_TYPE_OFFSET_HOLE);
            assert!(req.cmd == CMD_READ && *len > 0);
            assert!(in_req(*offset, u64::from(*len)), "hole outside {req:?}");
            enc.extend_from_slice(&offset.to_be_bytes());
            enc.extend_from_slice(&len.to_be_bytes());
        }
        Chunk::BlockStatus {
            context,
            descriptors,
        } => {
            assert_eq!(kind, REPLY_TYPE_BLOCK_STATUS);
            assert!(req.cmd == CMD_BLOCK_STATUS && !descriptors.is_empty());
            let mut sum = 0u64;
            for (n, (l, _)) in descriptors.iter().enumerate() {
                assert!(*l > 0, "a descriptor of length 0");
                if n + 1 < descriptors.len() {
                    sum += u64::from(*l);
                    assert!(sum < u64::from(req.len), "descriptors beyond the request");
                }
            }
            enc.extend_from_slice(&context.to_be_bytes());
            for (l, f) in descriptors {
                enc.extend_from_slice(&l.to_be_bytes());
                enc.extend_from_slice(&f.to_be_bytes());
            }
        }
        Chunk::Error {
            kind: k,
            errno,
            message,
            offset,
        } => {
            assert_eq!(*k, kind);
            assert!(kind & REPLY_TYPE_ERROR_BIT != 0 && *errno != 0);
            let mlen = usize::from(u16::from_be_bytes([payload[4], payload[5]]));
            assert_eq!(*message, lossy(&payload[6..6 + mlen]), "error message");
            enc.extend_from_slice(&errno.to_be_bytes());
            enc.extend_from_slice(&(mlen as u16).to_be_bytes());
            enc.extend_from_slice(&payload[6..6 + mlen]);
            match offset {
                Some(o) => {
                    assert_eq!(kind, REPLY_TYPE_ERROR_OFFSET);
                    assert!(in_req(*o, 0), "error offset outside {req:?}");
                    enc.extend_from_slice(&o.to_be_bytes());
                }
                None => assert_ne!(kind, REPLY_TYPE_ERROR_OFFSET),
            }
        }
    }
    // Error chunks other than ERROR_OFFSET may carry type-specific bytes
    // after the message, which the spec says to ignore.
    let ignored_tail = kind & REPLY_TYPE_ERROR_BIT != 0 && kind != REPLY_TYPE_ERROR_OFFSET;
    let used = if ignored_tail {
        enc.len().min(payload.len())
    } else {
        payload.len()
    };
    assert_eq!(
        enc,
        payload[..used],
        "chunk {kind} does not re-encode to its payload"
    );
}

fn options(body: &[u8]) {
    let mut rest = body;
    while rest.len() >= OPT_REPLY_HEADER_LEN {
        let h: [u8; OPT_REPLY_HEADER_LEN] = rest[..OPT_REPLY_HEADER_LEN].try_into().expect("20");
        let Ok(hdr) = parse_opt_reply_header(&h) else {
            break;
        };
        assert_eq!(h[..8], OPT_REPLY_MAGIC.to_be_bytes());
        assert!(hdr.len <= MAX_OPT_REPLY_PAYLOAD);
        let end = OPT_REPLY_HEADER_LEN + hdr.len as usize;
        if rest.len() < end {
            break;
        }
        let payload = &rest[OPT_REPLY_HEADER_LEN..end];
        if let Ok(r) = parse_opt_reply(&hdr, payload) {
            check_opt_reply(&hdr, &r, payload);
        }
        rest = &rest[end..];
    }
}

fn check_opt_reply(h: &OptReplyHeader, r: &OptReply, p: &[u8]) {
    let mut enc = Vec::new();
    match r {
        OptReply::Ack => assert_eq!(h.reply, REP_ACK),
        OptReply::Server { name, details } => {
            assert_eq!(h.reply, REP_SERVER);
            let n = u32::from_be_bytes(p[..4].try_into().expect("4")) as usize;
            assert_eq!(*name, lossy(&p[4..4 + n]));
            assert_eq!(*details, lossy(&p[4 + n..]));
            enc = p.to_vec();
        }
        OptReply::Info(i) => {
            assert_eq!(h.reply, REP_INFO);
            let t = u16::from_be_bytes([p[0], p[1]]);
            enc.extend_from_slice(&t.to_be_bytes());
            match i {
                Info::Export { size, flags } => {
                    assert_eq!(t, INFO_EXPORT);
                    enc.extend_from_slice(&size.to_be_bytes());
                    enc.extend_from_slice(&flags.to_be_bytes());
                }
                Info::Name(s) | Info::Description(s) => {
                    assert!(t == INFO_NAME || t == INFO_DESCRIPTION);
                    assert_eq!(*s, lossy(&p[2..]));
                    enc.extend_from_slice(&p[2..]);
                }
                Info::BlockSize {
                    min,
                    preferred,
                    max,
                } => {
                    assert_eq!(t, INFO_BLOCK_SIZE);
                    for v in [min, preferred, max] {
                        enc.extend_from_slice(&v.to_be_bytes());
                    }
                }
                Info::Unknown(u) => {
                    assert_eq!(*u, t);
                    assert!(
                        ![INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE].contains(&t)
                    );
                    enc.extend_from_slice(&p[2..]);
                }
            }
        }
        OptReply::MetaContext { id, name } => {
            assert_eq!(h.reply, REP_META_CONTEXT);
            assert_eq!(*name, lossy(&p[4..]));
            enc.extend_from_slice(&id.to_be_bytes());
            enc.extend_from_slice(&p[4..]);
        }
        OptReply::Error { reply, message } => {
            assert!(*reply == h.reply && reply & REP_FLAG_ERROR != 0);
            assert_eq!(*message, lossy(p));
            enc = p.to_vec();
        }
        OptReply::Unknown { reply } => {
            assert_eq!(*reply, h.reply);
            assert!(![REP_ACK, REP_SERVER, REP_INFO, REP_META_CONTEXT].contains(reply));
            enc = p.to_vec();
        }
    }
    assert_eq!(
        enc, p,
        "option reply {r:?} does not re-encode to its payload"
    );
}
