//! Every message round-trips; the decoder's limits and refusals.

use super::*;
use proptest::prelude::*;

fn roundtrip(m: Message) {
    let mut v = Vec::new();
    encode(&m, &mut v);
    // The 8-byte frame header and the 4-byte check around the body.
    assert_eq!(encoded_len(&m), v.len() + 12);
    assert_eq!(decode(&v).unwrap(), m);
}

#[test]
fn change_codes_are_printable_and_names_bounded() {
    let mut v = Vec::new();
    encode(
        &Message::Change(Box::new(Change {
            code: *b">f+++++++++",
            ..Change::default()
        })),
        &mut v,
    );
    // The body: the tag, then the code.
    let mut body = v;
    body[1] = 0x1b;
    assert_eq!(decode(&body), Err(DecodeError::BadValue("change code")));
    let long = Entry {
        owner: vec![b'a'; MAX_NAME + 1],
        ..Entry::default()
    };
    let mut v = Vec::new();
    encode(&Message::Entry(Box::new(long)), &mut v);
    assert_eq!(decode(&v), Err(DecodeError::TooLong("owner name")));
}

#[test]
fn holes_name_at_least_one_segment_and_stay_in_range() {
    let bad = |first, count| {
        let mut v = Vec::new();
        encode(
            &Message::Holes {
                file: 1,
                first,
                count,
            },
            &mut v,
        );
        decode(&v)
    };
    assert_eq!(bad(4, 0), Err(DecodeError::BadValue("count")));
    assert_eq!(bad(u32::MAX, 1), Err(DecodeError::BadValue("count")));
    assert_eq!(bad(1, u32::MAX), Err(DecodeError::BadValue("count")));
    assert!(bad(0, u32::MAX).is_ok());
}

#[test]
fn every_message_roundtrips() {
    roundtrip(Message::Hello {
        version: 1,
        features: u64::MAX,
    });
    roundtrip(Message::Entry(Box::new(Entry {
        id: 7,
        path: b"a/b c".to_vec(),
        kind: Some(EntryKind::Symlink),
        mode: 0o120777,
        uid: 1000,
        gid: 1000,
        size: 0,
        mtime: -5,
        mtime_nsec: 999_999_999,
        target: b"../x".to_vec(),
        link_to: 0,
        xattrs: vec![(b"user.k".to_vec(), vec![0, 1, 2])],
        digest: Some([9; 32]),
        owner: b"alice".to_vec(),
        group: b"staff".to_vec(),
        rdev: 0x0801,
    })));
    roundtrip(Message::Change(Box::new(Change {
        code: *b">f.st......",
        path: b"d/b".to_vec(),
        to: Vec::new(),
    })));
    roundtrip(Message::Change(Box::new(Change {
        code: *b"*deleting  ",
        path: b"gone/".to_vec(),
        to: b"x".to_vec(),
    })));
    roundtrip(Message::EndOfList);
    roundtrip(Message::Decided { below: 0 });
    roundtrip(Message::Decided { below: u32::MAX });
    roundtrip(Message::Want {
        file: 3,
        mode: WantMode::Delta,
    });
    roundtrip(Message::Signature(SignaturePart {
        file: 1,
        block_size: 8192,
        basis_size: 1 << 30,
        first_block: 12,
        weak: vec![1, 2],
        strong: vec![[3; 16], [4; 16]],
        last: true,
    }));
    roundtrip(Message::Data {
        file: 1,
        offset: 1 << 40,
        data: vec![1; 1000],
    });
    roundtrip(Message::Zero {
        file: 1,
        offset: 4096,
        len: 1 << 33,
    });
    roundtrip(Message::Holes {
        file: 3,
        first: 7,
        count: 131_065,
    });
    roundtrip(Message::Unused {
        file: 1,
        offset: 4096,
        len: 1 << 33,
    });
    roundtrip(Message::Copy {
        file: 2,
        offset: 0,
        basis_offset: 7,
        len: 8192,
    });
    roundtrip(Message::SegmentDone {
        file: 4,
        segment: 2,
        digest: [1; 32],
    });
    roundtrip(Message::FileFailed {
        file: 4,
        error: "gone".into(),
    });
    roundtrip(Message::FileChanged {
        file: 5,
        error: "src/log: file changed while being read".into(),
    });
    roundtrip(Message::SenderDone);
    roundtrip(Message::Want {
        file: 4,
        mode: WantMode::Resume,
    });
    roundtrip(Message::Want {
        file: 4,
        mode: WantMode::Check,
    });
    roundtrip(Message::Have(HavePart {
        file: 4,
        upto: 9,
        kept: vec![(0, [1; 32]), (3, [2; 32]), (8, [3; 32])],
    }));
    roundtrip(Message::Have(HavePart {
        file: 4,
        upto: 1 << 40,
        kept: vec![],
    }));
    roundtrip(Message::ReceiverDone(Box::new(ReceiverReport {
        files_total: 1,
        files_transferred: 2,
        files_delta: 3,
        files_deleted: 4,
        files_failed: 5,
        bytes_total: 6,
        bytes_transferred: 7,
        bytes_written: 8,
        bytes_matched: 9,
        dirs_total: 10,
        delete_skipped: 1,
        delta_mismatch: 2,
        bytes_resumed: 1 << 33,
        files_vanished: 3,
        deletes_held: 4,
        errors: vec!["x".into()],
    })));
    for class in [
        FatalClass::Io,
        FatalClass::Protocol,
        FatalClass::Connection,
        FatalClass::Usage,
        FatalClass::Interrupted,
    ] {
        roundtrip(Message::Fatal {
            class,
            error: "no".into(),
        });
    }
    assert!(matches!(
        decode(&[tag::FATAL, 5, 0]),
        Err(DecodeError::BadValue("class"))
    ));
    roundtrip(Message::Compressed(CompressedData {
        file: 3,
        offset: 1 << 20,
        codec: 2,
        stream: 7,
        level: -5,
        raw_len: 4096,
        data: vec![1, 2, 3],
    }));
}

