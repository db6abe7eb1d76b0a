//! Hostile-receiver tests: ferry's real sender against a receiver played
//! by hand that asks for a delta and then breaks off (hangs up, reports,
//! sends a bad or partial signature, changes its mind). Whatever it does,
//! the sender returns, within a deadline, with an error unless it was sent
//! a report; it never waits for ever on work the receiver will not finish.
//! (The `sender_sequence` fuzz target tries many more orders.)

use std::fs;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use ferry_core::sender::run_sender;
use ferry_core::{SourceSpec, Stats, SyncOptions};
use ferry_link::{layout, Endpoint, Message, ReceiverReport, SignaturePart, WantMode};

/// Far longer than any of these sessions takes when it ends.
const DEADLINE: Duration = Duration::from_secs(30);

/// A source big enough to be pre-hashed while its signature comes.
const BIG: u64 = 3 * layout::SEGMENT + 12345;

/// What the receiver does once the list is whole, given the big file's id.
type Script = fn(u32) -> Vec<Message>;

fn want(file: u32, mode: WantMode) -> Message {
    Message::Want { file, mode }
}

/// The first part of a signature of an old copy as big as the source,
/// on the source's delta grid: one block of it, not the last part.
fn sig_part(file: u32, last: bool, block_size: u64) -> Message {
    Message::Signature(SignaturePart {
        file,
        block_size: block_size as u32,
        basis_size: BIG,
        first_block: 0,
        weak: vec![1],
        strong: vec![[7; 16]],
        last,
    })
}

/// Run the sender against a receiver that says Hello, waits for the whole
/// list, then sends what `script` gives and hangs up. Returns what the
/// sender returned (`Err` text for an error), or panics when it hangs.
fn against(label: &str, script: Script) -> Result<ReceiverReport, String> {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    fs::create_dir(&src).expect("src");
    let content: Vec<u8> = (0..BIG).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(src.join("big"), &content).expect("big");
    fs::write(src.join("small"), b"small").expect("small");
    let specs = vec![SourceSpec {
        path: src.clone(),
        name: Vec::new(),
        follow: false,
    }];
    let opts = SyncOptions {
        threads: 1,
        ..Default::default()
    };
    let (a, b) = ferry_link::in_process();
    let (done_tx, done_rx) = mpsc::channel();
    let sender = thread::spawn(move || {
        let r = run_sender(a, &specs, &opts, &Stats::default(), false);
        let _ = done_tx.send(());
        r
    });
    let Endpoint { tx, rx, .. } = b;
    tx.send(Message::Hello {
        version: ferry_link::PROTOCOL_VERSION,
        features: ferry_link::features::ALL,
    })
    .expect("hello");
    let mut big = None;
    while let Ok(m) = rx.recv() {
        match m {
            Message::Entry(e) if e.path == b"big" => big = Some(e.id),
            Message::EndOfList => break,
            _ => {}
        }
    }
    let big = big.unwrap_or_else(|| panic!("{label}: the sender did not list big"));
    // Keep draining what the sender sends, as a receiver reads its link.
    let drain = thread::spawn(move || while rx.recv().is_ok() {});
    for m in script(big) {
        if tx.send(m).is_err() {
            break;
        }
    }
    drop(tx);
    match done_rx.recv_timeout(DEADLINE) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{label}: the sender HUNG (no result after {DEADLINE:?})")
        }
    }
    let r = sender
        .join()
        .unwrap_or_else(|_| panic!("{label}: the sender panicked"));
    let _ = drain.join();
    assert_eq!(
        fs::read(src.join("big")).ok(),
        Some(content),
        "{label}: the source changed"
    );
    r.map_err(|e| e.to_string())
}

fn grid() -> u64 {
    layout::delta_block(BIG)
}

#[test]
fn a_receiver_that_breaks_off_a_delta_never_hangs_the_sender() {
    let scripts: [(&str, Script); 7] = [
        ("want delta, hang up", |f| vec![want(f, WantMode::Delta)]),
        ("want delta in place, hang up", |f| {
            vec![want(f, WantMode::DeltaInPlace)]
        }),
        ("want delta, part of a signature, hang up", |f| {
            vec![want(f, WantMode::Delta), sig_part(f, false, grid())]
        }),
        ("want delta, a signature off the grid", |f| {
            vec![want(f, WantMode::Delta), sig_part(f, false, grid() * 2)]
        }),
        ("want delta, then whole, hang up", |f| {
            vec![want(f, WantMode::Delta), want(f, WantMode::Whole)]
        }),
        ("want delta, whole, then the signature's last part", |f| {
            vec![
                want(f, WantMode::Delta),
                sig_part(f, false, grid()),
                want(f, WantMode::Whole),
                sig_part(f, true, grid()),
            ]
        }),
        ("want delta, unexpected message", |f| {
            vec![want(f, WantMode::Delta), Message::SenderDone]
        }),
    ];
    for (label, script) in scripts {
        let r = against(label, script);
        assert!(r.is_err(), "{label}: the sender succeeded: {r:?}");
    }
}

#[test]
fn a_report_before_the_end_of_requests_ends_the_sender() {
    let report = ReceiverReport {
        files_total: 2,
        ..Default::default()
    };
    let r = against("want delta, part of a signature, report", |f| {
        vec![
            want(f, WantMode::Delta),
            sig_part(f, false, grid()),
            Message::ReceiverDone(Box::new(ReceiverReport {
                files_total: 2,
                ..Default::default()
            })),
        ]
    });
    assert_eq!(r, Ok(report));
}
