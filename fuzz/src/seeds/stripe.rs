//! Seeds of `stripe`: well-formed interleavings over 2 to 4 connections,
//! and the ways a stripe goes wrong (a chunk again, a gap, a cut header,
//! a zero length).

use super::Seed;
use crate::util::pack;

/// A record putting chunk `seq` with `data` on `lane`.
fn chunk(lane: u8, seq: u8, data: &[u8]) -> Vec<u8> {
    [&[lane, 0, seq][..], data].concat()
}

/// A record putting raw bytes on `lane`.
fn raw(lane: u8, bytes: &[u8]) -> Vec<u8> {
    [&[lane, 1][..], bytes].concat()
}

pub fn stripe(v: &mut Vec<Seed>) {
    let t = "stripe";
    let seeds: Vec<(&str, u8, Vec<Vec<u8>>)> = vec![
        (
            "round_robin",
            0,
            (0..8).map(|i| chunk(i % 2, i, &[b'a' + i; 40])).collect(),
        ),
        (
            "uneven_four",
            2,
            vec![
                chunk(3, 0, b"first "),
                chunk(1, 1, b"second "),
                chunk(1, 2, b"third "),
                chunk(0, 3, b"fourth"),
            ],
        ),
        ("again", 0, vec![chunk(0, 0, b"x"), chunk(1, 0, b"x")]),
        ("gap", 1, vec![chunk(0, 0, b"x"), chunk(2, 2, b"z")]),
        ("backwards", 0, vec![chunk(0, 1, b"y"), chunk(0, 0, b"x")]),
        ("cut_header", 0, vec![chunk(0, 0, b"x"), raw(1, &[0, 0, 0, 0, 0, 0, 0, 1, 0])]),
        ("zero_length", 0, vec![raw(0, &[0; 12])]),
        ("cut_data", 0, vec![raw(1, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, b'a'])]),
    ];
    for (name, n, recs) in seeds {
        v.push((t, name.into(), pack(&[n], &recs)));
    }
}