#[test]
fn have_segments_must_increase_below_upto() {
    let bad = |kept: Vec<(u64, [u8; 32])>, upto| {
        let mut b = Vec::new();
        encode(
            &Message::Have(HavePart {
                file: 1,
                upto,
                kept,
            }),
            &mut b,
        );
        decode(&b).is_err()
    };
    assert!(bad(vec![(2, [0; 32]), (2, [0; 32])], 9), "repeated");
    assert!(bad(vec![(3, [0; 32]), (2, [0; 32])], 9), "decreasing");
    assert!(bad(vec![(9, [0; 32])], 9), "at upto");
    assert!(!bad(vec![(8, [0; 32])], 9));
}

#[test]
fn lying_lengths_are_refused_without_allocating() {
    // Signature claiming 65536 blocks in a 20-byte frame.
    let mut v = vec![5u8, 1, 1, 0, 0, 0];
    v.extend_from_slice(&[0x80, 0x80, 0x04]);
    assert!(matches!(decode(&v), Err(DecodeError::TooLong(_))));
    // Data longer than the frame.
    let v = vec![6u8, 1, 0, 0x80, 0x80, 0x80, 0x08];
    assert_eq!(decode(&v), Err(DecodeError::TooLong("data")));
    assert_eq!(decode(&[]), Err(DecodeError::Truncated));
    assert_eq!(decode(&[200]), Err(DecodeError::UnknownTag(200)));
    assert_eq!(decode(&[3, 0]), Err(DecodeError::Trailing(1)));
}

proptest! {
    #![proptest_config(proptest::test_runner::Config { failure_persistence: None, ..proptest::test_runner::Config::default() })]
    #[test]
    fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&b);
    }

    #[test]
    fn data_roundtrips(file in any::<u32>(), offset in 0u64..u64::MAX / 2,
                       data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        roundtrip(Message::Data { file, offset, data });
    }

    #[test]
    fn entries_roundtrip(id in any::<u32>(), path in proptest::collection::vec(any::<u8>(), 0..300),
                         mtime in any::<i64>(), nsec in 0u32..1_000_000_000, size in any::<u64>()) {
        roundtrip(Message::Entry(Box::new(Entry { id, path, mtime, mtime_nsec: nsec, size,
            kind: Some(EntryKind::File), ..Default::default() })));
    }
}
