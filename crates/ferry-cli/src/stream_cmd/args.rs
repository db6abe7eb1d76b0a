//! The command lines of `send`, `recv` and `pipe`, and the engine
//! [`Options`] and key they turn into.

use std::path::PathBuf;
use std::time::Duration;

use ferry_channel::Psk;
use ferry_stream::{Mode, Options};

/// Options shared by the three commands.
#[derive(clap::Args, Debug, Clone)]
pub struct StreamOpts {
    /// Read the pre-shared key from this file (at least 16 bytes after
    /// trimming whitespace, e.g. 32 hex digits). Default: $FERRY_KEY_FILE,
    /// else $FERRY_KEY (the key itself).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Compression: auto (chosen per block from measured CPU and link
    /// speed), none, lz4, zstd or zstd:LEVEL.
    #[arg(long, default_value = "auto", value_name = "MODE")]
    pub compress: String,
    /// Memory buffer on each side (e.g. 256M, 1G).
    #[arg(short = 'm', long, default_value = "256M", value_name = "SIZE")]
    pub buffer: String,
    /// Block size (4K to 1M): the unit of compression and framing.
    #[arg(long, default_value = "1M", value_name = "SIZE")]
    pub block_size: String,
    /// Show the status line even when stderr is not a terminal.
    #[arg(long)]
    pub progress: bool,
    /// Print one JSON object with the result at the end.
    #[arg(long)]
    pub json: bool,
    /// A peer that sends nothing, not even a keepalive (each side sends one
    /// after 1 s with nothing to say), for this many seconds is dead (exit
    /// 5); at least 2. recv also waits at most this long for a sender that
    /// proves the key. Default: no limit.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// send, pipe, and recv --from a daemon: stripe the stream over N TCP
    /// connections (1 to 16), for links where one TCP flow cannot fill the
    /// pipe (a long round trip, loss). auto: 1 below 5 ms round trip, 4
    /// below 20 ms, else 8. recv --listen takes what the sender opens.
    #[arg(long, default_value = "auto", value_name = "N")]
    pub streams: ferry_link::stripe::Streams,
}

/// `producer | ferry send HOST:PORT [FILE]`
#[derive(clap::Args, Debug)]
pub struct SendArgs {
    /// The receiver: a `ferry recv --listen ...` as HOST:PORT, or a daemon
    /// (`ferry serve --listen --root DIR`) as ferry://HOST[:PORT]/PATH,
    /// which writes the stream into PATH beneath its root (with the
    /// daemon's key).
    pub dest: String,
    /// With a daemon: start PATH over instead of offering what it holds
    /// for a resume.
    #[arg(long)]
    pub no_resume: bool,
    /// Read this file instead of stdin.
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub o: StreamOpts,
}

/// `ferry recv --listen ADDR:PORT [FILE] | consumer`
#[derive(clap::Args, Debug)]
pub struct RecvArgs {
    /// Address to listen on, e.g. 0.0.0.0:9000 (port 0: any free port).
    #[arg(
        long,
        value_name = "ADDR:PORT",
        required_unless_present = "from",
        conflicts_with = "from"
    )]
    pub listen: Option<String>,
    /// Fetch the file PATH from a daemon (`ferry serve --listen --root
    /// DIR`, with its key) as a stream, instead of waiting for a sender.
    #[arg(long, value_name = "ferry://HOST[:PORT]/PATH")]
    pub from: Option<String>,
    /// Write the stream to this file instead of stdout.
    #[arg(conflicts_with = "command")]
    pub file: Option<PathBuf>,
    /// Truncate FILE instead of offering what it holds to the sender: by
    /// default, a FILE that an interrupted run left part of is resumed
    /// when the sender reads a regular file and its first bytes are the
    /// same (checked with BLAKE3 on both sides).
    #[arg(long)]
    pub no_resume: bool,
    /// Read the key as the first line of stdin (used by `ferry pipe`).
    #[arg(long, hide = true)]
    pub key_stdin: bool,
    /// Print `FERRY-PORT <port>` on stdout once listening, then read the
    /// transport (`tcp` or `stdin`) as a line from stdin (used by `ferry pipe`).
    #[arg(long, hide = true)]
    pub announce: bool,
    /// Run COMMAND with the stream as its stdin; exit with its status.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
    #[command(flatten)]
    pub o: StreamOpts,
}

