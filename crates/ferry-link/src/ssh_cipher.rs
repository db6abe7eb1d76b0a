//! ssh's cipher, where nobody chose one: on a CPU with AES instructions,
//! OpenSSH's AES-GCM encrypts about 1.8x as fast as the ChaCha20-Poly1305
//! it prefers by default (OpenSSL here: 3.7 against 2.1 GB/s a core), and
//! on two cores ssh's cipher is what bounds a sync over an unshaped link
//! (a 252 MiB tree over loopback ssh: 1.96 s became 1.62 s). ChaCha20 is
//! the default for CPUs without them, where AES-GCM is the slow one.
//!
//! So when the remote shell is OpenSSH's `ssh`, this CPU has AES, and the
//! cipher list in force is OpenSSH's own default (neither `-e`, nor
//! `-o Ciphers`, nor any ssh_config chose it), ferry passes the same list
//! with its AES-GCM ciphers moved to the front: no cipher is added or
//! taken away, only the order of preference changes, and the server still
//! picks from what it allows. What is in force comes from `ssh -G` (which
//! reads the configuration for the host and connects nowhere); the default
//! from `ssh -F /dev/null -G`. Anything unexpected (another ssh, `-G`
//! failing or slow) leaves the command as it was.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long each `ssh -G` may take before it is given up on.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The `-c LIST` to add to `prog args… host`, or `None` to leave the
/// command alone.
pub(crate) fn cipher_args(prog: &str, args: &[&str], host: &str) -> Option<[String; 2]> {
    if !is_openssh(prog) || chooses_cipher(args) || !ferry_channel::has_hw_aes() {
        return None;
    }
    let in_force = probe(prog, args, host)?;
    let default = probe(prog, &["-F", "/dev/null"], host)?;
    let list = gcm_first(&in_force, &default)?;
    Some(["-c".to_string(), list])
}

/// The remote shell is `ssh` (by any path).
fn is_openssh(prog: &str) -> bool {
    Path::new(prog).file_name().is_some_and(|n| n == "ssh")
}

/// `-e` chooses the cipher itself: `-c LIST` (or `-cLIST`, or `c` among
/// bundled flags) or `-o Ciphers=…` (`-oCiphers …`, any case).
fn chooses_cipher(args: &[&str]) -> bool {
    let mut after_o = false;
    for a in args {
        if after_o {
            after_o = false;
            if a.trim_start().to_ascii_lowercase().starts_with("ciphers") {
                return true;
            }
            continue;
        }
        let Some(flags) = a.strip_prefix('-') else {
            continue;
        };
        if let Some(opt) = flags.strip_prefix('o') {
            if opt.is_empty() {
                after_o = true;
            } else if opt.trim_start().to_ascii_lowercase().starts_with("ciphers") {
                return true;
            }
        } else if flags.contains('c') {
            return true;
        }
    }
    false
}

/// The `ciphers` line of `prog args… -G host`.
fn probe(prog: &str, args: &[&str], host: &str) -> Option<String> {
    let mut child = Command::new(prog)
        .args(args)
        .arg("-G")
        .arg(host)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let until = Instant::now() + PROBE_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => break,
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    ciphers_line(&out).map(str::to_string)
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
    fn only_openssh_by_name() {
        assert!(is_openssh("ssh"));
        assert!(is_openssh("/usr/bin/ssh"));
        assert!(!is_openssh("rsh"));
        assert!(!is_openssh("/opt/sshpass"));
        assert!(!is_openssh("kubectl"));
    }

    #[test]
    fn a_cipher_chosen_on_the_command_line_is_left_alone() {
        for args in [
            &["-c", "chacha20-poly1305@openssh.com"][..],
            &["-caes256-ctr"],
            &["-4c", "aes256-ctr"],
            &["-p", "22", "-o", "Ciphers=aes256-ctr"],
            &["-o", "ciphers aes256-ctr"],
            &["-oCiphers=+aes128-cbc"],
            &["-o", "  Ciphers=-chacha20-poly1305@openssh.com"],
        ] {
            assert!(chooses_cipher(args), "{args:?}");
        }
        for args in [
            &[][..],
            &["-p", "2222", "-i", "/k/id_cipher"],
            &["-C", "-o", "Compression=yes", "-F", "/etc/ciphers.conf"],
            &["-oBatchMode=yes", "-v"],
        ] {
            assert!(!chooses_cipher(args), "{args:?}");
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
    fn a_missing_or_failing_ssh_changes_nothing() {
        assert_eq!(probe("/nonexistent/ssh", &[], "h"), None);
        assert_eq!(probe("false", &[], "h"), None);
        assert_eq!(cipher_args("/nonexistent/ssh", &[], "h"), None);
    }
}
