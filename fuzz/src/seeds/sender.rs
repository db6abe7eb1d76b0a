//! Seeds of the targets that play a receiver against the real sender, and
//! of the file-list rules.

use ferry_link::layout;
use ferry_link::{FatalClass, Message, SignaturePart, WantMode};

use super::engine::{bodies, hello};
use super::Seed;
use crate::util::pack;

// ---------------------------------------------------------------- sender

pub fn sender_sequence(v: &mut Vec<Seed>) {
    use crate::sender_sequence::{session, source_files};
    let t = "sender_sequence";
    // Learn the ids the sender gives the source tree.
    let (said, _) = session(vec![hello(), Message::EndOfList], false, true);
    let id = |p: &str| {
        said.iter()
            .find_map(|m| match m {
                Message::Entry(x) if x.path == p.as_bytes() => Some(x.id),
                _ => None,
            })
            .unwrap_or_else(|| panic!("the sender did not list {p}"))
    };
    let content = |p: &str| {
        source_files()
            .into_iter()
            .find(|(q, _)| *q == p)
            .map(|(_, c)| c)
            .expect("a source file")
    };
    let done = || Message::ReceiverDone(Box::default());
    let want = |p: &str, mode| Message::Want { file: id(p), mode };
    let sig_msgs = |p: &str, basis: &[u8], parts: usize| -> Vec<Message> {
        let size = content(p).len() as u64;
        let bs = layout::delta_block(size);
        let (sig, _) = ferry_delta::signature_of_bytes(basis, bs);
        let n = sig.weak.len();
        let per = n.div_ceil(parts).max(1);
        let mut out = Vec::new();
        let mut i = 0;
        loop {
            let j = (i + per).min(n);
            out.push(Message::Signature(SignaturePart {
                file: id(p),
                block_size: bs as u32,
                basis_size: basis.len() as u64,
                first_block: i as u64,
                weak: sig.weak[i..j].to_vec(),
                strong: sig.strong[i..j].to_vec(),
                last: j == n,
            }));
            i = j;
            if i >= n {
                break;
            }
        }
        out
    };
    let seed = |flags: u8, m: Vec<Message>| pack(&[flags], &bodies(&m));
    let all_whole: Vec<Message> = ["a", "empty", "holes", "sub/c", "z"]
        .iter()
        .map(|p| want(p, WantMode::Whole))
        .chain([Message::EndOfList, done()])
        .collect();
    v.push((t, "want_all_whole".into(), seed(0, all_whole.clone())));
    v.push((t, "want_all_whole_in_process".into(), seed(2, all_whole)));
    // A sparse file asked for whole: its first two segments as `Holes`.
    let mut m = vec![want("holes", WantMode::Whole)];
    m.extend([Message::EndOfList, done()]);
    v.push((t, "want_holes_whole".into(), seed(0, m)));
    // Version 10: `Decided` forgets what was not asked for; a `Want`
    // after it, a `Decided` that goes back, and one far past the list.
    let m = vec![
        want("a", WantMode::Whole),
        Message::Decided { below: id("z") },
        want("z", WantMode::Whole),
        Message::Decided { below: u32::MAX },
        Message::EndOfList,
        done(),
    ];
    v.push((t, "decided_then_want".into(), seed(0, m)));
    let m = vec![
        Message::Decided { below: id("z") },
        want("sub/c", WantMode::Whole),
        Message::Decided { below: 1 },
        Message::EndOfList,
        done(),
    ];
    v.push((t, "want_after_decided".into(), seed(0, m)));
    let mut a_basis = content("a");
    a_basis[10..20].copy_from_slice(b"0123456789");
    let mut m = vec![want("a", WantMode::Delta)];
    m.extend(sig_msgs("a", &a_basis, 1));
    m.extend([Message::EndOfList, done()]);
    v.push((t, "delta_a".into(), seed(0, m)));
    let mut z_basis = content("z");
    z_basis.drain(90_000..90_100);
    let mut m = vec![want("z", WantMode::Delta)];
    m.extend(sig_msgs("z", &z_basis, 3));
    m.extend([Message::EndOfList, done()]);
    v.push((t, "delta_z".into(), seed(0, m)));
    let mut m = vec![want("z", WantMode::DeltaInPlace)];
    m.extend(sig_msgs("z", &content("z"), 2));
    m.extend([Message::EndOfList, done()]);
    v.push((t, "inplace_z".into(), seed(0, m)));
    let mut m = vec![want("a", WantMode::Delta)];
    m.extend(sig_msgs("a", &a_basis, 1));
    m.extend([want("a", WantMode::Whole), Message::EndOfList, done()]);
    v.push((t, "delta_then_whole".into(), seed(0, m)));
    // Resumes: the receiver holds segment 0 with its true digest (nothing
    // is sent but SegmentDone), with another digest (sent whole), or lists
    // nothing (sent whole); then the same turned whole.
    let seg_digest = |p: &str| {
        let c = content(p);
        let mut h = ferry_link::layout::SegmentHasher::new(layout::grid_block(c.len() as u64));
        h.data(&c);
        h.finish().0
    };
    let have = |p: &str, kept: Vec<(u64, [u8; 32])>| {
        Message::Have(ferry_link::HavePart {
            file: id(p),
            upto: 1,
            kept,
        })
    };
    // Checks (version 11) go as resumes, but are final: asked again
    // whole, the sender refuses.
    let (resume, check) = (WantMode::Resume, WantMode::Check);
    for (name, mode, kept, flags) in [
        ("resume_kept", resume, vec![(0, seg_digest("z"))], 0),
        ("resume_kept_in_process", resume, vec![(0, seg_digest("z"))], 2),
        ("resume_differs", resume, vec![(0, [7; 32])], 0),
        ("resume_nothing", resume, vec![], 0),
        ("check_same", check, vec![(0, seg_digest("z"))], 0),
        ("check_same_in_process", check, vec![(0, seg_digest("z"))], 2),
        ("check_differs", check, vec![(0, [7; 32])], 0),
    ] {
        let m = vec![want("z", mode), have("z", kept), Message::EndOfList, done()];
        v.push((t, name.into(), seed(flags, m)));
    }
    for (name, mode) in [("resume_then_whole", resume), ("check_then_whole", check)] {
        let m = vec![
            want("z", mode),
            have("z", vec![(0, [7; 32])]),
            want("z", WantMode::Whole),
            Message::EndOfList,
            done(),
        ];
        v.push((t, name.into(), seed(0, m)));
    }
    let hostile: Vec<(&str, Vec<Message>)> = vec![
        (
            "want_unknown",
            vec![Message::Want {
                file: 999,
                mode: WantMode::Whole,
            }],
        ),
        (
            "want_twice",
            vec![want("a", WantMode::Whole), want("a", WantMode::Whole)],
        ),
        ("signature_unasked", sig_msgs("a", &a_basis, 1)),
        ("bad_block_size", {
            let mut m = vec![want("z", WantMode::Delta)];
            m.push(Message::Signature(SignaturePart {
                file: id("z"),
                block_size: 1,
                basis_size: 1 << 40,
                first_block: 0,
                weak: vec![],
                strong: vec![],
                last: true,
            }));
            m
        }),
        ("done_early", vec![done()]),
        ("have_unasked", vec![have("a", vec![])]),
        (
            "have_past_the_end",
            vec![want("a", WantMode::Resume), {
                let mut h = have("a", vec![]);
                if let Message::Have(p) = &mut h {
                    p.upto = 5;
                }
                h
            }],
        ),
        (
            "fatal",
            vec![Message::Fatal {
                class: FatalClass::Usage,
                error: "no".into(),
            }],
        ),
    ];
    for (name, m) in hostile {
        v.push((t, name.into(), seed(0, m)));
    }
    v.push((
        t,
        "version_mismatch".into(),
        seed(
            1,
            vec![Message::Hello {
                version: 9,
                features: 0,
            }],
        ),
    ));
}