/// `producer | ferry pipe [user@]host -- COMMAND ARGS...`
#[derive(clap::Args, Debug)]
pub struct PipeArgs {
    /// Where to run COMMAND, as for ssh: [user@]host.
    pub target: String,
    /// The command that reads the stream on the remote host.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
    /// Read this file instead of stdin.
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Remote shell used to start the remote side.
    ///
    /// Where COMMAND is OpenSSH's ssh and neither it (`-c`, `-o Ciphers`)
    /// nor an ssh_config chooses the ciphers, and this CPU has AES
    /// instructions, ferry passes ssh its default cipher list with AES-GCM
    /// first (nothing added or removed; the server still picks what it
    /// allows): faster than the default ChaCha20-Poly1305 there. It finds
    /// out with `ssh -V` and `ssh -G` (which run ssh_config's `Match exec`
    /// tests once more), and only when every word after `ssh` is an ssh
    /// option. For a server without AES instructions, choose with `-c`.
    #[arg(short = 'e', long, default_value = "ssh", value_name = "COMMAND")]
    pub rsh: String,
    /// Path of ferry on the remote host.
    #[arg(long, default_value = "ferry", value_name = "PATH")]
    pub remote_ferry: String,
    /// For a host with no ferry (or another version): upload this ferry
    /// (or the binary at PATH) over ssh into the host's ~/.cache/ferry,
    /// reused by later runs, and run it from there (as `sync --deploy`).
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true,
          conflicts_with = "remote_ferry")]
    pub deploy: Option<Option<PathBuf>>,
    /// Carry the data through ssh instead of a direct TCP connection.
    #[arg(long)]
    pub via_ssh: bool,
    /// Address the remote side listens on for the direct connection.
    #[arg(long, default_value = "0.0.0.0", value_name = "ADDR")]
    pub remote_listen: String,
    #[command(flatten)]
    pub o: StreamOpts,
}

// ---------------------------------------------------------------- helpers
/// `--buffer`, `--block-size`: a size in bytes (K, M, G powers of 1024).
fn parse_size(s: &str) -> Result<usize, String> {
    let n = crate::human::parse_size(s, 1)?;
    usize::try_from(n).map_err(|_| format!("{s:?}: too large"))
}

pub(super) fn read_key(o: &StreamOpts) -> Result<Psk, String> {
    crate::key::read_key(o.key_file.as_deref())
}

pub(super) fn options(o: &StreamOpts, key: Psk) -> Result<Options, String> {
    let mut opts = Options::new(key);
    opts.compress = o.compress.parse::<Mode>().map_err(|e| e.to_string())?;
    opts.buffer = parse_size(&o.buffer)?;
    opts.block_size = parse_size(&o.block_size)?;
    opts.streams = o.streams;
    if !(1 << 20..=64 << 30).contains(&opts.buffer) {
        return Err("--buffer must be between 1M and 64G".into());
    }
    if !(ferry_stream::MIN_BLOCK..=ferry_stream::MAX_BLOCK).contains(&opts.block_size) {
        return Err("--block-size must be between 4K and 1M".into());
    }
    if let Some(t) = o.timeout {
        // Keepalives go out after 1 s of silence: a shorter timeout would
        // take a live peer for a dead one.
        if !(2.0..=1e6).contains(&t) {
            return Err("--timeout takes a number of seconds, at least 2".into());
        }
        opts.wait = Some(Duration::from_secs_f64(t));
        opts.idle = Some(Duration::from_secs_f64(t));
    }
    Ok(opts)
}
