//! Seeds of the stream, channel, NBD, delta and compression targets.

use ferry_channel::{ChannelWriter, Suite};
use ferry_compress::{Codec, Compressor, Mode};
use ferry_link::{Message, SignaturePart};
use ferry_nbd::proto::*;

use super::{body, text, Seed};
use crate::stream_messages::{block_head, empty_offer, end_msg, start_msg, ACK, BLOCK, FAIL};
use crate::util::pack;

// ---------------------------------------------------------------- stream

fn block(codec: Codec, plain: &[u8]) -> Vec<u8> {
    let mut c = Compressor::new(Mode::Fixed(codec));
    let mut out = Vec::new();
    let p = c.compress_block(plain, &mut out);
    let payload = if p == Codec::None { plain } else { &out[..] };
    let level = p.level().clamp(-128, 127) as i8 as u8;
    [
        block_head(p.id(), level, plain.len() as u32),
        payload.to_vec(),
    ]
    .concat()
}

pub fn stream_messages(v: &mut Vec<Seed>) {
    let t = "stream_messages";
    let a = text(3000, "stream a");
    let b = text(2000, "stream b");
    let raw = |d: &[u8]| [block_head(0, 0, d.len() as u32), d.to_vec()].concat();
    let ab = [a.clone(), b.clone()].concat();
    let seeds: Vec<(&str, u8, Vec<Vec<u8>>)> = vec![
        ("raw", 0, vec![raw(&a), end_msg(&a)]),
        ("raw_two_blocks", 0, vec![raw(&a), raw(&b), end_msg(&ab)]),
        ("lz4", 0, vec![block(Codec::Lz4, &a), end_msg(&a)]),
        ("zstd", 0, vec![block(Codec::Zstd(3), &a), end_msg(&a)]),
        ("empty_stream", 0, vec![end_msg(b"")]),
        (
            "abort",
            0,
            vec![raw(&a), b"\x03the producer failed".to_vec()],
        ),
        ("no_channel_end", 1, vec![raw(&a), end_msg(&a)]),
        ("wrong_digest", 0, vec![raw(&a), end_msg(&b)]),
        ("data_after_end", 0, vec![end_msg(b""), raw(&a)]),
        ("unknown_message", 0, vec![vec![0x07, 1, 2, 3]]),
        ("short_block", 0, vec![vec![BLOCK, 0]]),
        (
            "own_start",
            4,
            vec![start_msg(0), raw(&a), end_msg(&a)],
        ),
        ("start_not_offered", 4, vec![start_msg(100), raw(&a)]),
        ("no_start", 4, vec![raw(&a), end_msg(&a)]),
    ];
    for (name, flags, recs) in seeds {
        v.push((t, name.into(), pack(&[flags], &recs)));
    }
    // Two blocks of one zstd stream (wire ids 4 then 3, stream 0).
    let mut c = Compressor::new(Mode::Fixed(Codec::Zstd(1)));
    c.set_streaming(true);
    let mut recs = Vec::new();
    for d in [&a, &a] {
        let mut out = Vec::new();
        let p = c.compress(d, &mut out);
        recs.push([block_head(p.wire_id(), 0, d.len() as u32), out].concat());
    }
    recs.push(end_msg(&[a.clone(), a.clone()].concat()));
    v.push((t, "zstd_stream".into(), pack(&[0], &recs)));
}

