//! `producer | ferry send HOST:PORT [FILE]`.

use ferry_link::stripe::Conn;
use std::time::Instant;

use super::args::{options, read_key, SendArgs};
use super::report::{exit_code, json_to, report, JsonTo};
use super::{open_input, resolve, usage};
use crate::exit as code;
use crate::progress::{Progress, StreamMeter};

/// Where `send` sends.
enum To {
    Recv(std::net::SocketAddr),
    Daemon(ferry_core::remote::daemon::DaemonUrl),
}

/// Ask the daemon at `u` to take a stream into its path; the session's
/// connections once it has accepted.
fn to_daemon(
    opts: &ferry_stream::Options,
    u: &ferry_core::remote::daemon::DaemonUrl,
    no_resume: bool,
) -> Result<Conn, ferry_core::Error> {
    let mut args = vec!["recv".to_string()];
    if no_resume {
        args.push("--no-resume".into());
    }
    args.extend(["--".to_string(), u.path.clone()]);
    ferry_core::remote::daemon::daemon_stream(&u.host, u.port, &opts.key, &args, opts.streams)
}

pub fn run_send(a: SendArgs) -> i32 {
    let key = match read_key(&a.o) {
        Ok(k) => k,
        Err(e) => return usage(&e),
    };
    let opts = match options(&a.o, key) {
        Ok(o) => o,
        Err(e) => return usage(&e),
    };
    // A daemon (ferry://HOST:PORT/PATH) or a `ferry recv --listen`.
    let to = match ferry_core::remote::daemon::parse_url(&a.dest) {
        Some(Ok(u)) => To::Daemon(u),
        Some(Err(e)) => return usage(&e),
        None => match resolve(&a.dest) {
            Ok(p) => To::Recv(p),
            Err(e) => {
                errln!("ferry send: {e}");
                return code::CONNECTION;
            }
        },
    };
    let input = match open_input(a.file.as_deref()) {
        Ok(i) => i,
        Err(e) => {
            errln!("ferry send: {e}");
            return code::IO;
        }
    };
    let (cpu0, t0) = (ferry_stream::cpu_time(), Instant::now());
    let p = Progress::start(StreamMeter::new(opts.stats.clone()), a.o.progress, false);
    let res = match to {
        To::Recv(peer) => ferry_stream::send_file(&opts, input, peer),
        To::Daemon(u) => match to_daemon(&opts, &u, a.no_resume) {
            Ok(conn) => ferry_stream::send_file_conn(&opts, input, &conn),
            Err(e) => {
                p.finish();
                errln!("ferry send: {e}");
                return crate::sync_cmd::class_code(e.class());
            }
        },
    };
    p.finish();
    let c = match &res {
        Ok(_) => code::OK,
        Err(e) => exit_code(e, false),
    };
    report(
        "send",
        &res,
        &opts.stats,
        cpu0,
        t0,
        json_to(a.o.json, JsonTo::Stdout),
        c,
    );
    c
}
