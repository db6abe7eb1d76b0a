//! Sync sessions with a daemon striped over several connections
//! (`--streams N`), and joins that never complete left to expire without
//! holding anyone up.

use std::net::TcpStream;
use std::time::Duration;

use ferry_channel::{Join, Psk, Role};
use ferry_link::direct::handshake_tcp_join;

use crate::common::*;
use crate::{fixture, Daemon, KEY};

#[test]
fn push_and_pull_striped_through_a_daemon() {
    let (t, src, root, key) = fixture();
    std::fs::write(src.join("large.bin"), bytes(11, 24 << 20)).unwrap();
    let d = Daemon::start(&key, &["--root", p(&root)]);
    ferry_ok(&[
        "sync",
        "--streams",
        "4",
        &slash(&src),
        &d.url("vol/"),
        "--key-file",
        p(&key),
    ]);
    assert_same_tree(&src, &root.join("vol"));
    let back = t.path().join("back");
    ferry_ok(&[
        "sync",
        "--streams",
        "3",
        &d.url("vol/"),
        p(&back),
        "--key-file",
        p(&key),
    ]);
    assert_same_tree(&src, &back);
    let log = d.log();
    assert!(log.contains("push to \"vol/\" over 4 connections"), "{log}");
    assert!(log.contains("pull \"vol/\" over 3 connections"), "{log}");
}

#[test]
fn an_incomplete_striped_session_does_not_hold_up_others() {
    let (_t, src, root, key) = fixture();
    let d = Daemon::start(&key, &["--root", p(&root)]);
    // A client with the key opens connection 0 of 4 and nothing more.
    let s = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    let psk = Psk::new(KEY.as_bytes()).unwrap();
    let join = Join::fresh(4).unwrap();
    let held = handshake_tcp_join(
        s,
        &psk,
        Role::Initiator,
        Duration::from_secs(10),
        Some(&join),
    );
    assert!(held.is_ok(), "the first connection's handshake");
    // Others go on, over one connection and over several.
    ferry_ok(&["sync", &slash(&src), &d.url("a/"), "--key-file", p(&key)]);
    ferry_ok(&[
        "sync",
        "--streams",
        "2",
        &slash(&src),
        &d.url("b/"),
        "--key-file",
        p(&key),
    ]);
    assert_same_tree(&src, &root.join("a"));
    assert_same_tree(&src, &root.join("b"));
}

/// A stream pushed into the daemon and fetched back, each striped.
#[test]
fn streams_to_and_from_a_daemon_striped() {
    let (t, _src, root, key) = fixture();
    let d = Daemon::start(&key, &["--root", p(&root)]);
    let input = t.path().join("stream.in");
    std::fs::write(&input, bytes(5, 20 << 20)).unwrap();
    let sent = ferry_ok(&[
        "send",
        "--streams",
        "4",
        &d.url("s.bin"),
        p(&input),
        "--key-file",
        p(&key),
    ]);
    assert_eq!(sent["connections"], 4, "{sent}");
    assert!(std::fs::read(root.join("s.bin")).unwrap() == bytes(5, 20 << 20));
    let back = t.path().join("stream.back");
    let got = ferry_ok(&[
        "recv",
        "--streams",
        "3",
        "--from",
        &d.url("s.bin"),
        p(&back),
        "--key-file",
        p(&key),
    ]);
    assert_eq!(got["connections"], 3, "{got}");
    assert!(std::fs::read(&back).unwrap() == bytes(5, 20 << 20));
}
