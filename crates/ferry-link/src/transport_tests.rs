use super::*;
use crate::MAGIC;
use std::os::unix::net::UnixStream;

#[test]
fn in_process_counts_encoded_bytes() {
    let (a, b) = in_process();
    let m = Message::Data {
        file: 1,
        offset: 0,
        data: vec![7; 100],
    };
    let n = codec::encoded_len(&m) as u64;
    a.tx.send(m.clone()).unwrap();
    assert_eq!(b.rx.recv().unwrap(), m);
    assert_eq!(a.sent.get(), n);
    assert_eq!(b.received.get(), n);
    drop(a);
    assert_eq!(b.rx.recv(), Err(LinkError::Closed));
}

#[test]
fn a_batch_arrives_in_order_and_counted_in_process_and_over_a_stream() {
    let batch = |lo: u32| {
        (lo..lo + 300)
            .map(|below| Message::Decided { below })
            .collect::<Vec<_>>()
    };
    let n: u64 = batch(0).iter().map(|m| codec::encoded_len(m) as u64).sum();
    let (a, b) = in_process();
    a.tx.send_batch(batch(0)).unwrap();
    a.tx.send_batch(Vec::new()).unwrap();
    a.tx.send(Message::EndOfList).unwrap();
    for m in batch(0) {
        assert_eq!(b.rx.recv().unwrap(), m);
    }
    assert_eq!(b.rx.recv().unwrap(), Message::EndOfList);
    assert_eq!(
        a.sent.get(),
        n + codec::encoded_len(&Message::EndOfList) as u64
    );
    let (a_out, b_in) = UnixStream::pair().unwrap();
    let (b_out, a_in) = UnixStream::pair().unwrap();
    let a = stream_link(a_in, a_out);
    let b = stream_link(b_in, b_out);
    a.tx.send_batch(batch(0)).unwrap();
    a.tx.send_batch(batch(300)).unwrap();
    a.tx.send_batch(vec![Message::EndOfList]).unwrap();
    for m in batch(0).into_iter().chain(batch(300)) {
        assert_eq!(b.rx.recv().unwrap(), m);
    }
    assert_eq!(b.rx.recv().unwrap(), Message::EndOfList);
}

#[test]
fn data_and_the_message_behind_it_are_one_hand_over() {
    let data = |k: u64| Message::Data {
        file: 3,
        offset: k << 20,
        data: repeating_text(k),
    };
    let done = Message::SegmentDone {
        file: 3,
        segment: 0,
        digest: [9; 32],
    };
    let (a, b) = in_process();
    assert!(!b.rx.ready());
    a.tx.send_then(data(0), done.clone()).unwrap();
    // One queue slot, so one wake-up of a waiting receiver.
    assert_eq!(b.rx.rx.len(), 1);
    assert!(b.rx.ready());
    assert_eq!(b.rx.recv().unwrap(), data(0));
    // The rest of the batch is at hand.
    assert!(b.rx.ready());
    assert_eq!(b.rx.recv().unwrap(), done);
    assert!(!b.rx.ready());
    assert_eq!(
        a.sent.get(),
        (codec::encoded_len(&data(0)) + codec::encoded_len(&done)) as u64
    );
    // Compressed, the data still goes first and decodes as sent.
    let (a, b) = compressed_pair(1);
    a.tx.send_then(data(1), done.clone()).unwrap();
    a.tx.send_then(data(2), done.clone()).unwrap();
    a.tx.send(Message::EndOfList).unwrap();
    for k in 1..3 {
        assert_eq!(b.rx.recv().unwrap(), data(k));
        assert_eq!(b.rx.recv().unwrap(), done);
    }
    assert_eq!(b.rx.recv().unwrap(), Message::EndOfList);
    assert!(b.received.get() < 1 << 20, "{}", b.received.get());
}

