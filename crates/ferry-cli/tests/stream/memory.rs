//! A stream's memory: each side's peak RSS stays within its `--buffer`
//! plus 64 MiB while both rings are full (a consumer that stalls, so the
//! receiver's ring fills, then the network, then the sender's ring).

use super::*;

/// Wait for `g`'s process and return its peak RSS in bytes (its own, from
/// `wait4`, not that of other tests' children).
fn peak_rss(g: Guard) -> (bool, u64) {
    let pid = g.0.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child; `status` and `ru` outlive the call.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    // Reaped here: the guard must not kill or wait for the pid again.
    std::mem::forget(g);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (ok, ru.ru_maxrss as u64 * 1024)
}

#[test]
fn peak_memory_stays_within_the_buffer_plus_64_mib() {
    const MIB: u64 = 1 << 20;
    let buffer = 64 * MIB;
    // The consumer reads nothing for 3 s, then everything.
    let (r, port) = start_recv(
        KEY,
        &["-m", "64M", "--", "sh", "-c", "sleep 3; cat >/dev/null"],
    );
    let (s, mut input) = start_send(port, &["-m", "64M"], false);
    // 384 MiB: half random (incompressible), half text, so the compressors
    // keep both kinds of block.
    let writer = thread::spawn(move || {
        let mut seed = 7u64;
        for i in 0..384u64 {
            let block: Vec<u8> = if i % 2 == 0 {
                (0..MIB)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed as u8
                    })
                    .collect()
            } else {
                format!("line {i} of a stream that compresses well\n")
                    .into_bytes()
                    .into_iter()
                    .cycle()
                    .take(MIB as usize)
                    .collect()
            };
            if input.write_all(&block).is_err() {
                return;
            }
        }
    });
    let (sent, send_rss) = peak_rss(s);
    writer.join().expect("writer");
    let (received, recv_rss) = peak_rss(r);
    assert!(sent && received, "the stream failed");
    eprintln!(
        "peak RSS with a 64 MiB buffer: send {} MiB, recv {} MiB",
        send_rss / MIB,
        recv_rss / MIB
    );
    assert!(
        send_rss <= buffer + 64 * MIB,
        "send peaked at {} MiB",
        send_rss / MIB
    );
    assert!(
        recv_rss <= buffer + 64 * MIB,
        "recv peaked at {} MiB",
        recv_rss / MIB
    );
}
