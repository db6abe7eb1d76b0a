//! `ferry serve --listen`: the daemon's options, the parser its sessions'
//! requests go through, and its exit (with `--once`, the one session's).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, CommandFactory, FromArgMatches, Parser};
use ferry_core::remote::daemon::confine::printable;
use ferry_core::remote::daemon::{self, DaemonConfig, Request, SessionEnd, Target};

/// Longest log line (a pull may name many paths).
const MAX_LOG_LINE: usize = 2000;

/// A session's link silent this long is dead, unless `--timeout` says
/// otherwise: a client that vanished (a partition, a killed Pod) must not
/// hold its slot for ever.
const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

use crate::exit;
use crate::sync_cmd::class_code;

#[derive(Args, Debug, Default)]
pub struct DaemonArgs {
    /// Run as a daemon listening on ADDR:PORT (port 0: any free one; the
    /// "listening on" line on stderr says which). Clients connect with
    /// `ferry sync ... ferry://HOST:PORT/PATH --key-file FILE`. A session
    /// whose client is silent for --timeout seconds (default 300) ends;
    /// pushes are served one at a time, pulls side by side.
    #[arg(long, value_name = "ADDR:PORT", conflicts_with = "stdio")]
    pub listen: Option<String>,
    /// The key clients must prove (from `ferry keygen`). Default:
    /// $FERRY_KEY_FILE, else $FERRY_KEY.
    #[arg(long, value_name = "FILE", requires = "listen")]
    pub key_file: Option<PathBuf>,
    /// Serve sync pushes and pulls of paths beneath DIR, and nothing else.
    #[arg(
        long,
        value_name = "DIR",
        requires = "listen",
        conflicts_with = "device"
    )]
    pub root: Option<PathBuf>,
    /// Serve this block device or image as the one endpoint (clients name
    /// no path: ferry://HOST:PORT/).
    #[arg(long, value_name = "PATH", requires = "listen")]
    pub device: Option<PathBuf>,
    /// Serve pulls only.
    #[arg(long, requires = "listen", conflicts_with = "write_only")]
    pub read_only: bool,
    /// Serve pushes only.
    #[arg(long, requires = "listen")]
    pub write_only: bool,
    /// Exit after the first client that proves the key, with its session's
    /// exit code (a Kubernetes Job).
    #[arg(long, requires = "listen")]
    pub once: bool,
    /// Sessions at once; further clients are told the daemon is busy.
    #[arg(long, value_name = "N", default_value_t = 8, requires = "listen")]
    pub max_sessions: usize,
    /// Also write each session's outcome line to FILE (Kubernetes:
    /// /dev/termination-log), replacing what it held.
    #[arg(long, value_name = "FILE", requires = "listen")]
    pub termination_log: Option<PathBuf>,
    /// One JSON object a second on stderr for each session under way
    /// (`session`: the peer and what it asked; bytes done and in all,
    /// rate, ETA, phase, files), and one when it ends.
    #[arg(long, value_name = "FORMAT", num_args = 0..=1, require_equals = true,
          default_missing_value = "json", value_parser = ["json"], requires = "listen")]
    pub progress: Option<String>,
}