#[test]
fn stream_link_roundtrips_and_detects_garbage() {
    // One socket per direction, as ssh's stdin and stdout are.
    let (a_out, b_in) = UnixStream::pair().unwrap();
    let (b_out, a_in) = UnixStream::pair().unwrap();
    let a = stream_link(a_in, a_out);
    let b = stream_link(b_in, b_out);
    for i in 0..100u32 {
        a.tx.send(Message::Zero {
            file: i,
            offset: 0,
            len: 5,
        })
        .unwrap();
    }
    for i in 0..100u32 {
        assert_eq!(
            b.rx.recv().unwrap(),
            Message::Zero {
                file: i,
                offset: 0,
                len: 5
            }
        );
    }
    drop(a);
    assert_eq!(b.rx.recv(), Err(LinkError::Closed));

    let (mut s1, s2) = UnixStream::pair().unwrap();
    let (b_out, _keep) = UnixStream::pair().unwrap();
    let b = stream_link(s2, b_out);
    s1.write_all(b"Welcome to host!\nlast login...").unwrap();
    drop(s1);
    match b.rx.recv() {
        Err(LinkError::BadMagic(t)) => assert!(t.starts_with("Welcome")),
        other => panic!("{other:?}"),
    }
}

/// A ferry of the old framing is named as such, not as garbage.
#[test]
fn an_older_framing_is_a_version_mismatch() {
    let old = b"FERRY\x00\x01\n\x05\x00\x00\x00hello".to_vec();
    let (tx, _rx) = crossbeam_channel::unbounded();
    let r = read_loop(
        &mut &old[..],
        &tx,
        &WireCounter::default(),
        &Liveness::default(),
    );
    assert!(matches!(r, Err(LinkError::Version(1))), "{r:?}");
    let text = LinkError::Version(1).to_string();
    assert!(
        text.contains("version 1") && text.contains("this ferry's 4"),
        "{text}"
    );
}

/// Any single flipped bit of a frame (length, body or check) ends the
/// link with an error, never with a different message delivered.
#[test]
fn a_flipped_bit_anywhere_in_a_frame_is_an_error() {
    let m = Message::Entry(Box::new(crate::Entry {
        id: 3,
        path: b"dir/file".to_vec(),
        kind: Some(crate::EntryKind::File),
        mode: 0o100644,
        size: 1234,
        mtime: 1_700_000_000,
        ..Default::default()
    }));
    let mut frame = vec![0u8; 8];
    codec::encode(&m, &mut frame);
    let n = (frame.len() - 8) as u32;
    frame[..4].copy_from_slice(&n.to_le_bytes());
    frame[4..8].copy_from_slice(&(!n).to_le_bytes());
    let check = frame_check(&frame);
    frame.extend_from_slice(&check.to_le_bytes());
    for bit in 0..frame.len() * 8 {
        let mut bad = MAGIC.to_vec();
        bad.extend_from_slice(&frame);
        bad[MAGIC.len() + bit / 8] ^= 1 << (bit % 8);
        let (tx, rx) = crossbeam_channel::unbounded();
        let r = read_loop(
            &mut &bad[..],
            &tx,
            &WireCounter::default(),
            &Liveness::default(),
        );
        assert!(r.is_err(), "bit {bit}: {r:?}");
        assert!(rx.try_recv().is_err(), "bit {bit}: a message was delivered");
    }
}

/// Text that repeats every 3 MiB: only blocks that see earlier blocks
/// (zstd streams) can use that.
fn repeating_text(block: u64) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (block % 3);
    let words = [
        "ferry ", "moves ", "data ", "between ", "hosts ", "\n", "at ", "rate ",
    ];
    let mut v = Vec::with_capacity(1 << 20);
    while v.len() < 1 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(words[(x % 8) as usize].as_bytes());
        v.extend_from_slice((x % 1000).to_string().as_bytes());
    }
    v.truncate(1 << 20);
    v
}

/// A stream link over a socket pair whose `a` end compresses with zstd 3
/// for `workers` sending threads.
fn compressed_pair(workers: usize) -> (Endpoint, Endpoint) {
    let (a_out, b_in) = UnixStream::pair().unwrap();
    let (b_out, a_in) = UnixStream::pair().unwrap();
    let mut a = stream_link(a_in, a_out);
    let b = stream_link(b_in, b_out);
    let mode = ferry_compress::Mode::Fixed(ferry_compress::Codec::Zstd(3));
    a.tx = a.tx.with_compression(mode, workers, Arc::default(), None);
    (a, b)
}

