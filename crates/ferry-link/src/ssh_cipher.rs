//! ssh's cipher, where nobody chose one: on a CPU with AES instructions,
//! OpenSSH's AES-GCM encrypts about 1.8x as fast as the ChaCha20-Poly1305
//! it prefers by default (OpenSSL here: 3.7 against 2.1 GB/s a core), and
//! on two cores ssh's cipher is what bounds a sync over an unshaped link
//! (a 252 MiB tree over loopback ssh: 1.96 s became 1.62 s). ChaCha20 is
//! the default for CPUs without them, where AES-GCM is the slow one.
//!
//! So when the remote shell is OpenSSH's `ssh` (`ssh -V` says so), this
//! CPU has AES, and the cipher list in force is OpenSSH's own default
//! (neither `-e`, nor `-o Ciphers`, nor any ssh_config chose it), ferry
//! passes the same list with its AES-GCM ciphers moved to the front: no
//! cipher is added or taken away, only the order of preference changes,
//! and the server still picks from what it allows. What is in force comes
//! from `ssh ARGS -G HOST COMMAND` (which reads the configuration for that
//! host and command, runs its `Match exec` tests once more, and connects
//! nowhere); the default from `ssh -F /dev/null -G HOST COMMAND`. A
//! configuration that spells out the default list word for word looks the
//! same as none. The probe runs only when every word of `-e` after the
//! program is an option ssh knows (with its value): a positional word
//! (`-e "ssh jump ssh"`) would make `-G` an argument of a command run
//! elsewhere. Anything unexpected (another ssh, `-G` failing, slow or
//! printing more than [`MAX_PROBE_OUTPUT`]) leaves the command as it was.
//! One answer per command line is kept for the process (retries, `--deploy`).

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long each probe may take before it is given up on.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Output of a probe read at most (`ssh -G` prints about 3 KiB).
const MAX_PROBE_OUTPUT: u64 = 1 << 20;
/// ssh's options that take a value, and those that do not (OpenSSH 9-10's
/// getopt string).
const WITH_VALUE: &str = "BbcDEeFIiJLlmOoPpQRSWw";
const FLAGS: &str = "1246AaCfGgKkMNnqsTtVvXxYy";

/// The `-c LIST` to add to `prog args… host line`, or `None` to leave the
/// command alone.
pub(crate) fn cipher_args(
    prog: &str,
    args: &[&str],
    host: &str,
    line: &str,
) -> Option<[String; 2]> {
    if !is_ssh(prog) || read_args(args) != Args::Plain || !ferry_channel::has_hw_aes() {
        return None;
    }
    type Key = (String, Vec<String>, String, String);
    static SEEN: OnceLock<Mutex<HashMap<Key, Option<String>>>> = OnceLock::new();
    let key: Key = (
        prog.into(),
        args.iter().map(|a| a.to_string()).collect(),
        host.into(),
        line.into(),
    );
    let seen = SEEN.get_or_init(Default::default);
    let known = seen.lock().ok().and_then(|m| m.get(&key).cloned());
    let list = match known {
        Some(list) => list,
        None => {
            let list = probe_list(prog, args, host, line);
            if let Ok(mut m) = seen.lock() {
                m.insert(key, list.clone());
            }
            list
        }
    };
    list.map(|l| ["-c".to_string(), l])
}

/// The reordered list, from the probes.
fn probe_list(prog: &str, args: &[&str], host: &str, line: &str) -> Option<String> {
    let version = run(prog, &["-V"], true)?;
    if !version.starts_with("OpenSSH_") {
        return None;
    }
    let g = |a: &[&str]| {
        let mut v = a.to_vec();
        v.extend(["-G", host, line]);
        run(prog, &v, false)
    };
    let in_force = g(args)?;
    let default = g(&["-F", "/dev/null"])?;
    gcm_first(ciphers_line(&in_force)?, ciphers_line(&default)?)
}

/// The remote shell is named `ssh` (by any path).
fn is_ssh(prog: &str) -> bool {
    Path::new(prog).file_name().is_some_and(|n| n == "ssh")
}

