//! The command line ferry runs on the other host: the `ferry serve`
//! arguments that carry the sync options, and the quoting for the remote
//! shell that ssh runs them through.

use crate::{DeltaMode, SyncOptions};

/// The `ferry serve` arguments that carry `opts` to the other side.
pub fn serve_args(
    opts: &SyncOptions,
    send: bool,
    file_or_dir: bool,
    paths: &[String],
) -> Vec<String> {
    serve_args_with(opts, send, file_or_dir, false, paths)
}

pub(super) fn serve_args_with(
    opts: &SyncOptions,
    send: bool,
    file_or_dir: bool,
    direct: bool,
    paths: &[String],
) -> Vec<String> {
    let mut a: Vec<String> = vec!["serve".into(), "--stdio".into()];
    if direct {
        a.push("--direct".into());
    }
    a.push(if send { "--send" } else { "--receive" }.into());
    let flags = [
        (file_or_dir, "--file-or-dir"),
        (opts.delete, "--delete"),
        (opts.force, "--force"),
        (opts.ignore_errors, "--ignore-errors"),
        (!opts.fsync, "--no-fsync"),
        (opts.verify, "--verify"),
        (opts.checksum, "--checksum"),
        (opts.dry_run, "--dry-run"),
        (opts.inplace, "--inplace"),
        (opts.xattrs, "--xattrs"),
        (opts.delta == DeltaMode::Delta, "--delta"),
        (opts.delta == DeltaMode::Whole, "--whole-file"),
        (!opts.direct_io, "--buffered-io"),
    ];
    a.extend(
        flags
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, f)| f.to_string()),
    );
    a.push(format!("--threads={}", opts.threads));
    for p in opts.excludes.patterns() {
        a.push(format!("--exclude={p}"));
    }
    if let Some(r) = opts.bwlimit {
        a.push(format!("--bwlimit={r}"));
    }
    if let Some(t) = opts.timeout {
        a.push(format!("--timeout={}", t.as_secs_f64()));
    }
    a.push(format!("--compress={}", opts.compress));
    if let Some(d) = &opts.sig_cache {
        a.push(format!("--sig-cache={}", d.display()));
    }
    a.push("--".into());
    a.extend(paths.iter().cloned());
    a
}

/// The command that runs `words` (the remote ferry and its arguments) on
/// `host`: the `-e`/`--rsh` command split on spaces (as rsync does), the
/// host, then the words as one shell-quoted line (ssh hands it to the
/// remote shell). `None` when `rsh` is empty. The caller sets up the pipes.
pub fn rsh_command<S: AsRef<str>>(
    rsh: &str,
    host: &str,
    words: &[S],
) -> Option<std::process::Command> {
    let mut rsh = rsh.split_whitespace();
    let mut c = std::process::Command::new(rsh.next()?);
    let line: Vec<String> = words.iter().map(|w| shell_quote(w.as_ref())).collect();
    c.args(rsh).arg(host).arg(line.join(" "));
    Some(c)
}

/// Quote one word for a POSIX shell (ssh runs the command through one).
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./:=@%+,-".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/a/b-c.d"), "/a/b-c.d");
        assert_eq!(shell_quote("it's here"), r"'it'\''s here'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("*.tmp"), "'*.tmp'");
        let c = rsh_command("ssh -p 2222", "u@h", &["ferry", "recv", "--", "a b"]).unwrap();
        assert_eq!(c.get_program(), "ssh");
        let args: Vec<_> = c.get_args().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(args, ["-p", "2222", "u@h", "ferry recv -- 'a b'"]);
        assert!(rsh_command("  ", "h", &["x"]).is_none());
        assert_eq!(shell_quote("pool/ds@snap"), "pool/ds@snap");
        assert_eq!(shell_quote("a b"), "'a b'");
    }
}
