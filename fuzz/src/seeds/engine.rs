//! Seeds of the targets that speak ferry's sync protocol: the codec and
//! framing, and a sender played against the real receiver.

use ferry_compress::{Codec, Compressor, Mode};
use ferry_link::layout::{self, SegmentHasher};
use ferry_link::{
    CompressedData, Entry, EntryKind, FatalClass, Message, ReceiverReport, SignaturePart, WantMode,
    MAGIC,
};

use super::{body, text, Seed};
use crate::frame::frame_of;
use crate::receiver_sequence::{old_content, OLD_MTIME};
use crate::util::pack;

pub(super) fn bodies(msgs: &[Message]) -> Vec<Vec<u8>> {
    msgs.iter().map(body).collect()
}

pub(super) fn hello() -> Message {
    Message::Hello {
        version: ferry_link::PROTOCOL_VERSION,
        features: ferry_link::features::ALL,
    }
}

fn compressed() -> Vec<Message> {
    let t = text(8000, "compressed");
    let mut out = Vec::new();
    let mut v = vec![Message::Compressed(CompressedData {
        file: 1,
        offset: 0,
        codec: 0,
        stream: 0,
        level: 0,
        raw_len: 9,
        data: b"raw bytes".to_vec(),
    })];
    for codec in [Codec::Lz4, Codec::Zstd(3)] {
        let mut c = Compressor::new(Mode::Fixed(codec));
        let p = c.compress(&t, &mut out);
        v.push(Message::Compressed(CompressedData {
            file: 1,
            offset: 8192,
            codec: p.wire_id(),
            stream: 0,
            level: p.codec.level(),
            raw_len: t.len() as u32,
            data: out.clone(),
        }));
    }
    let mut c = Compressor::new(Mode::Fixed(Codec::Zstd(1)));
    c.set_streaming(true);
    for k in 0..2u64 {
        let p = c.compress(&t, &mut out);
        v.push(Message::Compressed(CompressedData {
            file: 2,
            offset: k * 8000,
            codec: p.wire_id(),
            stream: 1,
            level: p.codec.level(),
            raw_len: t.len() as u32,
            data: out.clone(),
        }));
    }
    v
}

fn sample_messages() -> Vec<Message> {
    vec![
        hello(),
        Message::Entry(Box::new(Entry {
            id: 1,
            path: b"dir/file".to_vec(),
            kind: Some(EntryKind::File),
            mode: 0o100644,
            uid: 1000,
            gid: 1000,
            size: 1234,
            mtime: 1_700_000_000,
            mtime_nsec: 5,
            owner: b"alice".to_vec(),
            group: b"staff".to_vec(),
            ..Default::default()
        })),
        Message::Entry(Box::new(Entry {
            id: 2,
            path: b"link".to_vec(),
            kind: Some(EntryKind::Symlink),
            mode: 0o120777,
            target: b"../x".to_vec(),
            xattrs: vec![(b"user.k".to_vec(), b"v".to_vec())],
            digest: Some([7; 32]),
            mtime: -5,
            ..Default::default()
        })),
        Message::EndOfList,
        Message::Want {
            file: 1,
            mode: WantMode::Delta,
        },
        Message::Signature(SignaturePart {
            file: 1,
            block_size: 8192,
            basis_size: 10_000,
            first_block: 0,
            weak: vec![1, 2],
            strong: vec![[3; 16], [4; 16]],
            last: true,
        }),
        Message::Want {
            file: 2,
            mode: WantMode::Resume,
        },
        Message::Have(ferry_link::HavePart {
            file: 2,
            upto: 4,
            kept: vec![(0, [5; 32]), (2, [6; 32])],
        }),
        Message::Data {
            file: 1,
            offset: 0,
            data: b"hello".to_vec(),
        },
        Message::Zero {
            file: 1,
            offset: 4096,
            len: 1 << 20,
        },
        Message::Copy {
            file: 1,
            offset: 0,
            basis_offset: 8192,
            len: 8192,
        },
        Message::SegmentDone {
            file: 1,
            segment: 0,
            digest: [9; 32],
        },
        Message::Holes {
            file: 1,
            first: 1,
            count: 3,
        },
        Message::FileFailed {
            file: 1,
            error: "read dir/file: gone".into(),
        },
        Message::SenderDone,
        Message::Change(Box::new(ferry_link::Change {
            code: *b">f.st......",
            path: b"dir/file".to_vec(),
            to: Vec::new(),
        })),
        Message::ReceiverDone(Box::new(ReceiverReport {
            files_total: 3,
            files_transferred: 2,
            bytes_total: 100,
            errors: vec!["x: failed".into()],
            ..Default::default()
        })),
        Message::Fatal {
            class: FatalClass::Io,
            error: "no space".into(),
        },
    ]
}

