//! `producer | ferry send HOST:PORT [FILE]`.

use std::time::Instant;

use super::args::{options, read_key, SendArgs};
use super::report::{exit_code, json_to, report, JsonTo};
use super::{open_input, resolve, usage};
use crate::exit as code;
use crate::progress::{Progress, StreamMeter};

pub fn run_send(a: SendArgs) -> i32 {
    let key = match read_key(&a.o) {
        Ok(k) => k,
        Err(e) => return usage(&e),
    };
    let opts = match options(&a.o, key) {
        Ok(o) => o,
        Err(e) => return usage(&e),
    };
    let peer = match resolve(&a.dest) {
        Ok(p) => p,
        Err(e) => {
            errln!("ferry send: {e}");
            return code::CONNECTION;
        }
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
    let res = ferry_stream::send_file(&opts, input, peer);
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
