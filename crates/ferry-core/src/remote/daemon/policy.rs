//! Which arguments a daemon takes from a client, and what it makes of the
//! request: decisions as plain functions.
//!
//! A client of a daemon holds the key but not the host: it may say how to
//! sync (the engine's options) but not name anything on the daemon's host
//! beyond the paths it syncs, which [`super::confine`] keeps beneath the
//! root. So options that name server-side files (`--link-dest`,
//! `--sig-cache`, `--partial-dir`, merge filters, `--*-from` files) are
//! refused, as is everything not listed here; the rest is the command line
//! [`crate::remote::serve_args`] writes.

use super::{DaemonConfig, Request, Target};
use crate::SyncOptions;

/// Flags taken as they are.
const FLAGS: &[&str] = &[
    "--stdio",
    "--send",
    "--receive",
    "--file-or-dir",
    "--delete",
    "--force",
    "--sparsify",
    "--discard",
    "--ignore-errors",
    "--no-fsync",
    "--verify",
    "--checksum",
    "--dry-run",
    "--inplace",
    "--xattrs",
    "--acls",
    "--numeric-ids",
    "--no-perms",
    "--no-times",
    "--no-owner",
    "--no-group",
    "--no-hard-links",
    "--no-links",
    "--no-recursive",
    "--no-root-entry",
    "--one-file-system",
    "--specials",
    "--list-changes",
    "--update",
    "--ignore-existing",
    "--delta",
    "--whole-file",
    "--buffered-io",
    "--no-partial",
    "--delete-excluded",
    "--backup",
];

/// Options taken with a value (`--name=value`).
const VALUED: &[&str] = &[
    "--threads=",
    "--max-delete=",
    "--chmod=",
    "--suffix=",
    "--min-size=",
    "--max-size=",
    "--bwlimit=",
    "--timeout=",
    "--compress=",
    "--chown=",
];

/// A `recv` request (already allowed by [`check`]): a stream into the one
/// path after `--`; a `send` request: a stream of it, to the client.
pub fn stream_request(args: &[String]) -> Result<Request, Refusal> {
    let at = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let [path] = &args[(at + 1).min(args.len())..] else {
        return Err(Refusal::Usage("a stream names one file".into()));
    };
    Ok(Request {
        send: args.first().is_some_and(|a| a == "send"),
        file_or_dir: false,
        paths: vec![path.clone()],
        opts: SyncOptions {
            partial: !args[..at].iter().any(|a| a == "--no-resume"),
            ..SyncOptions::default()
        },
        stream: true,
    })
}

/// Most paths one pull may name.
pub const MAX_PATHS: usize = 64;

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An argument the daemon does not take, or a malformed command line.
    #[error("{0}")]
    Usage(String),
    /// The daemon does not serve this direction.
    #[error("{0}")]
    Direction(String),
}

/// Check a client's `serve` command line: `serve`, then only the flags and
/// options above, a `--filter=` that is an include, an exclude or `!`,
/// then `--` and the paths.
pub fn check(args: &[String]) -> Result<(), Refusal> {
    let mut it = args.iter();
    let (flags, valued): (&[&str], &[&str]) = match it.next().map(String::as_str) {
        Some("serve") => (FLAGS, VALUED),
        // A stream into one file: whether to offer what it holds.
        Some("recv") => (&["--no-resume"], &[]),
        // A stream of one file, to the client.
        Some("send") => (&[], &[]),
        _ => {
            return Err(Refusal::Usage(
                "a daemon request starts with `serve` or `recv`".into(),
            ))
        }
    };
    for a in it.by_ref() {
        let a = a.as_str();
        if a == "--" {
            return Ok(());
        }
        if flags.contains(&a) || valued.iter().any(|p| a.starts_with(p)) {
            continue;
        }
        if let Some(rule) = a.strip_prefix("--filter=") {
            if rule == "!" || rule.starts_with("+ ") || rule.starts_with("- ") {
                continue;
            }
        }
        let name = a.split('=').next().unwrap_or(a);
        return Err(Refusal::Usage(format!(
            "the daemon does not take {name:?} from a client{}",
            hint(name)
        )));
    }
    Err(Refusal::Usage(
        "a daemon request ends with `--` and its paths".into(),
    ))
}

