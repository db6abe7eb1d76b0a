use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use ferry_channel::{ChannelError, Psk, Role};

use super::*;

const KEY: &str = "0123456789abcdef0123456789abcdef";

fn psk(k: &str) -> Psk {
    Psk::new(k.as_bytes()).unwrap()
}

fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// ssh's two pipes as the client and the server see them.
struct Pipes {
    client_in: UnixStream,
    client_out: UnixStream,
    server_in: UnixStream,
    server_out: UnixStream,
}

/// Dial `d` over the client's pipes to 127.0.0.1, waiting `wait` for the
/// offer.
fn dial(
    d: Dialect,
    cin: &mut UnixStream,
    cout: &mut UnixStream,
    wait: Option<Duration>,
) -> Result<Dialled, DialError> {
    let dial = Dial {
        dialect: d,
        host: "127.0.0.1",
        key: Some(KEY),
        wait,
        try_direct: true,
    };
    dial.run(cin, cout)
}

fn pipes() -> Pipes {
    let (client_in, server_in) = UnixStream::pair().unwrap();
    let (server_out, client_out) = UnixStream::pair().unwrap();
    Pipes {
        client_in,
        client_out,
        server_in,
        server_out,
    }
}

#[test]
fn lines_read_byte_by_byte_and_no_further() {
    let mut r: &[u8] = b"FERRY-PORT 9\nrest";
    assert_eq!(
        read_line(&mut r, 64).unwrap().as_deref(),
        Some("FERRY-PORT 9")
    );
    assert_eq!(r, b"rest");
    assert_eq!(read_line(&b"\n"[..], 64).unwrap().as_deref(), Some(""));
    assert_eq!(read_line(&b""[..], 64).unwrap(), None);
    assert_eq!(
        read_line(&b"abcdef"[..], 3).unwrap().as_deref(),
        Some("abc")
    );
    let (mut a, _b) = UnixStream::pair().unwrap();
    let t = Instant::now();
    let e = read_line_within(&mut a, 64, Some(Duration::from_millis(100))).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn offers_and_answers_of_both_dialects() {
    for (d, port_line, key) in [
        (Dialect::Sync, "FERRY-DIRECT 4711 k3y", Some("k3y")),
        (Dialect::Pipe, "FERRY-PORT 4711", None),
    ] {
        // (`offer` adds $SSH_CONNECTION's address when ferry runs under ssh.)
        assert_eq!(d.offer_line(4711, key, None), port_line);
        let o = d.parse_offer(port_line).unwrap();
        assert_eq!((o.port, o.key.as_deref(), o.addr), (4711, key, None));
        // The address ssh reached the server at, v4 or v6.
        for ip in ["10.1.2.3", "fe80::1"] {
            let a: std::net::IpAddr = ip.parse().unwrap();
            let line = d.offer_line(4711, key, Some(a));
            assert_eq!(line, format!("{port_line} {ip}"));
            assert_eq!(d.parse_offer(&line).unwrap().addr, Some(a));
            assert!(d.parse_offer(&format!("{port_line} box")).is_err());
            assert!(d.parse_offer(&format!("{line} more")).is_err());
        }
        for a in [Answer::Direct, Answer::ViaSsh] {
            if let Some(line) = d.answer_line(a) {
                let input = format!("{line}\nprotocol bytes");
                assert_eq!(read_answer(d, input.as_bytes()).unwrap(), Ok(a));
            }
        }
        assert_eq!(
            read_answer(d, &b"hello\n"[..]).unwrap(),
            Err("hello".into())
        );
    }
    let e = Dialect::Pipe.parse_offer("Welcome to box").unwrap_err();
    assert_eq!(e.said(), "Welcome to box");
    assert!(matches!(
        Dialect::Sync.parse_offer("FERRY-DIRECT 99999 k"),
        Err(OfferError::BadPort { .. })
    ));
    assert!(Dialect::Sync.parse_offer("FERRY-PORT 1").is_err());
    assert!(Dialect::Pipe.parse_offer("FERRY-DIRECT 1 k").is_err());
}

/// The client dials, the server accepts, both prove the key: in each
/// dialect, and then through ssh when the port cannot be reached.
#[test]
fn dial_meets_accept_or_falls_back_to_ssh() {
    for d in [Dialect::Sync, Dialect::Pipe] {
        let mut p = pipes();
        let (l, port) = listener();
        let server = thread::spawn(move || {
            if d == Dialect::Pipe {
                assert_eq!(read_line(&p.server_in, 64).unwrap().as_deref(), Some(KEY));
            }
            offer(d, &mut p.server_out, port, Some(KEY)).unwrap();
            if d == Dialect::Pipe {
                assert_eq!(read_answer(d, &p.server_in).unwrap(), Ok(Answer::Direct));
            }
            match accept_authenticated(&l, &psk(KEY), None, &mut |_, _| {}, &|| false) {
                Ok(Accepted::Peer(_, conn)) => {
                    let mut b = [0u8; 2];
                    conn.reader(None).unwrap().read_exact(&mut b).unwrap();
                    b
                }
                _ => panic!("no peer"),
            }
        });
        let wait = Some(Duration::from_secs(10));
        let dialled = dial(d, &mut p.client_in, &mut p.client_out, wait).unwrap();
        assert_eq!(dialled.offer.port, port);
        let Route::Direct(s) = dialled.route else {
            panic!("not direct")
        };
        let (_, mut s) = handshake_tcp(s, &psk(KEY), Role::Initiator, HANDSHAKE_TIMEOUT).unwrap();
        s.write_all(b"ok").unwrap();
        assert_eq!(&server.join().unwrap(), b"ok");
    }
    for d in [Dialect::Sync, Dialect::Pipe] {
        let mut p = pipes();
        let (l, port) = listener();
        drop(l);
        offer(d, &mut p.server_out, port, Some(KEY)).unwrap();
        let dialled = dial(d, &mut p.client_in, &mut p.client_out, None).unwrap();
        let Route::ViaSsh(Some(why)) = dialled.route else {
            panic!("not via ssh")
        };
        assert!(why
            .to_string()
            .starts_with(&format!("direct connection to 127.0.0.1:{port} failed (")));
        if d == Dialect::Pipe {
            assert_eq!(read_line(&p.server_in, 64).unwrap().as_deref(), Some(KEY));
        }
        assert_eq!(read_answer(d, &p.server_in).unwrap(), Ok(Answer::ViaSsh));
    }
}

#[test]
fn dial_says_why_the_offer_did_not_come() {
    let mut p = pipes();
    p.server_out.write_all(b"Last login: yesterday\n").unwrap();
    let e = dial(Dialect::Sync, &mut p.client_in, &mut p.client_out, None);
    assert!(
        matches!(e, Err(DialError::Offer(OfferError::NotOffered(ref l))) if l == "Last login: yesterday")
    );
    drop(p.server_out);
    let e = dial(Dialect::Sync, &mut p.client_in, &mut p.client_out, None);
    assert!(matches!(e, Err(DialError::Offer(OfferError::Closed))));
    let mut p = pipes();
    let wait = Some(Duration::from_millis(100));
    let e = dial(Dialect::Pipe, &mut p.client_in, &mut p.client_out, wait);
    assert!(matches!(e, Err(DialError::Offer(OfferError::TimedOut(_)))));
    drop(p.server_in);
    let e = dial(Dialect::Pipe, &mut p.client_in, &mut p.client_out, wait);
    assert!(matches!(e, Err(DialError::KeyNotTaken(_))));
}

/// A client that connects to `port` and proves `key`.
fn client(port: u16, key: &str) -> Result<(), ChannelError> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    handshake_tcp(s, &psk(key), Role::Initiator, HANDSHAKE_TIMEOUT).map(|_| ())
}