// ---------------------------------------------------------------- listcheck

pub fn listcheck(v: &mut Vec<Seed>) {
    let t = "listcheck";
    // (kind: 0 file 1 dir 2 symlink 3 hard link | id step << 2, path
    // index, link_to, size); see crate::listcheck::PATHS.
    let list = |flags: u8, entries: &[[u8; 4]]| {
        let mut b = vec![flags];
        for x in entries {
            b.extend_from_slice(x);
        }
        b
    };
    let seeds: Vec<(&str, u8, Vec<[u8; 4]>)> = vec![
        (
            "tree",
            0,
            vec![
                [1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 4, 0, 5],
                [2, 3, 0, 0],
                [3, 5, 3, 0],
            ],
        ),
        (
            "merge",
            0,
            vec![
                [1, 0, 0, 0],
                [1, 1, 0, 0],
                [1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 4, 0, 9],
            ],
        ),
        ("dotdot", 0, vec![[1, 0, 0, 0], [0, 9, 0, 5], [0, 12, 0, 5]]),
        ("dup", 0, vec![[1, 1, 0, 0], [2, 1, 0, 0], [0, 4, 0, 5]]),
        (
            "below_symlink",
            0,
            vec![[1, 0, 0, 0], [2, 1, 0, 0], [0, 4, 0, 5]],
        ),
        (
            "hardlink_forward",
            0,
            vec![[1, 0, 0, 0], [3, 1, 3, 0], [0, 2, 0, 5]],
        ),
        (
            "ids_decrease",
            0,
            vec![[1, 0, 0, 0], [0x0c | 1, 1, 0, 0], [0x08, 2, 0, 5]],
        ),
        ("too_big", 0, vec![[0, 1, 0, 1], [0, 2, 0, 2]]),
        ("single_file", 1, vec![[0, 1, 0, 5], [0, 2, 0, 5]]),
        ("single_after_first", 4, vec![[0, 1, 0, 5], [1, 2, 0, 0]]),
        (
            "pull_top",
            2,
            vec![[1, 1, 0, 0], [0, 4, 0, 5], [0, 2, 0, 5], [1, 0, 0, 0]],
        ),
    ];
    for (name, flags, entries) in seeds {
        v.push((t, name.into(), list(flags, &entries)));
    }
    v.push((
        t,
        "raw_path".into(),
        vec![0, 1, 0xff, 3, b'x', b'/', b'y', 0, 7],
    ));
}
