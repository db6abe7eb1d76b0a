//! `producer | ferry pipe [user@]host -- COMMAND ARGS...`: start `ferry
//! recv` on the other host through ssh with a fresh key, then send the
//! stream over a direct TCP connection to it, or through ssh when that
//! cannot be made (or with `--via-ssh`). The ssh spawner and the bootstrap
//! are `ferry_link`'s (`rsh`, and `direct` in its pipe dialect).

use std::fs::File;
use std::io::{self, Write};
use std::net::TcpStream;
use std::process::{ChildStdin, ChildStdout};
use std::thread;
use std::time::{Duration, Instant};

use ferry_link::direct::{self, DialError, Dialect, OfferError, Route};
use ferry_link::rsh::{self, RemoteChild, Stderr};
use ferry_stream::{Options, StreamError, Summary};

use super::args::{options, PipeArgs, StreamOpts};
use super::open_input;
use super::report::{exit_code, json_to, report, JsonTo};
use crate::exit as code;
use crate::progress::{Progress, StreamMeter};

pub fn run_pipe(a: PipeArgs) -> i32 {
    let (key, opts) = match session_key(&a.o) {
        Ok(k) => k,
        Err(c) => return c,
    };
    let input = match open_input(a.input.as_deref()) {
        Ok(i) => i,
        Err(e) => {
            errln!("ferry pipe: {e}");
            return code::IO;
        }
    };
    let ferry = match remote_ferry(&a) {
        Ok(f) => f,
        Err(c) => return c,
    };
    let cmd = match rsh::rsh_command(&a.rsh, &a.target, &remote_recv_words(&a, &ferry)) {
        Ok(cmd) => cmd,
        Err(e) => return super::usage(&e.to_string()),
    };
    let rsh = cmd.get_program().to_string_lossy().into_owned();
    let (mut child, mut ssh_in, mut ssh_out) = match rsh::spawn(cmd, Stderr::Inherit) {
        Ok(s) => s,
        Err(e) => {
            errln!("ferry pipe: {e}");
            return code::REMOTE;
        }
    };
    let (cpu0, t0) = (ferry_stream::cpu_time(), Instant::now());
    let host = rsh::host_name(&a.target);
    let dial = direct::Dial {
        dialect: Dialect::Pipe,
        host,
        key: Some(&key),
        wait: a.o.timeout.map(Duration::from_secs_f64),
        try_direct: !a.via_ssh,
    };
    let dialled = match dial.run(&mut ssh_in, &mut ssh_out) {
        Ok(d) => d,
        Err(e) => {
            drop((ssh_in, ssh_out));
            return remote_failed(child, &e, host, &rsh, &ferry, a.deploy.is_some());
        }
    };
    if let Route::ViaSsh(Some(_)) = &dialled.route {
        say_fell_back(host, dialled.offer.port);
    }
    let p = Progress::start(StreamMeter::new(opts.stats.clone()), a.o.progress, false);
    let res = match dialled.route {
        Route::Direct(s) => send_direct(&opts, input, s, ssh_in, ssh_out),
        Route::ViaSsh(_) => ferry_stream::send_file_over(&opts, input, ssh_out, ssh_in, None),
    };
    p.finish();
    // After a failed stream the remote gets a moment to report, then ssh
    // is killed.
    let grace = if res.is_ok() {
        Duration::MAX
    } else {
        Duration::from_millis(200)
    };
    let ssh_status = child.wait_with_grace(grace).ok().and_then(|s| s.code());
    let c = match &res {
        Ok(s) => s.remote_status.or(ssh_status).unwrap_or(code::OK),
        Err(e) => match e.remote_status {
            Some(s) if s != 0 => s,
            _ => exit_code(e, false),
        },
    };
    report(
        "pipe",
        &res,
        &opts.stats,
        cpu0,
        t0,
        json_to(a.o.json, JsonTo::Stdout),
        c,
    );
    c
}

/// A fresh key for this one stream (in hex, to hand to the remote side)
/// and the engine options that use it. On failure, the exit code.
fn session_key(o: &StreamOpts) -> Result<(String, Options), i32> {
    let (key, psk) = match direct::fresh_key() {
        Ok(k) => k,
        Err(e) => {
            errln!("ferry pipe: {e}");
            return Err(code::IO);
        }
    };
    match options(o, psk) {
        Ok(opts) => Ok((key, opts)),
        Err(e) => Err(super::usage(&e)),
    }
}