/// What the words of `-e` after the program are.
#[derive(Debug, PartialEq, Eq)]
enum Args {
    /// Options ssh knows, none of which chooses a cipher.
    Plain,
    /// `-c LIST` (or `-cLIST`, or `c` among bundled flags) or
    /// `-o Ciphers=…` (`-oCiphers …`, any case, any separator).
    Chosen,
    /// A positional word, `--`, or an option this does not know.
    Other,
}

/// Read `args` as ssh's getopt would.
fn read_args(args: &[&str]) -> Args {
    let mut words = args.iter();
    while let Some(w) = words.next() {
        let Some(flags) = w.strip_prefix('-').filter(|f| !f.is_empty() && *f != "-") else {
            return Args::Other;
        };
        for (i, ch) in flags.char_indices() {
            if FLAGS.contains(ch) {
                continue;
            }
            if !WITH_VALUE.contains(ch) {
                return Args::Other;
            }
            let rest = &flags[i + ch.len_utf8()..];
            let value = if rest.is_empty() {
                words.next().copied()
            } else {
                Some(rest)
            };
            let Some(value) = value else {
                return Args::Other;
            };
            let ciphers = value
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("ciphers");
            if ch == 'c' || (ch == 'o' && ciphers) {
                return Args::Chosen;
            }
            break;
        }
    }
    Args::Plain
}

/// What `prog args` printed on stdout (or, `stderr`, on stderr), if it
/// exited with success within [`PROBE_TIMEOUT`]. The output is read on a
/// thread while the child runs, so a long one cannot stall it; a child
/// that outlives the timeout is killed and its reader left behind.
fn run(prog: &str, args: &[&str], stderr: bool) -> Option<String> {
    let (out, err) = if stderr {
        (Stdio::null(), Stdio::piped())
    } else {
        (Stdio::piped(), Stdio::null())
    };
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .ok()?;
    let pipe: Box<dyn Read + Send> = match (child.stdout.take(), child.stderr.take()) {
        (Some(o), _) => Box::new(o),
        (None, Some(e)) => Box::new(e),
        (None, None) => return None,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::Builder::new()
        .name("ferry-ssh-probe".into())
        .spawn(move || {
            let mut pipe = pipe;
            let mut text = String::new();
            let ok = (&mut pipe)
                .take(MAX_PROBE_OUTPUT)
                .read_to_string(&mut text)
                .is_ok();
            // What is beyond the limit is read and dropped, so that the
            // child does not block on a full pipe; it fails the probe.
            let more = std::io::copy(&mut pipe, &mut std::io::sink()).map_or(true, |n| n > 0);
            let _ = tx.send((ok && !more).then_some(text));
        });
    let until = Instant::now() + PROBE_TIMEOUT;
    let ok = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.success(),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(2)),
            _ => break false,
        }
    };
    if !ok {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    }
    reader.ok()?;
    rx.recv_timeout(until.saturating_duration_since(Instant::now()))
        .ok()
        .flatten()
}

