//! What the user sees of a stream at its end: the summary line, the `--json` object, and the exit code an error maps to.

use std::time::{Duration, Instant};

use ferry_stream::{ErrorKind, Stats, StreamError, Summary};

use crate::exit as code;
use crate::human;

pub(super) fn exit_code(e: &StreamError, receiving: bool) -> i32 {
    match e.kind {
        ErrorKind::Usage => code::USAGE,
        ErrorKind::Io
        | ErrorKind::ConsumerExited
        | ErrorKind::PeerConsumerExited
        | ErrorKind::ProducerFailed => code::IO,
        ErrorKind::Integrity => code::PROTOCOL,
        ErrorKind::PeerKilled if receiving => code::PROTOCOL,
        ErrorKind::WrongKey => code::AUTH,
        ErrorKind::PeerKilled
        | ErrorKind::TimedOut
        | ErrorKind::AddrInUse
        | ErrorKind::Unreachable => code::CONNECTION,
    }
}

fn kind_name(k: ErrorKind) -> &'static str {
    match k {
        ErrorKind::Usage => "usage",
        ErrorKind::WrongKey => "wrong_key",
        ErrorKind::AddrInUse => "address_in_use",
        ErrorKind::Unreachable => "unreachable",
        ErrorKind::ConsumerExited => "consumer_exited",
        ErrorKind::PeerConsumerExited => "peer_consumer_exited",
        ErrorKind::ProducerFailed => "producer_failed",
        ErrorKind::PeerKilled => "peer_lost",
        ErrorKind::Integrity => "integrity",
        ErrorKind::Io => "io",
        ErrorKind::TimedOut => "timeout",
    }
}

/// Where `--json` goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum JsonTo {
    Stdout,
    Stderr,
}

pub(super) fn json_to(json: bool, to: JsonTo) -> Option<JsonTo> {
    json.then_some(to)
}

pub(super) fn report(
    what: &str,
    res: &Result<Summary, StreamError>,
    stats: &Stats,
    cpu0: Duration,
    t0: Instant,
    json: Option<JsonTo>,
    code: i32,
) {
    let cpu = ferry_stream::cpu_time().saturating_sub(cpu0).as_secs_f64();
    let secs = t0.elapsed().as_secs_f64().max(1e-6);
    let bytes = match res {
        Ok(s) => s.bytes,
        Err(_) => Stats::get(&stats.plain_out),
    };
    let wire = Stats::get(&stats.wire);
    let resumed = Stats::get(&stats.resumed);
    let moved = bytes.saturating_sub(resumed);
    let resumed_text = if resumed > 0 {
        format!(
            " ({} resumed from an interrupted run)",
            human::bytes(resumed)
        )
    } else {
        String::new()
    };
    match res {
        Ok(s) => errln!(
            "summary: {} {what}{resumed_text} in {:.1} s - average of {}, {} on the wire (ratio {:.2}), cpu {:.1} s, {}",
            human::bytes(bytes),
            secs,
            human::rate(moved, secs),
            human::bytes(wire),
            stats.ratio(),
            cpu,
            s.suite
        ),
        Err(e) => errln!("ferry {what}: error: {e}"),
    }
    if let Some(to) = json {
        let (ok, err, kind) = match res {
            Ok(_) => (true, None, None),
            Err(e) => (false, Some(e.msg.clone()), Some(kind_name(e.kind))),
        };
        let v = serde_json::json!({
            "command": what,
            "ok": ok,
            "exit_code": code,
            "bytes": bytes,
            "wire_bytes": wire,
            "connections": Stats::get(&stats.connections),
            "ratio": stats.ratio(),
            "seconds": secs,
            "bytes_resumed": resumed,
            "bytes_per_second": moved as f64 / secs,
            "cpu_seconds": cpu,
            "blocks": {
                "raw": Stats::get(&stats.blocks_raw),
                "lz4": Stats::get(&stats.blocks_lz4),
                "zstd": Stats::get(&stats.blocks_zstd),
            },
            "blake3": res.as_ref().ok().map(|s| s.blake3.clone()),
            "cipher": res.as_ref().ok().map(|s| s.suite.clone()),
            "remote_status": match res { Ok(s) => s.remote_status, Err(e) => e.remote_status },
            "error": err,
            "error_kind": kind,
        });
        if to == JsonTo::Stderr {
            errln!("{v}");
        } else {
            outln!("{v}");
        }
    }
}