/// The ferry to run on the host: `--remote-ferry`, or with `--deploy`
/// the copy put there first. On failure, the exit code.
fn remote_ferry(a: &PipeArgs) -> Result<String, i32> {
    let Some(binary) = &a.deploy else {
        return Ok(a.remote_ferry.clone());
    };
    match ferry_core::remote::deploy::deploy(&a.rsh, &a.target, binary.as_deref()) {
        Ok(d) => {
            for n in d.notices {
                errln!("ferry pipe: note: {n}");
            }
            Ok(d.path)
        }
        Err(e) => {
            errln!("ferry pipe: {e}");
            Err(match e.class() {
                ferry_core::Class::Usage => code::USAGE,
                _ => code::REMOTE,
            })
        }
    }
}

/// The words that run `ferry recv` (`ferry`) on the remote host, in the
/// mode `pipe` drives: key on stdin, port announced on stdout.
fn remote_recv_words(a: &PipeArgs, ferry: &str) -> Vec<String> {
    let mut remote = vec![
        ferry.to_string(),
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

/// The remote side never started, or ssh went away before the stream
/// did: say why, reap ssh (its pipes are closed: a remote that is up
/// gets 10 s to notice and exit, one that said nothing in time none) and
/// exit with the documented code. ssh's own status (1 from `false`, 255
/// from ssh) would read as one of ferry's other codes, or as the remote
/// command's.
fn remote_failed(
    mut child: RemoteChild,
    e: &DialError,
    host: &str,
    rsh: &str,
    remote_ferry: &str,
    deployed: bool,
) -> i32 {
    let mut grace = Duration::from_secs(10);
    // The remote shell found no ferry (127), or could not run it (126):
    // said by its status, whichever way the dial noticed.
    if matches!(e, DialError::KeyNotTaken(_) | DialError::Offer(_))
        && !matches!(e, DialError::Offer(OfferError::TimedOut(_)))
    {
        let status = child.wait_for(Duration::from_secs(2)).ok().flatten();
        if let Some(c @ (126 | 127)) = status.and_then(|s| s.code()) {
            let e = ferry_core::Error::NoFerry {
                host: host.to_string(),
                ferry: remote_ferry.to_string(),
                found: c == 126,
                deployed,
                // Its own words went to our stderr already.
                said: String::new(),
            };
            errln!("ferry pipe: {e}");
            return code::REMOTE;
        }
    }
    match e {
        DialError::KeyNotTaken(_) => {
            errln!("ferry pipe: {rsh} exited before the remote ferry started")
        }
        DialError::Offer(OfferError::TimedOut(e)) => {
            grace = Duration::ZERO;
            errln!("ferry pipe: the remote side did not start: {e}");
        }
        DialError::Offer(e) => {
            let hint = if deployed {
                ""
            } else {
                "; run with --deploy to copy this ferry there"
            };
            errln!(
                "ferry pipe: the remote side did not start (is {remote_ferry} installed there? it said {:?}){hint}",
                e.said()
            )
        }
        DialError::Lost {
            offer, fell_back, ..
        } => {
            if fell_back.is_some() {
                say_fell_back(host, offer.port);
            }
            errln!("ferry pipe: lost the remote side");
        }
    }
    let _ = child.wait_with_grace(grace);
    code::REMOTE
}

/// Say that the stream goes through ssh after all.
fn say_fell_back(host: &str, port: u16) {
    errln!("ferry pipe: direct connection to {host}:{port} failed; sending through ssh");
}

/// Send over the direct connection `s` (the remote side has been told);
/// the remote command's own output comes back through ssh.
fn send_direct(
    opts: &Options,
    input: File,
    s: TcpStream,
    ssh_in: ChildStdin,
    mut ssh_out: ChildStdout,
) -> Result<Summary, StreamError> {
    drop(ssh_in);
    let copier = thread::spawn(move || {
        let mut out = io::stdout();
        let _ = io::copy(&mut ssh_out, &mut out);
        let _ = out.flush();
    });
    let res = ferry_stream::send_file_on(opts, input, s);
    if res.is_ok() {
        let _ = copier.join();
    }
    res
}