/// The value of the `ciphers` line of `ssh -G`'s output.
fn ciphers_line(out: &str) -> Option<&str> {
    out.lines()
        .find_map(|l| l.strip_prefix("ciphers "))
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// `in_force` with its AES-GCM ciphers first, when it is OpenSSH's
/// `default` list and does not already start with one.
fn gcm_first(in_force: &str, default: &str) -> Option<String> {
    if in_force != default {
        return None;
    }
    let gcm = |c: &&str| c.starts_with("aes") && c.ends_with("-gcm@openssh.com");
    let all: Vec<&str> = in_force.split(',').collect();
    if all.first().is_none_or(gcm) || !all.iter().any(gcm) {
        return None;
    }
    let (mut first, rest): (Vec<&str>, Vec<&str>) = all.into_iter().partition(gcm);
    first.extend(rest);
    Some(first.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: &str = "chacha20-poly1305@openssh.com,aes128-ctr,aes192-ctr,aes256-ctr,\
                           aes128-gcm@openssh.com,aes256-gcm@openssh.com";

    #[test]
    fn only_a_program_named_ssh() {
        assert!(is_ssh("ssh"));
        assert!(is_ssh("/usr/bin/ssh"));
        assert!(!is_ssh("rsh"));
        assert!(!is_ssh("/opt/sshpass"));
        assert!(!is_ssh("kubectl"));
    }

    #[test]
    fn the_words_of_e_read_as_ssh_reads_them() {
        for args in [
            &["-c", "chacha20-poly1305@openssh.com"][..],
            &["-caes256-ctr"],
            &["-4c", "aes256-ctr"],
            &["-p", "22", "-o", "Ciphers=aes256-ctr"],
            &["-o", "ciphers aes256-ctr"],
            &["-oCiphers=+aes128-cbc"],
            &["-4o", "Ciphers=aes256-ctr"],
            &["-o", "  Ciphers=-chacha20-poly1305@openssh.com"],
        ] {
            assert_eq!(read_args(args), Args::Chosen, "{args:?}");
        }
        for args in [
            &[][..],
            &["-p", "2222", "-i", "/k/id_cipher"],
            &["-i/root/.ssh/id_ecdsa", "-lcarol"],
            &["-C", "-o", "Compression=yes", "-F", "/etc/ciphers.conf"],
            &["-oBatchMode=yes", "-v", "-Tx"],
            &["-J", "jump", "-E", "/tmp/c.log"],
        ] {
            assert_eq!(read_args(args), Args::Plain, "{args:?}");
        }
        // A positional word (a jump through another ssh, whose own -G
        // would run over there), `--`, an unknown or unfinished option.
        for args in [
            &["jump", "ssh"][..],
            &["-p", "22", "root@jump", "ssh"],
            &["--"],
            &["-"],
            &["-Z"],
            &["-p"],
            &["-vp"],
        ] {
            assert_eq!(read_args(args), Args::Other, "{args:?}");
        }
    }

    #[test]
    fn gcm_goes_first_only_in_the_default_list() {
        assert_eq!(
            gcm_first(DEFAULT, DEFAULT).as_deref(),
            Some(
                "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,\
                 aes128-ctr,aes192-ctr,aes256-ctr"
            )
        );
        // Somebody's configuration chose: its order stands.
        let own = "chacha20-poly1305@openssh.com,aes256-gcm@openssh.com";
        assert_eq!(gcm_first(own, DEFAULT), None);
        // Already first, or no GCM at all: nothing to change.
        let gcm = "aes256-gcm@openssh.com,chacha20-poly1305@openssh.com";
        assert_eq!(gcm_first(gcm, gcm), None);
        let none = "chacha20-poly1305@openssh.com,aes128-ctr";
        assert_eq!(gcm_first(none, none), None);
    }

    #[test]
    fn the_ciphers_line_of_ssh_g() {
        let out = "user me\nhostname h\nciphers a,b\nmacs x\n";
        assert_eq!(ciphers_line(out), Some("a,b"));
        assert_eq!(ciphers_line("user me\n"), None);
        assert_eq!(ciphers_line("ciphers \n"), None);
    }

    #[test]
    fn a_probe_that_fails_stalls_or_floods_changes_nothing() {
        assert_eq!(run("/nonexistent/ssh", &[], false), None);
        assert_eq!(run("false", &[], false), None);
        assert_eq!(
            run("sh", &["-c", "echo hi"], false).as_deref(),
            Some("hi\n")
        );
        assert_eq!(
            run("sh", &["-c", "echo err >&2"], true).as_deref(),
            Some("err\n")
        );
        // More than the pipe holds, and more than is read: not a stall.
        let t = Instant::now();
        assert_eq!(run("sh", &["-c", "head -c 2000000 /dev/zero"], false), None);
        assert!(run("sh", &["-c", "head -c 200000 /dev/zero"], false).is_some());
        assert!(t.elapsed() < PROBE_TIMEOUT, "{:?}", t.elapsed());
        // One that outlives the timeout is killed, whatever it left running.
        let t = Instant::now();
        assert_eq!(run("sh", &["-c", "sleep 30"], false), None);
        assert!(t.elapsed() < PROBE_TIMEOUT + Duration::from_secs(1));
        assert_eq!(cipher_args("/nonexistent/ssh", &[], "h", "x"), None);
    }
}