pub fn frame(v: &mut Vec<Seed>) {
    let msgs = sample_messages();
    let all = bodies(&msgs);
    v.push(("frame", "every_message".into(), pack(&[0, 0, 0], &all)));
    v.push((
        "frame",
        "every_message_bit_flipped".into(),
        pack(&[4, 0x34, 0x02], &all),
    ));
    for m in &msgs {
        v.push((
            "frame",
            format!("one_{}", m.name()),
            pack(&[0, 0, 0], &[body(m)]),
        ));
    }
    v.push((
        "frame",
        "compressed".into(),
        pack(&[0, 0, 0], &bodies(&compressed())),
    ));
    let mut stream = MAGIC.to_vec();
    for m in &msgs[..4] {
        stream.extend_from_slice(&frame_of(&body(m)));
    }
    v.push((
        "frame",
        "raw_stream".into(),
        [&[2, 0, 0][..], &stream].concat(),
    ));
    v.push((
        "frame",
        "raw_after_magic".into(),
        [&[1, 0, 0][..], &stream[8..]].concat(),
    ));
    let old = [&b"FERRY\x00\x01\n"[..], b"\x05\x00\x00\x00hello"].concat();
    v.push((
        "frame",
        "old_framing".into(),
        [&[2, 0, 0][..], &old].concat(),
    ));
    let banner = b"Welcome to host!\nlast login: never";
    v.push((
        "frame",
        "shell_banner".into(),
        [&[2, 0, 0][..], &banner[..]].concat(),
    ));
}

// ---------------------------------------------------------------- receiver

fn ent(id: u32, path: &str, kind: EntryKind, size: u64) -> Entry {
    Entry {
        id,
        path: path.as_bytes().to_vec(),
        kind: Some(kind),
        mode: match kind {
            EntryKind::Dir => 0o040755,
            EntryKind::Symlink => 0o120777,
            _ => 0o100644,
        },
        size,
        mtime: 1_600_000_000,
        ..Default::default()
    }
}

fn e(x: Entry) -> Message {
    Message::Entry(Box::new(x))
}

fn link(id: u32, path: &str, target: &str) -> Message {
    let mut x = ent(id, path, EntryKind::Symlink, 0);
    x.target = target.as_bytes().to_vec();
    e(x)
}

/// The ops of an honest whole-file transfer: data per segment, digests.
fn file_ops(id: u32, content: &[u8], block: u64) -> Vec<Message> {
    let size = content.len() as u64;
    let mut v = Vec::new();
    for seg in 0..layout::segment_count(size) {
        let (a, b) = layout::segment_range(size, seg);
        let mut h = SegmentHasher::new(block);
        h.data(&content[a as usize..b as usize]);
        v.push(Message::Data {
            file: id,
            offset: a,
            data: content[a as usize..b as usize].to_vec(),
        });
        v.push(Message::SegmentDone {
            file: id,
            segment: seg as u32,
            digest: h.finish().0,
        });
    }
    v
}

fn whole(id: u32, content: &[u8]) -> Vec<Message> {
    file_ops(id, content, layout::grid_block(content.len() as u64))
}

/// A receiver_sequence input: paced (as a real sender) unless the flags
/// say in-process, whose whole-file digests are zeros.
fn session(flags: u8, msgs: Vec<Message>) -> Vec<u8> {
    let msgs: Vec<Message> = msgs
        .into_iter()
        .map(|m| match m {
            Message::SegmentDone { file, segment, .. } if flags & 0x11 == 1 => {
                Message::SegmentDone {
                    file,
                    segment,
                    digest: [0; 32],
                }
            }
            m => m,
        })
        .collect();
    pack(&[flags, 1], &bodies(&msgs))
}