/// Run the daemon; returns the exit code (`--once`), or never.
pub fn run(
    d: &DaemonArgs,
    timeout: Option<std::time::Duration>,
    partial_dir: Option<PathBuf>,
) -> i32 {
    let fail = |m: String| {
        errln!("ferry serve: {m}");
        exit::USAGE
    };
    let Some(listen) = &d.listen else {
        return fail("--listen is required".into());
    };
    let target = match (&d.root, &d.device) {
        (Some(r), None) => Target::Root(r.clone()),
        (None, Some(dev)) => {
            // It must be there, as a file or a block device: a push must
            // not make a directory tree where the device should be.
            use std::os::unix::fs::FileTypeExt;
            match std::fs::metadata(dev) {
                Ok(m) if m.is_file() || m.file_type().is_block_device() => {}
                Ok(_) => {
                    return fail(format!(
                        "--device {}: not a regular file or a block device",
                        dev.display()
                    ))
                }
                Err(e) => return fail(format!("--device {}: {e}", dev.display())),
            }
            Target::Device(dev.clone())
        }
        _ => return fail("give exactly one of --root DIR and --device PATH".into()),
    };
    if d.max_sessions == 0 {
        return fail("--max-sessions must be at least 1".into());
    }
    let psk = match crate::key::read_key(d.key_file.as_deref()) {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    let listener = match std::net::TcpListener::bind(listen.as_str()) {
        Ok(l) => l,
        Err(e) => {
            errln!("ferry serve: cannot listen on {listen}: {e}");
            return exit::CONNECTION;
        }
    };
    let cfg = DaemonConfig {
        target,
        allow_send: !d.write_only,
        allow_receive: !d.read_only,
        max_sessions: if d.once { 1 } else { d.max_sessions },
        once: d.once,
        timeout: timeout.or(Some(DEFAULT_TIMEOUT)),
        partial_dir,
    };
    match listener.local_addr() {
        Ok(a) => errln!("ferry serve: listening on {a}"),
        Err(_) => errln!("ferry serve: listening on {listen}"),
    }
    let log: Arc<daemon::Log> = Arc::new(|line: &str| {
        let mut l = printable(line);
        if l.len() > MAX_LOG_LINE {
            let mut end = MAX_LOG_LINE;
            while !l.is_char_boundary(end) {
                end -= 1;
            }
            l.truncate(end);
            l.push_str(" ...");
        }
        errln!("ferry serve: {l}")
    });
    let watch: Option<Arc<daemon::Watch>> = d.progress.as_ref().map(|_| {
        let w: Arc<daemon::Watch> = Arc::new(|session: &str, stats| {
            let p = crate::progress::Progress::start_json_as(
                crate::progress::SyncMeter(stats),
                Some(printable(session)),
            );
            Box::new(move || p.finish())
        });
        w
    });
    // Streams go into files beneath a root (a device daemon takes syncs).
    let root = matches!(cfg.target, daemon::Target::Root(_));
    let stream = root.then(|| crate::stream_cmd::daemon_receiver(psk.clone(), cfg.timeout));
    let stream_out = root.then(|| crate::stream_cmd::daemon_sender(psk.clone(), cfg.timeout));
    let hooks = daemon::Hooks {
        watch,
        stream,
        stream_out,
    };
    match daemon::serve_daemon(listener, psk, cfg, Arc::new(parse_request), log, hooks) {
        Ok(end) => {
            if let Some(p) = &d.termination_log {
                write_termination_log(p, &end);
            }
            end_code(&end)
        }
        Err(e) => {
            errln!("ferry serve: {e}");
            class_code(e.class())
        }
    }
}

/// The exit code of a session as the daemon saw it.
fn end_code(end: &SessionEnd) -> i32 {
    match &end.result {
        Ok(r) if r.files_failed > 0 => exit::PARTIAL,
        Ok(r) if r.files_vanished > 0 => exit::VANISHED,
        Ok(_) => exit::OK,
        Err(e) => class_code(e.class()),
    }
}

fn write_termination_log(p: &std::path::Path, end: &SessionEnd) {
    let line = format!("{} (exit {})\n", end.line(), end_code(end));
    let res = std::fs::File::create(p).and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = res {
        errln!("ferry serve: --termination-log {}: {e}", p.display());
    }
}

#[derive(Parser)]
#[command(name = "serve", no_binary_name = false)]
struct RequestLine {
    #[command(flatten)]
    a: crate::serve_cmd::ServeArgs,
}

/// A client's `serve` command line as a request, parsed by the same
/// definitions as `serve --stdio`'s.
fn parse_request(args: &[String]) -> Result<Request, String> {
    let m = RequestLine::command()
        .try_get_matches_from(args)
        .map_err(|e| first_line(&e.to_string()))?;
    let mut line = RequestLine::from_arg_matches(&m).map_err(|e| first_line(&e.to_string()))?;
    line.a.engine.order_rules(&m);
    line.a.request()
}

/// clap's error without its usage and help lines: the first line, and
/// the indented lines that name what is missing.
fn first_line(s: &str) -> String {
    let mut lines = s.lines();
    let mut out = lines
        .next()
        .unwrap_or("bad request")
        .trim_start_matches("error: ")
        .to_string();
    for l in lines.take_while(|l| !l.starts_with("Usage")) {
        let l = l.trim();
        if !l.is_empty() {
            out.push(' ');
            out.push_str(l);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_client_sends_parses_as_its_request() {
        let opts = ferry_core::SyncOptions {
            delete: true,
            ..Default::default()
        };
        let args = ferry_core::remote::serve_args(&opts, true, false, &["a/".into(), "b".into()]);
        let r = parse_request(&args).unwrap();
        assert!(r.send && r.opts.delete);
        assert_eq!(r.paths, vec!["a/".to_string(), "b".to_string()]);
        assert!(parse_request(&["serve".into(), "--bogus".into()]).is_err());
        let missing = parse_request(&["serve".into(), "--send".into()]).unwrap_err();
        assert!(
            missing.contains("<PATHS>") && !missing.contains('\n'),
            "{missing}"
        );
    }
}
