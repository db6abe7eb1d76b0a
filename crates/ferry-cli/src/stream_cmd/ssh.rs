//! The remote side of `ferry pipe`: the `ferry recv` command line run
//! through ssh (or `-e`), starting it, the key-and-port exchange over ssh's
//! pipes, and reaping ssh at the end.

use std::io::Write;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread;
use std::time::Duration;

use ferry_channel::IdleRead;

use super::args::PipeArgs;
use super::read_line_raw;
use crate::exit as code;

/// The ssh child: killed (and reaped) if still running when dropped.
pub(super) struct KillOnDrop(Option<Child>);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The words that run `ferry recv` on the remote host, in the mode
/// `pipe` drives: key on stdin, port announced on stdout.
pub(super) fn remote_recv_words(a: &PipeArgs) -> Vec<String> {
    let mut remote = vec![
        a.remote_ferry.clone(),
        "recv".into(),
        "--listen".into(),
        format!("{}:0", a.remote_listen),
        "--key-stdin".into(),
        "--announce".into(),
        "--compress".into(),
        a.o.compress.clone(),
        "--buffer".into(),
        a.o.buffer.clone(),
        "--block-size".into(),
        a.o.block_size.clone(),
    ];
    if let Some(t) = a.o.timeout {
        remote.extend(["--timeout".into(), t.to_string()]);
    }
    remote.push("--".into());
    remote.extend(a.command.iter().cloned());
    remote
}

/// Run the ssh command `cmd` with its stdin and stdout as pipes. On
/// failure, the exit code (the message is out).
pub(super) fn spawn(mut cmd: Command) -> Result<(KillOnDrop, ChildStdin, ChildStdout), i32> {
    let prog = cmd.get_program().to_string_lossy().into_owned();
    let spawned = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    let mut guard = match spawned {
        Ok(c) => KillOnDrop(Some(c)),
        Err(e) => {
            errln!("ferry pipe: cannot run {prog}: {e}");
            return Err(code::REMOTE);
        }
    };
    match guard.0.as_mut().map(|c| (c.stdin.take(), c.stdout.take())) {
        Some((Some(i), Some(o))) => Ok((guard, i, o)),
        _ => {
            errln!("ferry pipe: ssh has no pipes");
            Err(code::REMOTE)
        }
    }
}

/// Hand the remote `ferry recv` its key and read the port it listens on.
/// `None` (the message is out) when it did not start, or (with `wait`,
/// from `--timeout`) did not announce its port in time.
pub(super) fn start_remote(
    key: &str,
    ssh_in: &mut ChildStdin,
    ssh_out: &mut ChildStdout,
    rsh: &str,
    remote_ferry: &str,
    wait: Option<Duration>,
) -> Option<u16> {
    if writeln!(ssh_in, "{key}")
        .and_then(|_| ssh_in.flush())
        .is_err()
    {
        errln!("ferry pipe: {rsh} exited before the remote ferry started");
        return None;
    }
    let line = match read_line_raw(&mut IdleRead::new(&mut *ssh_out, wait), 256) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            errln!("ferry pipe: the remote side did not start: {e}");
            return None;
        }
        Err(_) => String::new(),
    };
    let port: Option<u16> = line
        .strip_prefix("FERRY-PORT ")
        .and_then(|p| p.trim().parse().ok());
    if port.is_none() {
        errln!(
            "ferry pipe: the remote side did not start (is {remote_ferry} installed there? it said {line:?})"
        );
    }
    port
}

/// Tell the remote `ferry recv` which transport the stream takes (`tcp`
/// or `stdin`). `false` when ssh is gone.
pub(super) fn choose_transport(ssh_in: &mut ChildStdin, which: &str) -> bool {
    writeln!(ssh_in, "{which}")
        .and_then(|_| ssh_in.flush())
        .is_ok()
}

/// The host of `[user@]host` (or `[user@][v6addr]`).
pub(super) fn target_host(target: &str) -> &str {
    let host = target.rsplit('@').next().unwrap_or(target);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Wait for ssh to exit and return its status. After a failed stream, the
/// remote gets a moment to report, then ssh is killed.
pub(super) fn reap(guard: &mut KillOnDrop, failed: bool) -> Option<i32> {
    guard.0.take().and_then(|mut c| {
        if failed {
            // Give the remote a moment to report, then stop waiting.
            thread::sleep(Duration::from_millis(200));
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
        }
        c.wait().ok().and_then(|s| s.code())
    })
}

/// The remote side never started: reap ssh and exit with the documented
/// code. ssh's own status (1 from `false`, 255 from ssh) would read as one
/// of ferry's other codes, or as the remote command's.
pub(super) fn ssh_failed(guard: &mut KillOnDrop) -> i32 {
    if let Some(mut c) = guard.0.take() {
        let _ = c.wait();
    }
    code::REMOTE
}