/// Twenty connections that say nothing (more than the handshakes run at
/// once) do not lock the client out; one with the wrong key is refused.
#[test]
fn silent_connections_and_a_wrong_key_do_not_lock_the_client_out() {
    let (l, port) = listener();
    let silent: Vec<_> = (0..20)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let wrong = thread::spawn(move || {
        assert!(client(port, "another key, long enough").is_err());
        client(port, KEY)
    });
    let mut refused = Vec::new();
    let res = accept_authenticated(
        &l,
        &psk(KEY),
        Some(Duration::from_secs(20)),
        &mut |_, e| refused.push(matches!(e, ChannelError::WrongKey)),
        &|| false,
    );
    assert!(matches!(res, Ok(Accepted::Peer(..))));
    wrong.join().unwrap().unwrap();
    assert!(refused.contains(&true));
    drop(silent);
}

#[test]
fn the_wait_ends_when_told_or_in_time() {
    let (l, port) = listener();
    let t = Instant::now();
    let res = accept_authenticated(&l, &psk(KEY), None, &mut |_, _| {}, &|| {
        t.elapsed() > Duration::from_millis(100)
    });
    assert!(matches!(res, Ok(Accepted::Stopped)));
    let wrong = thread::spawn(move || {
        let _ = client(port, "another key, long enough");
    });
    let res = accept_authenticated(
        &l,
        &psk(KEY),
        Some(Duration::from_secs(2)),
        &mut |_, _| {},
        &|| false,
    );
    wrong.join().unwrap();
    match res {
        Err(
            e @ AcceptError::NoPeer {
                wrong_key: true, ..
            },
        ) => assert!(!e.retryable()),
        _ => panic!("must time out with the wrong key"),
    }
}