pub fn stream_control(v: &mut Vec<Seed>) {
    let t = "stream_control";
    let offer_of = |have: u64| {
        let mut m = vec![0x12];
        m.extend_from_slice(&have.to_le_bytes());
        m.extend_from_slice(&[7; 32]);
        m
    };
    let ack = |status: i32| {
        let mut m = vec![ACK];
        m.extend_from_slice(&[0; 40]);
        m.extend_from_slice(&status.to_le_bytes());
        m
    };
    let fail = |code: u8, status: i32, text: &str| {
        let mut m = vec![FAIL, code];
        m.extend_from_slice(&status.to_le_bytes());
        m.extend_from_slice(text.as_bytes());
        m
    };
    let seeds: Vec<(&str, u8, Vec<Vec<u8>>)> = vec![
        ("ack", 2, vec![ack(i32::MIN)]),
        ("ack_status_0", 2, vec![ack(0)]),
        ("ack_status_7", 2, vec![ack(7)]),
        ("ack_wrong_digest", 0, vec![ack(i32::MIN)]),
        ("fail_consumer_exited", 0, vec![fail(4, 141, "broken pipe")]),
        (
            "fail_integrity",
            0,
            vec![fail(8, i32::MIN, "digests differ")],
        ),
        ("fail_unknown_code", 0, vec![fail(200, 1, "?")]),
        ("fail_short", 0, vec![vec![FAIL, 1]]),
        ("no_reply", 0, vec![]),
        ("no_reply_truncated", 1, vec![]),
        ("junk", 0, vec![vec![0x42, 1, 2]]),
        ("offer_nothing", 6, vec![empty_offer(), ack(i32::MIN)]),
        ("offer_a_prefix", 6, vec![offer_of(100), ack(i32::MIN)]),
        ("offer_missing", 4, vec![ack(i32::MIN)]),
        (
            "fail_instead_of_offer",
            4,
            vec![fail(4, 141, "broken pipe")],
        ),
    ];
    for (name, flags, recs) in seeds {
        v.push((t, name.into(), pack(&[flags], &recs)));
    }
}

// ---------------------------------------------------------------- channel

pub fn channel_handshake(v: &mut Vec<Seed>) {
    use crate::channel_handshake::record;
    let t = "channel_handshake";
    // Real flights of a session under a third key (neither side of the
    // target holds it), so that they are a peer without the key.
    let third = || ferry_channel::Psk::new(b"a third key, held by nobody 0123").expect("key");
    let (from_i, from_r) = record(third(), third());
    let (to_wrong, _) = record(third(), crate::stream_messages::psk());
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        ("responder_peer_without_key", [&[0][..], &from_i].concat()),
        (
            "responder_peer_hello_only",
            [&[0][..], &from_i[..12.min(from_i.len())]].concat(),
        ),
        ("responder_peer_refused", [&[0][..], &to_wrong].concat()),
        (
            "responder_ssh_banner",
            [
                &[0][..],
                b"SSH-2.0-OpenSSH_9.9 banner text that is long enough",
            ]
            .concat(),
        ),
        ("responder_nothing", vec![0]),
        ("initiator_peer_without_key", [&[1][..], &from_r].concat()),
        (
            "initiator_peer_hello_cut",
            [&[1][..], &from_r[..from_r.len() / 2]].concat(),
        ),
        ("mitm_clean", vec![2]),
        ("mitm_to_responder_byte_9", vec![2, 0, 9, 0, 1]),
        ("mitm_to_responder_byte_30", vec![2, 0, 30, 0, 0x80]),
        ("mitm_to_initiator_byte_20", vec![2, 1, 20, 0, 0x10]),
        ("mitm_past_the_end", vec![2, 0, 0xff, 0x01, 1]),
        ("replay", vec![3]),
        ("replay_changed", vec![3, 30, 1]),
    ];
    for (name, b) in seeds {
        v.push((t, name.into(), b));
    }
}

fn sealed(suite: Suite, frames: &[&[u8]], end: bool) -> Vec<u8> {
    let key = crate::channel_frames::KEY;
    let mut w = ChannelWriter::with_key(Vec::new(), suite, key).expect("key");
    for f in frames {
        w.send_frame(f).expect("seal");
    }
    if end {
        w.finish().expect("finish");
    }
    w.into_inner()
}

/// Frames with a keepalive before each and between them.
fn with_keepalives(suite: Suite, frames: &[&[u8]]) -> Vec<u8> {
    let key = crate::channel_frames::KEY;
    let mut w = ChannelWriter::with_key(Vec::new(), suite, key).expect("key");
    for f in frames {
        w.keepalive().expect("keepalive");
        w.keepalive().expect("keepalive");
        w.send_frame(f).expect("seal");
    }
    w.keepalive().expect("keepalive");
    w.finish().expect("finish");
    w.into_inner()
}

