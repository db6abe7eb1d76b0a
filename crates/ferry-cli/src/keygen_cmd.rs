//! `ferry keygen FILE`: a random 256-bit key for send/recv/pipe.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crate::exit;

#[derive(clap::Args, Debug)]
pub struct KeygenArgs {
    /// Where to write the key (64 hex digits, mode 0600). An existing file
    /// is never overwritten.
    pub file: PathBuf,
}

pub fn run(a: KeygenArgs) -> i32 {
    let key = match ferry_channel::generate_key_hex() {
        Ok(k) => k,
        Err(e) => {
            errln!("ferry keygen: {e}");
            return exit::IO;
        }
    };
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&a.file);
    let res = f.and_then(|mut f| {
        f.write_all(format!("{key}\n").as_bytes())?;
        f.sync_all()
    });
    match res {
        Ok(()) => exit::OK,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            errln!(
                "ferry keygen: {}: already exists; not overwritten",
                a.file.display()
            );
            exit::USAGE
        }
        Err(e) => {
            errln!(
                "ferry keygen: create {}: {}",
                a.file.display(),
                ferry_core::error::describe(&e)
            );
            exit::IO
        }
    }
}