pub fn receiver_sequence(v: &mut Vec<Seed>) {
    let t = "receiver_sequence";
    let f = text(100, "f");
    let g = text(5000, "g");
    let mut tree = vec![
        e(ent(0, "", EntryKind::Dir, 0)),
        e(ent(1, "a", EntryKind::Dir, 0)),
        e(ent(2, "a/f", EntryKind::File, 100)),
        e(ent(3, "g", EntryKind::File, 5000)),
        link(4, "l", "a/f"),
        e({
            let mut h = ent(5, "h", EntryKind::HardLink, 0);
            h.link_to = 2;
            h
        }),
        e(ent(6, "empty", EntryKind::File, 0)),
        Message::EndOfList,
    ];
    tree.extend(whole(2, &f));
    tree.extend(whole(3, &g));
    tree.push(Message::SenderDone);
    v.push((t, "honest_tree".into(), session(0, tree.clone())));
    v.push((
        t,
        "honest_tree_unpaced".into(),
        pack(&[0, 0], &bodies(&tree)),
    ));
    v.push((t, "honest_tree_in_process".into(), session(1, tree)));

    let mut new_old = old_content();
    new_old[100..120].copy_from_slice(b"CHANGED CHANGED 1234");
    let changed = |flags: u8, ops: Vec<Message>| {
        let mut m = vec![
            e(ent(0, "", EntryKind::Dir, 0)),
            e(ent(1, "old", EntryKind::File, 3000)),
            Message::EndOfList,
        ];
        m.extend(ops);
        m.push(Message::SenderDone);
        session(flags, m)
    };
    v.push((t, "changed_old".into(), changed(0, whole(1, &new_old))));
    v.push((
        t,
        "changed_old_inplace".into(),
        changed(128, whole(1, &new_old)),
    ));
    // A delta: the old bytes around the change are copied.
    let mut delta = vec![
        Message::Copy {
            file: 1,
            offset: 0,
            basis_offset: 0,
            len: 100,
        },
        Message::Data {
            file: 1,
            offset: 100,
            data: new_old[100..120].to_vec(),
        },
        Message::Copy {
            file: 1,
            offset: 120,
            basis_offset: 120,
            len: 2880,
        },
    ];
    let mut h = SegmentHasher::new(layout::delta_block(3000));
    h.data(&new_old);
    delta.push(Message::SegmentDone {
        file: 1,
        segment: 0,
        digest: h.finish().0,
    });
    v.push((t, "delta_old".into(), changed(16, delta.clone())));
    v.push((t, "delta_old_in_process".into(), changed(17, delta)));
    let mut unchanged = ent(1, "old", EntryKind::File, 3000);
    unchanged.mtime = OLD_MTIME;
    unchanged.digest = Some(*blake3::hash(&old_content()).as_bytes());
    v.push((
        t,
        "checksum_unchanged".into(),
        session(
            64,
            vec![
                e(ent(0, "", EntryKind::Dir, 0)),
                e(unchanged),
                Message::EndOfList,
                Message::SenderDone,
            ],
        ),
    ));

    let one = |path: &str, content: &[u8]| {
        let mut m = vec![
            e(ent(0, path, EntryKind::File, content.len() as u64)),
            Message::EndOfList,
        ];
        m.extend(whole(0, content));
        m.push(Message::SenderDone);
        m
    };
    v.push((t, "file_or_dir".into(), session(4, one("x", b"0123456789"))));
    let mut del = vec![e(ent(0, "", EntryKind::Dir, 0))];
    del.extend(one("new", b"new!!"));
    // Ids must increase: renumber the file as 1.
    let del: Vec<Message> = del
        .into_iter()
        .map(|m| match m {
            Message::Entry(mut x) if x.path == b"new" => {
                x.id = 1;
                Message::Entry(x)
            }
            Message::Data { offset, data, .. } => Message::Data {
                file: 1,
                offset,
                data,
            },
            Message::SegmentDone {
                segment, digest, ..
            } => Message::SegmentDone {
                file: 1,
                segment,
                digest,
            },
            m => m,
        })
        .collect();
    v.push((t, "delete".into(), session(2, del)));
    let mut xf = ent(1, "x", EntryKind::File, 3);
    xf.xattrs = vec![(b"user.fuzz".to_vec(), b"v".to_vec())];
    let mut xm = vec![e(ent(0, "", EntryKind::Dir, 0)), e(xf), Message::EndOfList];
    xm.extend(whole(1, b"abc"));
    xm.push(Message::SenderDone);
    v.push((t, "xattrs".into(), session(32, xm)));

    // Hostile lists and ops, after crates/ferry-core/tests/hostile.rs.
    let root = || e(ent(0, "", EntryKind::Dir, 0));
    let x10 = || e(ent(1, "x", EntryKind::File, 10));
    let hostile: Vec<(&str, Vec<Message>)> = vec![
        (
            "dir_then_symlink",
            vec![
                root(),
                e(ent(1, "a", EntryKind::Dir, 0)),
                link(2, "a", "../outside"),
                e(ent(3, "a/x", EntryKind::File, 5)),
                Message::EndOfList,
            ],
        ),
        (
            "root_symlink",
            vec![
                link(0, "", "../outside"),
                e(ent(1, "x", EntryKind::File, 5)),
            ],
        ),
        (
            "below_symlink",
            vec![
                root(),
                link(1, "l", "../outside"),
                e(ent(2, "l/canary", EntryKind::File, 9)),
                Message::EndOfList,
                Message::Data {
                    file: 2,
                    offset: 0,
                    data: b"PWNED!!!!".to_vec(),
                },
            ],
        ),
        (
            "hardlink_to_dir",
            vec![root(), e(ent(1, "sub", EntryKind::Dir, 0)), {
                let mut h = ent(2, "h", EntryKind::HardLink, 0);
                h.link_to = 1;
                e(h)
            }],
        ),
        (
            "data_past_end",
            vec![
                root(),
                x10(),
                Message::EndOfList,
                Message::Data {
                    file: 1,
                    offset: 100,
                    data: b"PWNED".to_vec(),
                },
            ],
        ),
        (
            "zero_huge",
            vec![
                root(),
                x10(),
                Message::EndOfList,
                Message::Zero {
                    file: 1,
                    offset: 1,
                    len: u64::MAX - 1,
                },
            ],
        ),
        ("missing_data", {
            let mut m = vec![root(), x10(), Message::EndOfList];
            m.push(Message::SegmentDone {
                file: 1,
                segment: 0,
                digest: [0; 32],
            });
            m.push(Message::SenderDone);
            m
        }),
        ("half_data", {
            let mut m = vec![root(), x10(), Message::EndOfList];
            m.push(Message::Data {
                file: 1,
                offset: 0,
                data: b"01234".to_vec(),
            });
            m.push(Message::SegmentDone {
                file: 1,
                segment: 0,
                digest: [0; 32],
            });
            m.push(Message::SenderDone);
            m
        }),
        ("segment_twice", {
            let mut m = vec![root(), x10(), Message::EndOfList];
            m.extend(whole(1, b"0123456789"));
            m.push(Message::SegmentDone {
                file: 1,
                segment: 0,
                digest: [0; 32],
            });
            m
        }),
        (
            "data_for_unlisted",
            vec![
                root(),
                Message::EndOfList,
                Message::Data {
                    file: 99,
                    offset: 0,
                    data: b"PWNED".to_vec(),
                },
            ],
        ),
        (
            "big_sparse",
            vec![
                root(),
                e(ent(1, "big", EntryKind::File, layout::SEGMENT + 10)),
                Message::EndOfList,
                Message::Zero {
                    file: 1,
                    offset: 0,
                    len: layout::SEGMENT,
                },
                Message::Zero {
                    file: 1,
                    offset: layout::SEGMENT,
                    len: 10,
                },
                Message::SegmentDone {
                    file: 1,
                    segment: 0,
                    digest: [0; 32],
                },
                Message::SegmentDone {
                    file: 1,
                    segment: 1,
                    digest: [0; 32],
                },
                Message::SenderDone,
            ],
        ),
        (
            // Three segments of holes, one of data: the holes as one run.
            "holes_run",
            vec![
                root(),
                e(ent(1, "holes", EntryKind::File, 3 * layout::SEGMENT + 10)),
                Message::EndOfList,
                Message::Holes {
                    file: 1,
                    first: 0,
                    count: 2,
                },
                Message::Data {
                    file: 1,
                    offset: 3 * layout::SEGMENT,
                    data: b"tail!12345".to_vec(),
                },
                Message::SegmentDone {
                    file: 1,
                    segment: 3,
                    digest: [0; 32],
                },
                Message::Holes {
                    file: 1,
                    first: 2,
                    count: 1,
                },
                Message::SenderDone,
            ],
        ),
        (
            "file_failed",
            vec![
                root(),
                x10(),
                Message::EndOfList,
                Message::FileFailed {
                    file: 1,
                    error: "read x: gone".into(),
                },
                Message::SenderDone,
            ],
        ),
        (
            "fatal",
            vec![Message::Fatal {
                class: FatalClass::Protocol,
                error: "stop".into(),
            }],
        ),
    ];
    for (name, m) in hostile {
        v.push((t, name.into(), session(1, m)));
    }
    let bad_hello = vec![Message::Hello {
        version: 2,
        features: 0,
    }];
    v.push((t, "version_mismatch".into(), session(8, bad_hello)));
}
