//! Feeds arbitrary server bytes to the pure NBD decoders: transmission
//! replies (simple + structured, with read coverage tracking as the reader
//! thread does it) and handshake option replies. Must never panic or
//! allocate from an unchecked length.
#![no_main]

use ferry_nbd::proto::*;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let structured = data[0] & 1 != 0;
    let sel = data[1];
    let body = &data[2..];

    // In-flight requests the replies may answer (cookies 1..=5).
    let reqs = [
        RequestInfo { cmd: CMD_READ, offset: 0, len: 4096 },
        RequestInfo { cmd: CMD_READ, offset: u64::MAX - 100, len: 64 },
        RequestInfo { cmd: CMD_BLOCK_STATUS, offset: 1 << 20, len: 1 << 30 },
        RequestInfo { cmd: CMD_WRITE, offset: 512, len: 512 },
        RequestInfo { cmd: u16::from(sel), offset: u64::from(sel) << 9, len: u32::from(sel) * 8 },
    ];
    let lookup = |c: u64| -> Option<RequestInfo> {
        (1..=5).contains(&c).then(|| reqs[(c - 1) as usize])
    };
    let mut cov: Vec<ReadCoverage> = reqs.iter().map(ReadCoverage::new).collect();
    let mut rest = body;
    while let Ok(Some((msg, used))) = decode_reply(rest, structured, &lookup) {
        assert!(used > 0 && used <= rest.len());
        match msg {
            Decoded::Chunk { cookie, chunk, .. } => {
                let i = (cookie - 1) as usize;
                match chunk {
                    Chunk::OffsetData { offset, data } => {
                        let _ = cov[i].add(offset, data.len() as u64);
                    }
                    Chunk::OffsetHole { offset, len } => {
                        let _ = cov[i].add(offset, len.into());
                    }
                    _ => {}
                }
                let _ = cov[i].complete();
            }
            Decoded::Simple { data, .. } => {
                let _ = data.len();
            }
        }
        rest = &rest[used..];
    }

    // The same bytes as handshake traffic.
    if body.len() >= 18 {
        let mut g = [0u8; 18];
        g.copy_from_slice(&body[..18]);
        let _ = parse_greeting(&g);
    }
    let mut rest = body;
    while rest.len() >= OPT_REPLY_HEADER_LEN {
        let mut h = [0u8; OPT_REPLY_HEADER_LEN];
        h.copy_from_slice(&rest[..OPT_REPLY_HEADER_LEN]);
        let Ok(hdr) = parse_opt_reply_header(&h) else { break };
        let end = OPT_REPLY_HEADER_LEN + hdr.len as usize;
        if rest.len() < end {
            break;
        }
        let _ = parse_opt_reply(&hdr, &rest[OPT_REPLY_HEADER_LEN..end]);
        rest = &rest[end..];
    }
});