pub fn channel_frames(v: &mut Vec<Seed>) {
    let t = "channel_frames";
    let two: [&[u8]; 2] = [b"hello", b"world"];
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "raw_aes",
            [vec![0, 0, 0], sealed(Suite::Aes256Gcm, &two, true)].concat(),
        ),
        (
            "raw_chacha",
            [vec![1, 0, 0], sealed(Suite::ChaCha20Poly1305, &two, true)].concat(),
        ),
        (
            "raw_no_end",
            [vec![0, 0, 0], sealed(Suite::Aes256Gcm, &two, false)].concat(),
        ),
        (
            "raw_end_only",
            [vec![1, 0, 0], sealed(Suite::ChaCha20Poly1305, &[], true)].concat(),
        ),
        (
            "raw_huge_length",
            vec![0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3],
        ),
        ("sealed", pack(&[2, 0, 0], &[&b"a"[..], b"bb", b""])),
        (
            "raw_keepalives",
            [vec![0, 0, 0], with_keepalives(Suite::Aes256Gcm, &two)].concat(),
        ),
        ("sealed_keepalives", pack(&[10, 0, 0], &[&b"abc"[..], b""])),
        (
            "sealed_keepalive_flip",
            pack(&[14, 40, 0], &[&b"abc"[..], b"defg"]),
        ),
        ("sealed_flip_len", pack(&[6, 2, 0], &[&b"abc"[..], b"defg"])),
        (
            "sealed_flip_tag",
            pack(&[7, 200, 0], &[&b"abc"[..], b"defg"]),
        ),
    ];
    for (name, b) in seeds {
        v.push((t, name.into(), b));
    }
}

// ---------------------------------------------------------------- NBD

fn chunk(flags: u16, kind: u16, cookie: u64, payload: &[u8]) -> Vec<u8> {
    let mut b = STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend_from_slice(payload);
    b
}

fn simple(error: u32, cookie: u64, data: &[u8]) -> Vec<u8> {
    let mut b = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(data);
    b
}

fn opt(option: u32, reply: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = OPT_REPLY_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&reply.to_be_bytes());
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend_from_slice(payload);
    b
}

fn be(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn error_payload(errno: u32, msg: &str, offset: Option<u64>) -> Vec<u8> {
    let mut p = errno.to_be_bytes().to_vec();
    p.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    p.extend_from_slice(msg.as_bytes());
    if let Some(o) = offset {
        p.extend_from_slice(&o.to_be_bytes());
    }
    p
}

fn greeting(flags: u16) -> Vec<u8> {
    be(&[
        &NBDMAGIC.to_be_bytes(),
        &IHAVEOPT.to_be_bytes(),
        &flags.to_be_bytes(),
    ])
}

fn info_export(size: u64, flags: u16) -> Vec<u8> {
    be(&[
        &INFO_EXPORT.to_be_bytes(),
        &size.to_be_bytes(),
        &flags.to_be_bytes(),
    ])
}

pub fn nbd_replies(v: &mut Vec<Seed>) {
    let t = "nbd_replies";
    let data = text(2048, "nbd");
    let read = be(&[
        &chunk(
            0,
            REPLY_TYPE_OFFSET_DATA,
            1,
            &be(&[&0u64.to_be_bytes(), &data]),
        ),
        &chunk(
            REPLY_FLAG_DONE,
            REPLY_TYPE_OFFSET_HOLE,
            1,
            &be(&[&2048u64.to_be_bytes(), &2048u32.to_be_bytes()]),
        ),
    ]);
    let status = chunk(
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        3,
        &be(&[
            &1u32.to_be_bytes(),
            &4096u32.to_be_bytes(),
            &0u32.to_be_bytes(),
            &(1u32 << 20).to_be_bytes(),
            &(STATE_HOLE | STATE_ZERO).to_be_bytes(),
        ]),
    );
    let errors = be(&[
        &chunk(
            0,
            REPLY_TYPE_ERROR,
            4,
            &error_payload(EIO, "disk on fire", None),
        ),
        &chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, 4, &[]),
        &chunk(
            REPLY_FLAG_DONE,
            REPLY_TYPE_ERROR_OFFSET,
            1,
            &error_payload(EPERM, "no", Some(100)),
        ),
    ]);
    let options = be(&[
        &opt(OPT_STRUCTURED_REPLY, REP_ACK, &[]),
        &opt(
            OPT_LIST,
            REP_SERVER,
            &be(&[&4u32.to_be_bytes(), b"disk", b"details"]),
        ),
        &opt(
            OPT_GO,
            REP_INFO,
            &info_export(1 << 30, FLAG_HAS_FLAGS | FLAG_SEND_FLUSH),
        ),
        &opt(OPT_GO, REP_INFO, &be(&[&INFO_NAME.to_be_bytes(), b"disk"])),
        &opt(
            OPT_GO,
            REP_INFO,
            &be(&[&INFO_DESCRIPTION.to_be_bytes(), b"a disk"]),
        ),
        &opt(
            OPT_GO,
            REP_INFO,
            &be(&[
                &INFO_BLOCK_SIZE.to_be_bytes(),
                &512u32.to_be_bytes(),
                &4096u32.to_be_bytes(),
                &(1u32 << 25).to_be_bytes(),
            ]),
        ),
        &opt(
            OPT_SET_META_CONTEXT,
            REP_META_CONTEXT,
            &be(&[&1u32.to_be_bytes(), b"base:allocation"]),
        ),
        &opt(OPT_GO, REP_ERR_UNSUP, b"not supported"),
        &opt(OPT_GO, 77, b"?"),
    ]);
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        ("structured_read", be(&[&[1, 0], &read[..]])),
        ("structured_block_status", be(&[&[1, 0], &status[..]])),
        ("structured_errors", be(&[&[1, 0], &errors[..]])),
        // sel 8: request 5 is a READ of 64 bytes at 4096.
        ("simple_read", be(&[&[0, 8], &simple(0, 5, &data[..64])])),
        (
            "simple_errors",
            be(&[&[0, 8], &simple(EIO, 1, &[]), &simple(0, 4, &[])]),
        ),
        ("option_replies", be(&[&[0, 0], &options[..]])),
        (
            "greeting",
            be(&[&[0, 0], &greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES)]),
        ),
    ];
    for (name, b) in seeds {
        v.push((t, name.into(), b));
    }
}

