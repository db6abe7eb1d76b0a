//! Processes by pid, read from /proc: the children of a process, the
//! `ferry serve` a test's sshd started, signals sent to one pid at a time.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `(comm, state, ppid)` of `pid`, from /proc/PID/stat.
pub fn stat(pid: i32) -> Option<(String, char, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let comm = s[open + 1..close].to_string();
    let mut rest = s[close + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((comm, state, ppid))
}

/// Every pid in /proc.
fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(_, state, _)| state != 'Z')
}

/// The live child of `parent` whose command name is `comm`, and whose
/// arguments pass `args`.
pub fn child_with(parent: i32, comm: &str, args: impl Fn(&[String]) -> bool) -> Option<i32> {
    pids().into_iter().find(|&p| {
        stat(p).is_some_and(|(c, state, ppid)| ppid == parent && c == comm && state != 'Z')
            && std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|raw| {
                let v: Vec<String> = raw
                    .split(|&b| b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                args(&v)
            })
    })
}

/// Whether `ancestor` is `pid`'s parent, grandparent, ...
pub fn descends_from(mut pid: i32, ancestor: i32) -> bool {
    for _ in 0..64 {
        match stat(pid) {
            Some((_, _, ppid)) if ppid == ancestor => return true,
            Some((_, _, ppid)) if ppid > 1 => pid = ppid,
            _ => return false,
        }
    }
    false
}

/// Live processes running `bin` (argv\[0\]) as `ferry serve` with the
/// argument `path`: the remote side of one test's run, and nothing else.
pub fn serves(bin: &Path, path: &str) -> Vec<i32> {
    let bin = bin.to_string_lossy();
    pids()
        .into_iter()
        .filter(|&p| {
            let Ok(raw) = std::fs::read(format!("/proc/{p}/cmdline")) else {
                return false;
            };
            let argv: Vec<String> = raw
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            argv.first().is_some_and(|a0| *a0 == bin)
                && argv.iter().any(|a| a == "serve")
                && argv.iter().any(|a| a == path)
                && alive(p)
        })
        .collect()
}

/// Send `sig` (`-KILL`, `-INT`, ...) to the one process `pid`.
pub fn signal(pid: i32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

/// Wait until none of the processes `find` returns is alive; false after
/// `timeout`.
pub fn wait_gone(mut find: impl FnMut() -> Vec<i32>, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while !find().is_empty() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}