fn hint(name: &str) -> &'static str {
    match name {
        "--link-dest" | "--sig-cache" | "--partial-dir" => {
            " (it names a path on the daemon's host; the daemon's operator sets what it may use)"
        }
        "--filter" => {
            " (merge rules would read files on the daemon's host; send the rules themselves)"
        }
        "--direct" => " (a daemon connection is already direct)",
        _ => "",
    }
}

/// Fit a parsed request to the daemon: the direction allowed, the paths
/// a device daemon serves, the session timeout, threads at most the cores.
pub fn fit(mut r: Request, cfg: &DaemonConfig, cores: usize) -> Result<Request, Refusal> {
    if r.send && !cfg.allow_send {
        return Err(Refusal::Direction(
            "this daemon is write-only: it takes pushes, not pulls".into(),
        ));
    }
    if !r.send && !cfg.allow_receive {
        return Err(Refusal::Direction(
            "this daemon is read-only: it serves pulls, not pushes".into(),
        ));
    }
    if !cfg.allow_send {
        // What a write-only daemon holds is not told, not even as the
        // changes a push makes (or, with --dry-run, would make), nor as
        // the digests of its old copies that a delta's signature or the
        // check of a touched file would send.
        r.opts.list_changes = false;
        r.opts.delta = crate::DeltaMode::Whole;
    }
    if r.send && r.paths.is_empty() {
        return Err(Refusal::Usage("a pull names at least one path".into()));
    }
    if r.stream {
        if matches!(cfg.target, Target::Device(_)) {
            return Err(Refusal::Usage(
                "a device daemon takes sync sessions, not streams".into(),
            ));
        }
        if r.paths.len() != 1 {
            return Err(Refusal::Usage("a stream goes into one file".into()));
        }
    }
    // Each path holds a directory handle for the session.
    let mut seen = std::collections::HashSet::new();
    r.paths.retain(|p| seen.insert(p.clone()));
    if r.paths.len() > MAX_PATHS {
        return Err(Refusal::Usage(format!(
            "a pull names at most {MAX_PATHS} paths (this one {}); pull their parent",
            r.paths.len()
        )));
    }
    if !r.send && r.paths.len() != 1 {
        return Err(Refusal::Usage("a push names one destination".into()));
    }
    if let Target::Device(dev) = &cfg.target {
        if r.opts.backup.is_some() {
            // The backup would be a file beside the device, named by the
            // client: the operator's files are there.
            return Err(Refusal::Usage(
                "--backup is not available on a device daemon".into(),
            ));
        }
        if r.paths
            .iter()
            .any(|p| !super::confine::components(p).is_ok_and(|c| c.is_empty()))
        {
            return Err(Refusal::Usage(
                "this daemon serves one device: name no path (ferry://host:port/)".into(),
            ));
        }
        r.paths = vec![dev.to_string_lossy().into_owned()];
        r.file_or_dir = true;
        r.opts.partial_dir = cfg.partial_dir.clone();
    }
    r.opts.timeout = match (r.opts.timeout, cfg.timeout) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    r.opts.threads = r.opts.threads.clamp(1, cores.max(1));
    r.opts.untrusted_sender = true;
    r.opts.hello_wait = Some(super::server::REQUEST_WAIT);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn what_serve_args_writes_is_taken() {
        let opts = crate::SyncOptions {
            delete: true,
            backup: Some("~".into()),
            max_delete: Some(3),
            excludes: crate::Excludes::from_rules(&[crate::FilterRule::exclude("*.o")]).unwrap(),
            ..Default::default()
        };
        let args = crate::remote::serve_args(&opts, false, true, &["d".into()]);
        assert_eq!(check(&args), Ok(()));
    }

    #[test]
    fn server_side_paths_and_strangers_are_refused() {
        for bad in [
            &["serve", "--link-dest=/etc", "--", "x"][..],
            &["serve", "--sig-cache=/tmp", "--", "x"],
            &["serve", "--partial-dir=/", "--", "x"],
            &["serve", "--filter=. /etc/shadow", "--", "x"],
            &["serve", "--filter=merge /etc/shadow", "--", "x"],
            &["serve", "--exclude-from=/etc/shadow", "--", "x"],
            &["serve", "--files-from", "/etc/passwd", "--", "x"],
            &["serve", "--direct", "--", "x"],
            &["serve", "--receive", "x"],
            &["sync", "--", "x"],
            &[],
        ] {
            assert!(check(&v(bad)).is_err(), "{bad:?}");
        }
    }

    fn cfg(target: Target) -> DaemonConfig {
        DaemonConfig {
            target,
            allow_send: true,
            allow_receive: false,
            max_sessions: 4,
            once: false,
            timeout: Some(Duration::from_secs(60)),
            partial_dir: Some("/var/lib/j".into()),
        }
    }

    fn req(send: bool, paths: &[&str]) -> Request {
        Request {
            send,
            file_or_dir: false,
            paths: v(paths),
            opts: crate::SyncOptions {
                threads: 512,
                timeout: Some(Duration::from_secs(600)),
                ..Default::default()
            },
            stream: false,
        }
    }

    #[test]
    fn stream_requests() {
        assert!(check(&v(&["recv", "--", "backup.zfs"])).is_ok());
        assert!(check(&v(&["recv", "--no-resume", "--", "x"])).is_ok());
        // Nothing of a sync's options, nothing else.
        assert!(check(&v(&["recv", "--delete", "--", "x"])).is_err());
        assert!(check(&v(&["recv", "--listen=0.0.0.0:1", "--", "x"])).is_err());
        let r = stream_request(&v(&["recv", "--no-resume", "--", "a/b"])).unwrap();
        assert!(r.stream && !r.send && !r.opts.partial && r.paths == ["a/b"]);
        assert!(stream_request(&v(&["recv", "--", "a", "b"])).is_err());
        assert!(stream_request(&v(&["recv", "--"])).is_err());
        let out = stream_request(&v(&["send", "--", "pool.zfs"])).unwrap();
        assert!(out.stream && out.send);
        assert!(check(&v(&["send", "--no-resume", "--", "x"])).is_err());
        let mut c = cfg(Target::Root("/srv".into()));
        c.allow_receive = true;
        assert!(fit(r.clone(), &c, 2).is_ok());
        c.allow_receive = false;
        assert!(matches!(fit(r.clone(), &c, 2), Err(Refusal::Direction(_))));
        let mut dev = cfg(Target::Device("/dev/x".into()));
        dev.allow_receive = true;
        assert!(fit(r, &dev, 2).is_err());
    }

    #[test]
    fn requests_fit_the_daemon() {
        let c = cfg(Target::Root("/srv".into()));
        assert!(matches!(
            fit(req(false, &["d"]), &c, 2),
            Err(Refusal::Direction(_))
        ));
        let r = fit(req(true, &["d"]), &c, 2).unwrap();
        assert_eq!(r.opts.threads, 2);
        assert_eq!(r.opts.timeout, Some(Duration::from_secs(60)));
        let d = cfg(Target::Device("/dev/vdb".into()));
        let r = fit(req(true, &["/"]), &d, 8).unwrap();
        assert_eq!(r.paths, v(&["/dev/vdb"]));
        assert!(r.file_or_dir && r.opts.partial_dir.is_some());
        assert!(fit(req(true, &["etc/passwd"]), &d, 8).is_err());
        let many: Vec<String> = (0..=MAX_PATHS).map(|i| format!("p{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(fit(req(true, &many), &c, 2).is_err());
        let dup = fit(req(true, &["a", "a", "b", "a"]), &c, 2).unwrap();
        assert_eq!(dup.paths, v(&["a", "b"]));
        let mut backup = req(false, &[""]);
        backup.opts.backup = Some(".conf".into());
        let mut d = cfg(Target::Device("/srv/disk.img".into()));
        d.allow_receive = true;
        assert!(fit(backup, &d, 8).is_err(), "a backup beside the device");
        assert!(fit(req(false, &[""]), &d, 8).unwrap().opts.untrusted_sender);
        // Write-only: nothing of what it holds goes back, not even digests.
        let mut w = cfg(Target::Root("/srv".into()));
        (w.allow_send, w.allow_receive) = (false, true);
        let r = fit(req(false, &["d"]), &w, 2).unwrap();
        assert!(!r.opts.list_changes);
        assert_eq!(r.opts.delta, crate::DeltaMode::Whole);
    }
}