pub fn nbd_client(v: &mut Vec<Seed>) {
    let t = "nbd_client";
    let size = 512u64;
    let data = text(size as usize, "export");
    let eflags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_TRIM;
    let go_ok = be(&[
        &opt(OPT_GO, REP_INFO, &info_export(size, eflags)),
        &opt(OPT_GO, REP_ACK, &[]),
    ]);
    let greet = greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    let meta = be(&[
        &opt(
            OPT_SET_META_CONTEXT,
            REP_META_CONTEXT,
            &be(&[&7u32.to_be_bytes(), b"base:allocation"]),
        ),
        &opt(OPT_SET_META_CONTEXT, REP_ACK, &[]),
    ]);
    let read_reply = chunk(
        REPLY_FLAG_DONE,
        REPLY_TYPE_OFFSET_DATA,
        1,
        &be(&[&0u64.to_be_bytes(), &data]),
    );
    let status = chunk(
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        2,
        &be(&[
            &7u32.to_be_bytes(),
            &256u32.to_be_bytes(),
            &0u32.to_be_bytes(),
            &256u32.to_be_bytes(),
            &STATE_ZERO.to_be_bytes(),
        ]),
    );
    // Record i answers the client's message i (0: the greeting; 1: after
    // the client's flags, which have no reply).
    let structured: Vec<Vec<u8>> = vec![
        greet.clone(),
        vec![],
        opt(OPT_STRUCTURED_REPLY, REP_ACK, &[]),
        meta.clone(),
        go_ok.clone(),
        read_reply.clone(),
        status,
        simple(0, 3, &[]),
        simple(0, 4, &[]),
        simple(0, 5, &[]),
    ];
    v.push((t, "structured".into(), pack(&[0], &structured)));
    let mut read_error = structured.clone();
    read_error[5] = chunk(
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        1,
        &error_payload(EIO, "bad sector", None),
    );
    v.push((t, "structured_read_error".into(), pack(&[0], &read_error)));
    let plain: Vec<Vec<u8>> = vec![
        greet.clone(),
        vec![],
        go_ok.clone(),
        simple(0, 1, &data),
        simple(0, 2, &[]),
        simple(0, 3, &[]),
        simple(0, 4, &[]),
    ];
    v.push((t, "simple".into(), pack(&[1], &plain)));
    let fallback: Vec<Vec<u8>> = vec![
        greet.clone(),
        vec![],
        opt(OPT_GO, REP_ERR_UNSUP, &[]),
        be(&[&size.to_be_bytes(), &eflags.to_be_bytes()]),
        simple(0, 1, &data),
    ];
    v.push((t, "export_name_fallback".into(), pack(&[1], &fallback)));
    let refused: Vec<Vec<u8>> = vec![
        greet.clone(),
        vec![],
        opt(OPT_GO, REP_ERR_UNKNOWN, b"no such export"),
    ];
    v.push((t, "export_refused".into(), pack(&[1], &refused)));
    let oldstyle = be(&[
        &NBDMAGIC.to_be_bytes(),
        &CLISERV_MAGIC.to_be_bytes(),
        &[0, 0],
    ]);
    v.push((t, "oldstyle".into(), pack(&[0], &[oldstyle])));
    let no_meta: Vec<Vec<u8>> = vec![
        greet,
        vec![],
        opt(OPT_STRUCTURED_REPLY, REP_ACK, &[]),
        opt(OPT_SET_META_CONTEXT, REP_ERR_UNSUP, &[]),
        go_ok,
        read_reply,
        simple(0, 2, &[]),
        simple(0, 3, &[]),
        simple(0, 4, &[]),
    ];
    v.push((t, "no_base_allocation".into(), pack(&[0], &no_meta)));
}

