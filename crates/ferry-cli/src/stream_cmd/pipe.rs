//! `producer | ferry pipe [user@]host -- COMMAND ARGS...`: start `ferry
//! recv` on the other host through ssh with a fresh key, then send the
//! stream over a direct TCP connection to it, or through ssh when that
//! cannot be made (or with `--via-ssh`).

use ferry_core::remote::rsh_command;
use std::fs::File;
use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::{ChildStdin, ChildStdout};
use std::thread;
use std::time::{Duration, Instant};

use ferry_channel::Psk;
use ferry_stream::{ErrorKind, Options, StreamError, Summary};

use super::args::{options, PipeArgs, StreamOpts};
use super::report::{exit_code, json_to, report, JsonTo};
use super::ssh;
use super::{open_input, usage};
use crate::exit as code;
use crate::progress::{Progress, StreamMeter};

/// ssh went away before the stream started (the message is out).
struct LostRemote;

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
    let Some(cmd) = rsh_command(&a.rsh, &a.target, &ssh::remote_recv_words(&a)) else {
        return usage("--rsh is empty");
    };
    let rsh = cmd.get_program().to_string_lossy().into_owned();
    let (mut guard, mut ssh_in, mut ssh_out) = match ssh::spawn(cmd) {
        Ok(s) => s,
        Err(c) => return c,
    };
    let (cpu0, t0) = (ferry_stream::cpu_time(), Instant::now());
    let Some(port) = ssh::start_remote(
        &key,
        &mut ssh_in,
        &mut ssh_out,
        &rsh,
        &a.remote_ferry,
        a.o.timeout.map(Duration::from_secs_f64),
    ) else {
        return ssh::ssh_failed(&mut guard);
    };
    let host = ssh::target_host(&a.target);
    let direct = if a.via_ssh { None } else { connect(host, port) };
    let p = Progress::start(StreamMeter::new(opts.stats.clone()), a.o.progress, false);
    let res = match direct {
        Some(s) => send_direct(&opts, input, s, ssh_in, ssh_out),
        None => {
            if !a.via_ssh {
                errln!(
                    "ferry pipe: direct connection to {host}:{port} failed; sending through ssh"
                );
            }
            send_via_ssh(&opts, input, ssh_in, ssh_out)
        }
    };
    let Ok(res) = res else {
        return ssh::ssh_failed(&mut guard);
    };
    p.finish();
    let ssh_status = ssh::reap(&mut guard, res.is_err());
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
    let key = match Psk::generate_hex() {
        Ok(k) => k,
        Err(e) => {
            errln!("ferry pipe: {e}");
            return Err(code::IO);
        }
    };
    let psk = match Psk::new(key.as_bytes()) {
        Ok(p) => p,
        Err(e) => return Err(usage(&e.to_string())),
    };
    match options(o, psk) {
        Ok(opts) => Ok((key, opts)),
        Err(e) => Err(usage(&e)),
    }
}

/// The direct connection to the remote `ferry recv`, if one can be made.
fn connect(host: &str, port: u16) -> Option<TcpStream> {
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .and_then(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok())
}

/// Send over the direct connection `s`; the remote command's own output
/// comes back through ssh.
fn send_direct(
    opts: &Options,
    input: File,
    s: TcpStream,
    mut ssh_in: ChildStdin,
    mut ssh_out: ChildStdout,
) -> Result<Result<Summary, StreamError>, LostRemote> {
    if !ssh::choose_transport(&mut ssh_in, "tcp") {
        errln!("ferry pipe: lost the remote side");
        return Err(LostRemote);
    }
    drop(ssh_in);
    let _ = s.set_nodelay(true);
    // The remote command's own output comes back through ssh.
    let copier = thread::spawn(move || {
        let mut out = io::stdout();
        let _ = io::copy(&mut ssh_out, &mut out);
        let _ = out.flush();
    });
    let res = match (s.try_clone(), s.try_clone()) {
        (Ok(r), Ok(ctl)) => ferry_stream::send_over(
            opts,
            input,
            r,
            s,
            Some(Box::new(move || {
                let _ = ctl.shutdown(std::net::Shutdown::Both);
            })),
        ),
        _ => Err(StreamError::new(ErrorKind::Io, "socket clone failed")),
    };
    if res.is_ok() {
        let _ = copier.join();
    }
    Ok(res)
}

/// Send through ssh's own pipes (the remote `ferry recv` reads its stdin).
fn send_via_ssh(
    opts: &Options,
    input: File,
    mut ssh_in: ChildStdin,
    ssh_out: ChildStdout,
) -> Result<Result<Summary, StreamError>, LostRemote> {
    if !ssh::choose_transport(&mut ssh_in, "stdin") {
        errln!("ferry pipe: lost the remote side");
        return Err(LostRemote);
    }
    Ok(ferry_stream::send_over(opts, input, ssh_out, ssh_in, None))
}
