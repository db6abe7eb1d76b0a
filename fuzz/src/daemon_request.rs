//! `daemon_request`: what `ferry serve --listen` decodes from a client that
//! proved the key ([`ferry_link::daemon`]'s request and answer codecs, and
//! [`ferry_core::remote::daemon::policy::check`], the whitelist the
//! arguments then go through).
//!
//! Input: `mode`, then bytes. Mode bit 0: the bytes are a whole request
//! (header and body, as on the wire); otherwise a body, wrapped in a true
//! header so mutations reach the body decoder. Bit 1: the bytes are also
//! read as an answer.
//!
//! Asserted: a header never announces more than `MAX_REQUEST`; whatever
//! decodes re-encodes to exactly the bytes it came from (one encoding),
//! within the limits on count and text (no NUL); an argument vector the
//! policy accepts starts with `serve`, holds `--`, and before it only
//! flags without a path on the daemon's host; an answer that decodes keeps
//! its text within `MAX_TEXT` and re-encodes to its bytes.

use ferry_core::remote::daemon::policy;
use ferry_link::daemon::*;

pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let wire = if mode & 1 != 0 {
        rest.to_vec()
    } else {
        let mut w = REQUEST_MAGIC.to_vec();
        w.extend_from_slice(&(rest.len() as u32).to_be_bytes());
        w.extend_from_slice(rest);
        w
    };
    if let Some(head) = wire.get(..REQUEST_HEAD) {
        let head: [u8; REQUEST_HEAD] = head.try_into().expect("head length");
        if let Ok(n) = request_body_len(&head) {
            assert!(n <= MAX_REQUEST);
            if let Some(body) = wire.get(REQUEST_HEAD..REQUEST_HEAD + n) {
                if let Ok(args) = decode_request_body(body) {
                    assert!(args.len() <= MAX_ARGS);
                    assert!(args.iter().all(|a| !a.contains('\0')));
                    let again = encode_request(&args).expect("decoded args re-encode");
                    assert_eq!(&again[..], &wire[..REQUEST_HEAD + n]);
                    check_policy(&args);
                }
            }
        }
    }
    if mode & 2 != 0 {
        if let Some(head) = rest.get(..ANSWER_HEAD) {
            let head: [u8; ANSWER_HEAD] = head.try_into().expect("head length");
            if let Ok((status, n)) = answer_head(&head) {
                assert!(n <= MAX_TEXT);
                if let Some(text) = rest.get(ANSWER_HEAD..ANSWER_HEAD + n) {
                    if let Ok(t) = answer_text(text) {
                        assert_eq!(&encode_answer(status, &t)[..], &rest[..ANSWER_HEAD + n]);
                    }
                }
            }
        }
    }
}

/// Options that name something on the daemon's host, or that the daemon
/// must not take from a client.
const NEVER: &[&str] = &[
    "--link-dest",
    "--sig-cache",
    "--partial-dir",
    "--exclude-from",
    "--include-from",
    "--files-from",
    "--listen",
    "--root",
    "--device",
    "--key-file",
    "--termination-log",
    "--direct",
];

fn check_policy(args: &[String]) {
    if policy::check(args).is_err() {
        return;
    }
    assert_eq!(args.first().map(String::as_str), Some("serve"));
    let end = args.iter().position(|a| a == "--").expect("accepted without --");
    for a in &args[1..end] {
        assert!(a.starts_with("--"), "accepted {a:?}");
        let name = a.split('=').next().unwrap_or(a);
        assert!(!NEVER.contains(&name), "accepted {a:?}");
        if let Some(rule) = a.strip_prefix("--filter=") {
            assert!(rule == "!" || rule.starts_with("+ ") || rule.starts_with("- "), "accepted {a:?}");
        }
    }
}