// ---------------------------------------------------------------- delta

pub fn delta_signature(v: &mut Vec<Seed>) {
    let t = "delta_signature";
    let basis = text(3000, "basis");
    // (position u16, op): delete 10 at 2000, insert 6 at 100, replace at 500.
    let script = [208u8, 7, 10, 100, 0, 70, 244, 1, 200];
    v.push((
        t,
        "honest_bs64".into(),
        pack(&[0, 5, 8], &[&basis[..], &script]),
    ));
    v.push((
        t,
        "honest_bs1024_per1".into(),
        pack(&[0, 7, 1], &[&basis[..], &script]),
    ));
    v.push((
        t,
        "honest_bs1".into(),
        pack(&[0, 0, 16], &[&basis[..200], &script[..3]]),
    ));
    v.push((t, "honest_empty".into(), pack(&[0, 3, 1], &[&b""[..], b""])));
    let source = crate::delta_signature::edit(&basis, &script);
    let (sig, _) = ferry_delta::signature_of_bytes(&basis, 64);
    let n = sig.weak.len();
    let part = |i: usize, j: usize, last: bool| {
        body(&Message::Signature(SignaturePart {
            file: 1,
            block_size: 64,
            basis_size: basis.len() as u64,
            first_block: i as u64,
            weak: sig.weak[i..j].to_vec(),
            strong: sig.strong[i..j].to_vec(),
            last,
        }))
    };
    let parts = vec![
        part(0, 20, false),
        part(20, 40, false),
        part(40, n, true),
        source.clone(),
    ];
    v.push((t, "hostile_honest_parts".into(), pack(&[1, 0, 0], &parts)));
    let gap = vec![part(0, 20, false), part(30, n, true), source.clone()];
    v.push((t, "hostile_gap".into(), pack(&[1, 0, 0], &gap)));
    let short = vec![part(0, 20, true), source];
    v.push((t, "hostile_incomplete".into(), pack(&[1, 0, 0], &short)));
}

pub fn sig_cache(v: &mut Vec<Seed>) {
    let t = "sig_cache";
    let basis = text(1000, "cached");
    let key = ferry_delta::CacheKey {
        path: b"/data/file".to_vec(),
        size: basis.len() as u64,
        mtime: 1_700_000_000,
        mtime_nsec: 12,
        inode: 77,
        block_size: 64,
    };
    let (sig, full) = ferry_delta::signature_of_bytes(&basis, 64);
    let file = ferry_delta::cache::encode(&key, &sig, &full).expect("encode");
    v.push((t, "file".into(), [&[0][..], &file].concat()));
    v.push((
        t,
        "file_unchecked".into(),
        [&[1][..], &file[..file.len() - 32]].concat(),
    ));
    let mut params = vec![2, 64, 4];
    params.extend_from_slice(b"/a/b");
    params.extend_from_slice(&[1; 20]);
    params.extend_from_slice(&basis[..300]);
    v.push((t, "key_and_basis".into(), params));
}

