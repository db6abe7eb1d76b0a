//! Copies an NBD export to a file (or a file to an export) and prints the
//! time and statistics; used to compare with nbdcopy and qemu-img convert.
//!
//! `nbd_copy URI OUT [threads] [request_KiB] [in_flight] [segment_MiB]`
//! `nbd_copy --to-nbd IN URI [threads] [request_KiB] [in_flight] [segment_MiB]`

use std::fs::{File, OpenOptions};
use std::process::ExitCode;

use ferry_nbd::{copy_from_file_with, copy_to_file_with, Client, CopyOptions};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (to_nbd, rest) = match args.first().map(String::as_str) {
        Some("--to-nbd") => (true, &args[1..]),
        _ => (false, &args[..]),
    };
    if rest.len() < 2 {
        eprintln!("usage: nbd_copy URI OUT [threads] [request_KiB] [in_flight]\n       nbd_copy --to-nbd IN URI [threads] [request_KiB] [in_flight]");
        return ExitCode::from(2);
    }
    let num = |i: usize, d: usize| rest.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let opts = CopyOptions {
        threads: num(2, 2),
        request_size: num(3, 1024) * 1024,
        in_flight: num(4, 16),
        segment: num(5, 32) as u64 * 1024 * 1024,
        ..CopyOptions::default()
    };
    let r = if to_nbd {
        File::open(&rest[0])
            .map_err(|e| e.to_string())
            .and_then(|f| {
                let c = Client::connect(&rest[1]).map_err(|e| e.to_string())?;
                copy_from_file_with(&f, &c, &opts).map_err(|e| e.to_string())
            })
    } else {
        Client::connect(&rest[0])
            .map_err(|e| e.to_string())
            .and_then(|c| {
                let f = OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(false)
                    .open(&rest[1])
                    .map_err(|e| e.to_string())?;
                copy_to_file_with(&c, &f, &opts).map_err(|e| e.to_string())
            })
    };
    match r {
        Ok(st) => {
            println!("{:.3} s  {:?}", st.elapsed.as_secs_f64(), st);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nbd_copy: {e}");
            ExitCode::FAILURE
        }
    }
}
