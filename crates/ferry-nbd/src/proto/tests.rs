//! Unit and property tests of the decoders in `proto`: chunk and simple
//! reply decoding, option replies, READ coverage, and a never-panics
//! property over arbitrary bytes.

use super::*;

fn chunk(flags: u16, kind: u16, cookie: u64, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend_from_slice(payload);
    b
}

const READ: RequestInfo = RequestInfo {
    cmd: CMD_READ,
    offset: 4096,
    len: 1024,
};

fn lk(c: u64) -> Option<RequestInfo> {
    (c == 7).then_some(READ)
}

#[test]
fn decodes_data_and_hole_chunks() {
    let mut p = 4096u64.to_be_bytes().to_vec();
    p.extend_from_slice(&[1u8; 512]);
    let b = chunk(0, REPLY_TYPE_OFFSET_DATA, 7, &p);
    let (d, n) = decode_reply(&b, true, &lk).unwrap().unwrap();
    assert_eq!(n, b.len());
    match d {
        Decoded::Chunk {
            chunk: Chunk::OffsetData { offset, data },
            ..
        } => {
            assert_eq!(offset, 4096);
            assert_eq!(data.len(), 512);
        }
        d => panic!("{d:?}"),
    }
    let mut p = 4608u64.to_be_bytes().to_vec();
    p.extend_from_slice(&512u32.to_be_bytes());
    let b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_HOLE, 7, &p);
    assert!(matches!(
        decode_reply(&b, true, &lk).unwrap().unwrap().0,
        Decoded::Chunk {
            chunk: Chunk::OffsetHole {
                offset: 4608,
                len: 512
            },
            ..
        }
    ));
    // partial input
    assert_eq!(decode_reply(&b[..b.len() - 1], true, &lk).unwrap(), None);
}

#[test]
fn rejects_bad_replies() {
    // unknown cookie
    let b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, 8, &[]);
    assert_eq!(
        decode_reply(&b, true, &lk).unwrap_err(),
        ProtoError::UnknownCookie(8)
    );
    // wrong magic
    let mut w = b.clone();
    w[0] = 0;
    assert!(matches!(
        decode_reply(&w, true, &lk),
        Err(ProtoError::BadMagic { .. })
    ));
    // data chunk beyond request
    let mut p = 5000u64.to_be_bytes().to_vec();
    p.extend_from_slice(&[0u8; 200]);
    let b = chunk(0, REPLY_TYPE_OFFSET_DATA, 7, &p);
    assert!(matches!(
        decode_reply(&b, true, &lk),
        Err(ProtoError::OutOfBounds { .. })
    ));
    // data chunk longer than the request: refused from the header alone
    let mut h = chunk(0, REPLY_TYPE_OFFSET_DATA, 7, &[]);
    h[16..20].copy_from_slice(&(u32::MAX).to_be_bytes());
    assert!(matches!(
        decode_reply(&h, true, &lk),
        Err(ProtoError::TooLong { .. })
    ));
    // structured reply without negotiation
    let b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, 7, &[]);
    assert!(decode_reply(&b, false, &lk).is_err());
    // NONE without DONE
    let b = chunk(0, REPLY_TYPE_NONE, 7, &[]);
    assert!(decode_reply(&b, true, &lk).is_err());
    // block status chunk to a READ
    let b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, 7, &[0; 12]);
    assert!(decode_reply(&b, true, &lk).is_err());
    // error message overrunning the chunk
    let mut p = EIO.to_be_bytes().to_vec();
    p.extend_from_slice(&100u16.to_be_bytes());
    p.extend_from_slice(b"short");
    let b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, 7, &p);
    assert!(decode_reply(&b, true, &lk).is_err());
}