pub fn journal(v: &mut Vec<Seed>) {
    use ferry_core::journal::{header, record, Identity};
    let t = "journal";
    let id = Identity {
        size: 100 << 20,
        mtime: 1_700_000_000,
        mtime_nsec: 12,
        name: b"disk.img".to_vec(),
    };
    let (mut file, check) = header(&id).expect("header");
    for seg in [0u64, 1, 5, 12] {
        file.extend_from_slice(&record(&check, seg, &[seg as u8; 32]));
    }
    v.push((t, "journal".into(), [&[0][..], &file].concat()));
    let mut torn = file.clone();
    torn.truncate(file.len() - 7);
    v.push((t, "torn".into(), [&[0][..], &torn].concat()));
    let mut params = vec![3];
    params.extend_from_slice(&(100u64 << 20).to_le_bytes());
    params.push(0);
    params.extend_from_slice(&[7; 12]);
    params.push(4);
    params.extend_from_slice(b"a.im");
    for seg in [0u64, 3, 99] {
        params.extend_from_slice(&seg.to_le_bytes());
        params.extend_from_slice(&[9; 40]);
    }
    v.push((t, "built".into(), params));
}

// ---------------------------------------------------------------- compress

pub fn decompress(v: &mut Vec<Seed>) {
    let t = "decompress";
    let a = text(3000, "compress");
    let rec = |x: u8, raw_len: usize, payload: &[u8]| {
        [
            vec![x],
            (raw_len as u32).to_le_bytes().to_vec(),
            payload.to_vec(),
        ]
        .concat()
    };
    let independent = |codec: Codec| {
        let b = block(codec, &a);
        rec(b[1], a.len(), &b[7..])
    };
    let blocks = vec![
        independent(Codec::Lz4),
        independent(Codec::Zstd(3)),
        rec(0, 5, b"plain"),
        rec(2, 1 << 30, b"huge"),
    ];
    v.push((t, "blocks".into(), pack(&[0, 3], &blocks)));
    let mut c = Compressor::new(Mode::Fixed(Codec::Zstd(1)));
    c.set_streaming(true);
    let mut recs = Vec::new();
    for d in [&a, &a, &a] {
        let mut out = Vec::new();
        let p = c.compress(d, &mut out);
        recs.push(rec(
            u8::from(p.wire_id() == ferry_compress::WIRE_STREAM_START),
            d.len(),
            &out,
        ));
    }
    v.push((t, "stream".into(), pack(&[1, 0], &recs)));
    let mut continuation_first = recs.clone();
    continuation_first.remove(0);
    v.push((
        t,
        "stream_without_start".into(),
        pack(&[1, 0], &continuation_first),
    ));
    let plain = [a.clone(), text(500, "other"), vec![0; 700]];
    for (name, sel) in [
        ("roundtrip_lz4", 2),
        ("roundtrip_zstd", 5),
        ("roundtrip_stream", 8),
    ] {
        v.push((t, name.into(), pack(&[sel, 1], &plain)));
    }
}

pub fn daemon_request(v: &mut Vec<Seed>) {
    use ferry_link::daemon::{encode_answer, encode_request, Status};
    let t = "daemon_request";
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let opts = ferry_core::SyncOptions {
        delete: true,
        excludes: ferry_core::Excludes::from_rules(&[ferry_core::FilterRule::exclude("*.tmp")])
            .expect("rules"),
        ..Default::default()
    };
    let push = ferry_core::remote::serve_args(&opts, false, false, &["vol/".into()]);
    let pull = ferry_core::remote::serve_args(&opts, true, false, &["a".into(), "b/".into()]);
    for (name, a) in [
        ("push", push),
        ("pull", pull),
        ("link_dest", args(&["serve", "--stdio", "--receive", "--link-dest=/etc", "--", "x"])),
        ("merge", args(&["serve", "--stdio", "--send", "--filter=. /etc/passwd", "--", ""])),
    ] {
        let req = encode_request(&a).expect("seed request");
        v.push((t, format!("{name}_wire"), [&[1u8][..], &req].concat()));
        v.push((t, format!("{name}_body"), [&[0u8][..], &req[12..]].concat()));
    }
    let ans = encode_answer(Status::Io, "\"x\": no such directory");
    v.push((t, "answer".into(), [&[3u8][..], &ans].concat()));
}