#[test]
fn compressed_link_streams_per_clone_and_decodes_in_order() {
    let (a, b) = compressed_pair(2);
    let mode = ferry_compress::Mode::Fixed(ferry_compress::Codec::Zstd(3));
    let raw: u64 = 18 << 20;
    let senders: Vec<_> = (0..2u32)
        .map(|f| {
            let tx = a.tx.clone();
            thread::spawn(move || {
                for k in 0..9u64 {
                    tx.send(Message::Data {
                        file: f,
                        offset: k << 20,
                        data: repeating_text(k),
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    let reader = thread::spawn(move || {
        let mut got = 0;
        while got < 18 {
            match b.rx.recv().unwrap() {
                Message::Data { offset, data, .. } => {
                    assert!(data == repeating_text(offset >> 20), "block at {offset}");
                    got += 1;
                }
                m => panic!("{m:?}"),
            }
        }
        b.received.get()
    });
    for s in senders {
        s.join().unwrap();
    }
    let wire = reader.join().unwrap();
    // Independent blocks: what each would cost alone.
    let mut k = ferry_compress::Compressor::new(mode);
    let mut indep = 0u64;
    for blk in 0..9u64 {
        let mut out = Vec::new();
        k.compress_block(&repeating_text(blk), &mut out);
        indep += 2 * out.len() as u64;
    }
    assert!(wire < raw / 2, "{wire}");
    assert!(
        wire * 2 < indep,
        "streams {wire} vs independent blocks {indep}"
    );
}

/// `m` as one frame.
fn frame_of(m: &Message) -> Vec<u8> {
    let mut frame = vec![0u8; 8];
    codec::encode(m, &mut frame);
    let n = (frame.len() - 8) as u32;
    frame[..4].copy_from_slice(&n.to_le_bytes());
    frame[4..8].copy_from_slice(&(!n).to_le_bytes());
    let check = frame_check(&frame);
    frame.extend_from_slice(&check.to_le_bytes());
    frame
}

/// Every message `read_loop` handed over, in order, and how many batches.
fn drain(rx: &Receiver<Batch>) -> (Vec<Message>, usize) {
    let (mut out, mut batches) = (Vec::new(), 0);
    while let Ok(b) = rx.try_recv() {
        batches += 1;
        match b {
            Batch::One(m) => out.push(m),
            Batch::Many(ms) => out.extend(ms),
        }
    }
    (out, batches)
}

#[test]
fn keepalive_frames_are_skipped() {
    let mut bytes = MAGIC.to_vec();
    for _ in 0..3 {
        write_keepalive(&mut bytes).unwrap();
    }
    bytes.extend_from_slice(&frame_of(&Message::EndOfList));
    write_keepalive(&mut bytes).unwrap();
    let (tx, rx) = bounded(8);
    let r = read_loop(
        &mut &bytes[..],
        &tx,
        &WireCounter::default(),
        &Liveness::default(),
    );
    assert_eq!(r, Err(LinkError::Closed), "clean end after the frames");
    let (got, _) = drain(&rx);
    assert!(matches!(got[..], [Message::EndOfList]), "{got:?}");
}

#[test]
fn frames_come_in_order_in_bounded_batches_and_damage_after_them() {
    let mut bytes = MAGIC.to_vec();
    let n = 5000u32;
    for below in 0..n {
        bytes.extend_from_slice(&frame_of(&Message::Decided { below }));
    }
    let mut bad = frame_of(&Message::EndOfList);
    let last = bad.len() - 1;
    bad[last] ^= 1;
    bytes.extend_from_slice(&bad);
    bytes.extend_from_slice(&frame_of(&Message::EndOfList));
    let (tx, rx) = bounded(64);
    let r = read_loop(
        &mut &bytes[..],
        &tx,
        &WireCounter::default(),
        &Liveness::default(),
    );
    assert_eq!(r, Err(LinkError::Checksum));
    let (got, batches) = drain(&rx);
    // Every frame before the damaged one arrives, in order, and nothing
    // after it; a batch is never longer than MAX_BATCH.
    assert_eq!(got.len(), n as usize);
    for (i, m) in got.iter().enumerate() {
        assert!(
            matches!(m, Message::Decided { below } if *below == i as u32),
            "{i}: {m:?}"
        );
    }
    assert!(
        batches >= (n as usize).div_ceil(1024) && batches < n as usize / 100,
        "{batches}"
    );
}

#[test]
fn a_receiver_takes_a_batch_a_message_at_a_time_and_wake_goes_first() {
    let (tx, rx) = bounded(4);
    let ep = MsgRx {
        rx,
        failure: Arc::default(),
        state: Mutex::default(),
        live: None,
    };
    tx.send(Batch::Many(
        (0..3)
            .map(|below| Message::Decided { below })
            .collect::<Vec<_>>()
            .into_iter(),
    ))
    .unwrap();
    tx.send(Batch::One(Message::EndOfList)).unwrap();
    let (wake_tx, wake) = bounded(1);
    assert!(matches!(
        ep.recv_or_wake(&wake),
        Ok(Some(Message::Decided { below: 0 }))
    ));
    wake_tx.send(()).unwrap();
    assert!(
        matches!(ep.recv_or_wake(&wake), Ok(None)),
        "wake before the rest of a batch"
    );
    assert!(matches!(ep.recv(), Ok(Message::Decided { below: 1 })));
    assert!(matches!(ep.recv(), Ok(Message::Decided { below: 2 })));
    assert!(matches!(ep.recv(), Ok(Message::EndOfList)));
    drop(tx);
    assert_eq!(ep.recv().err(), Some(LinkError::Closed));
}

#[test]
fn a_silent_peer_times_out_and_a_live_idle_one_does_not() {
    // Two live links idle for longer than the timeout: keepalives hold.
    let (a, b) = UnixStream::pair().unwrap();
    let ea = stream_link(a.try_clone().unwrap(), a);
    let eb = stream_link(b.try_clone().unwrap(), b);
    ea.set_idle_timeout(Some(std::time::Duration::from_millis(2500)));
    let (wake_tx, wake) = crossbeam_channel::bounded::<()>(1);
    let waker = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(4));
        let _ = wake_tx.send(());
    });
    assert!(
        matches!(ea.rx.recv_or_wake(&wake), Ok(None)),
        "a live peer's keepalives must hold the link"
    );
    waker.join().unwrap();
    drop(eb);
    // A peer that never writes (a stopped process): timed out.
    let (a, _silent) = UnixStream::pair().unwrap();
    let ea = stream_link(a.try_clone().unwrap(), a);
    ea.set_idle_timeout(Some(std::time::Duration::from_millis(300)));
    let t = std::time::Instant::now();
    assert!(matches!(ea.rx.recv(), Err(LinkError::TimedOut(_))));
    assert!(t.elapsed() < std::time::Duration::from_secs(3));
}

#[test]
fn a_receiver_whose_waker_is_gone_still_times_out_a_silent_peer() {
    // It used to spin on the closed waker, never looking at the clock.
    let (a, _silent) = UnixStream::pair().unwrap();
    let ea = stream_link(a.try_clone().unwrap(), a);
    ea.set_idle_timeout(Some(std::time::Duration::from_millis(300)));
    let (wake_tx, wake) = crossbeam_channel::bounded::<()>(1);
    drop(wake_tx);
    let t = std::time::Instant::now();
    assert!(matches!(
        ea.rx.recv_or_wake(&wake),
        Err(LinkError::TimedOut(_))
    ));
    assert!(t.elapsed() < std::time::Duration::from_secs(3));
}

/// A peer that is busy (not reading: its queue is full) but alive (its
/// keepalives arrive) is not a dead one: the sender waits past the
/// timeout instead of failing; once the peer goes away it fails.
#[test]
fn a_busy_peer_that_sends_keepalives_does_not_time_out() {
    let (a, b) = UnixStream::pair().unwrap();
    let ea = stream_link(a.try_clone().unwrap(), a);
    let eb = stream_link(b.try_clone().unwrap(), b);
    ea.set_idle_timeout(Some(std::time::Duration::from_millis(2000)));
    let (done_tx, done) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let r = (0..400u32).try_for_each(|i| {
            ea.tx.send(Message::Data {
                file: 0,
                offset: u64::from(i) << 20,
                data: vec![7; 1 << 20],
            })
        });
        let _ = done_tx.send(r);
    });
    // Nobody reads eb: its queue and the pipe fill, and a's sends block.
    assert!(
        done.recv_timeout(std::time::Duration::from_secs(5))
            .is_err(),
        "the sender gave up on a live peer"
    );
    drop(eb);
    let r = done
        .recv_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    assert!(r.is_err(), "{r:?}");
}