#[test]
fn decodes_errors() {
    let mut p = EIO.to_be_bytes().to_vec();
    p.extend_from_slice(&4u16.to_be_bytes());
    p.extend_from_slice(b"oops");
    p.extend_from_slice(&4100u64.to_be_bytes());
    let b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_ERROR_OFFSET, 7, &p);
    match decode_reply(&b, true, &lk).unwrap().unwrap().0 {
        Decoded::Chunk {
            chunk:
                Chunk::Error {
                    errno,
                    message,
                    offset,
                    ..
                },
            ..
        } => {
            assert_eq!(errno, EIO);
            assert_eq!(message, "oops");
            assert_eq!(offset, Some(4100));
        }
        d => panic!("{d:?}"),
    }
    // simple reply error to READ: no payload follows
    let mut s = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
    s.extend_from_slice(&EINVAL.to_be_bytes());
    s.extend_from_slice(&7u64.to_be_bytes());
    let (d, n) = decode_reply(&s, true, &lk).unwrap().unwrap();
    assert_eq!(n, 16);
    assert!(matches!(d, Decoded::Simple { error: EINVAL, .. }));
    // simple successful READ without structured replies: data follows
    let mut s = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
    s.extend_from_slice(&0u32.to_be_bytes());
    s.extend_from_slice(&7u64.to_be_bytes());
    assert_eq!(decode_reply(&s, false, &lk).unwrap(), None);
    s.extend_from_slice(&[9u8; 1024]);
    let (d, n) = decode_reply(&s, false, &lk).unwrap().unwrap();
    assert_eq!(n, 16 + 1024);
    assert!(matches!(d, Decoded::Simple { data, .. } if data.len() == 1024));
}

#[test]
fn coverage_detects_overlap_and_gaps() {
    let mut c = ReadCoverage::new(&READ);
    c.add(4096, 100).unwrap();
    c.add(4196 + 100, 100).unwrap();
    assert!(c.add(4150, 10).is_err());
    assert!(c.add(4196 + 50, 60).is_err());
    assert!(c.add(4000, 10).is_err());
    assert!(!c.complete());
    c.add(4196, 100).unwrap();
    c.add(4396, 1024 - 300).unwrap();
    assert!(c.complete());
}

#[test]
fn option_replies() {
    let mut h = [0u8; 20];
    h[0..8].copy_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    h[8..12].copy_from_slice(&OPT_GO.to_be_bytes());
    h[12..16].copy_from_slice(&REP_INFO.to_be_bytes());
    h[16..20].copy_from_slice(&12u32.to_be_bytes());
    let hdr = parse_opt_reply_header(&h).unwrap();
    let mut p = INFO_EXPORT.to_be_bytes().to_vec();
    p.extend_from_slice(&(1u64 << 30).to_be_bytes());
    p.extend_from_slice(&(FLAG_HAS_FLAGS | FLAG_READ_ONLY).to_be_bytes());
    assert_eq!(
        parse_opt_reply(&hdr, &p).unwrap(),
        OptReply::Info(Info::Export {
            size: 1 << 30,
            flags: 3
        })
    );
    h[16..20].copy_from_slice(&(MAX_OPT_REPLY_PAYLOAD + 1).to_be_bytes());
    assert!(parse_opt_reply_header(&h).is_err());
}

#[test]
fn block_status_descriptors() {
    let req = RequestInfo {
        cmd: CMD_BLOCK_STATUS,
        offset: 0,
        len: 1 << 20,
    };
    let mut p = 1u32.to_be_bytes().to_vec();
    for (l, f) in [(65536u32, 0u32), (1 << 20, 3)] {
        p.extend_from_slice(&l.to_be_bytes());
        p.extend_from_slice(&f.to_be_bytes());
    }
    // the last extent may run past the request
    match parse_chunk_payload(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, &p, &req).unwrap() {
        Chunk::BlockStatus {
            context,
            descriptors,
        } => {
            assert_eq!(context, 1);
            assert_eq!(descriptors, vec![(65536, 0), (1 << 20, 3)]);
        }
        c => panic!("{c:?}"),
    }
    // but not a middle one
    let mut p2 = 1u32.to_be_bytes().to_vec();
    for (l, f) in [(1u32 << 20, 0u32), (4096, 3)] {
        p2.extend_from_slice(&l.to_be_bytes());
        p2.extend_from_slice(&f.to_be_bytes());
    }
    assert!(parse_chunk_payload(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, &p2, &req).is_err());
}

mod prop {
    use super::super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(proptest::test_runner::Config { failure_persistence: None, ..proptest::test_runner::Config::default() })]
        #[test]
        fn decode_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..256),
                               structured in any::<bool>(),
                               cmd in 0u16..8, off in any::<u64>(), len in any::<u32>()) {
            let req = RequestInfo { cmd, offset: off, len };
            let lk = |_c: u64| Some(req);
            let mut rest: &[u8] = &buf;
            while let Ok(Some((_, n))) = decode_reply(rest, structured, &lk) {
                prop_assert!(n > 0 && n <= rest.len());
                rest = &rest[n..];
            }
        }
    }
}
