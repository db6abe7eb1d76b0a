//! ferry's engine.
//!
//! A sync is one pipeline whatever the endpoints: a **sender**
//! ([`sender::run_sender`]) walks the sources and streams the file list and
//! the data; a **receiver** ([`receiver::run_receiver`]) compares, asks,
//! writes, verifies and commits. They talk only through a
//! [`ferry_link::Endpoint`], so the same code runs local-to-local over an
//! in-process link ([`sync_local`]) and across hosts over ssh or TCP.
//!
//! The engine never prints and never exits: it returns a [`Report`] or an
//! [`Error`] with an exit [`Class`], and exposes live counters in [`Stats`]
//! for whoever wants to draw progress.

pub mod chmod;
mod destdir;
mod direct;
mod early;
pub mod endpoint;
pub mod error;
pub mod exclude;
mod fasthash;
pub mod fsutil;
pub mod globs;
pub mod ids;
pub mod interrupt;
pub mod itemize;
pub mod journal;
pub mod listcheck;
pub mod pathset;
pub mod plan;
pub mod receiver;
pub mod remote;
pub mod scan;
pub mod sender;
pub mod stats;
pub mod warm;
pub mod window;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

pub use error::{Class, Error, Result};
pub use exclude::{parse_filter, Excludes, FilterLine, Rule as FilterRule};
pub use plan::{Dest, Plan, SourceSpec};
pub use stats::{Report, Stats};

/// How changed files are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeltaMode {
    /// Whole files locally; delta across a link when it pays.
    #[default]
    Auto,
    /// Always send whole files.
    Whole,
    /// Always use the delta algorithm when an old copy exists.
    Delta,
}

/// Options of a sync, shared by both sides.
#[derive(Clone, Debug)]
pub struct SyncOptions {
    /// Compare contents (BLAKE3) instead of size and mtime.
    pub checksum: bool,
    /// Remove destination entries that the source does not have.
    pub delete: bool,
    /// Replace a non-empty directory by a non-directory, and a top-level
    /// non-directory destination (never a device) by a directory. With
    /// `sparsify`: map a filesystem that looks mounted or in use.
    pub force: bool,
    /// Treat the blocks an image's guest filesystems do not use as holes
    /// (named image files, devices and NBD exports; see `ferry-guest`).
    pub sparsify: bool,
    /// Where a file is written in place (a device, an NBD export,
    /// `--inplace`), make the ranges the source's guest does not use read
    /// as zeros (discarding them where the device can) instead of leaving
    /// them as they are.
    pub discard: bool,
    /// Delete even after the sender could not read part of the source
    /// (without it, any such error turns `--delete` off for the run).
    pub ignore_errors: bool,
    /// fdatasync each file before its rename and fsync changed directories
    /// at the end (`--no-fsync` turns it off).
    pub fsync: bool,
    /// Read each written file back from the disk after fdatasync (even
    /// with `--no-fsync`) and check it against the sender's segment
    /// digests (`--verify`); the sender hashes even in process.
    pub verify: bool,
    /// `--timeout`: a stream link whose peer sends or takes nothing for
    /// this long has failed (each side sends keepalives while idle).
    pub timeout: Option<std::time::Duration>,
    /// Receiver of a pull: the top-level names the user asked for (see
    /// [`listcheck::ListCheck::expect_top`]); `None` allows any.
    pub expect_top: Option<Vec<Vec<u8>>>,
    /// With [`SyncOptions::expect_top`]: top-level names a wildcard of a
    /// source matches are asked for too (see [`globs`]).
    pub expect_patterns: Vec<globs::NamePattern>,
    /// Decide and report, change nothing.
    pub dry_run: bool,
    /// Overwrite changed files in place instead of temp file + rename.
    pub inplace: bool,
    /// Copy extended attributes.
    pub xattrs: bool,
    /// Copy POSIX ACLs (`-A`): the `system.posix_acl_*` attributes, also
    /// without `xattrs`.
    pub acls: bool,
    /// Set owners (`-o`, the default; only a receiver running as root
    /// can).
    pub owner: bool,
    /// Set groups (`-g`, the default; only a receiver running as root
    /// does).
    pub group: bool,
    /// Set permissions (`-p`, the default): without it new entries get the
    /// source's permission bits less the receiver's umask, and existing
    /// ones keep theirs, as rsync does.
    pub perms: bool,
    /// Set modification times (`-t`, the default).
    pub times: bool,
    /// Keep hard links (`-H`, the default): without it each name of a
    /// file is sent as a file of its own.
    pub hard_links: bool,
    /// Copy symlinks as symlinks (`-l`, the default): without it they are
    /// skipped, as rsync skips them.
    pub symlinks: bool,
    /// Recurse into directories (`-r`, the default): without it the
    /// sender skips directories.
    pub recursive: bool,
    /// `-D`: device nodes, FIFOs and sockets are sent and made at the
    /// destination (devices only by a receiver running as root, as
    /// rsync); without it the sender skips them.
    pub specials: bool,
    /// `-x`: the sender does not descend into directories on another
    /// filesystem than the source's (the mount point itself is listed).
    pub one_file_system: bool,
    /// The sender lists the root directory itself (its permissions and
    /// times reach the destination root). `--files-from` turns it off, as
    /// rsync's list names only what it names.
    pub list_root: bool,
    /// `--files-from`'s paths, relative to the one source directory: the
    /// sender reports each one that is not there (an error line, and
    /// `--delete` off), as rsync does. A local sender's only: a pull's
    /// remote sender is not told them, and its receiver checks them
    /// against the list instead ([`SyncOptions::listed_by_receiver`]).
    pub listed: Vec<String>,
    /// A pull: the receiver reports each of [`SyncOptions::listed`] that
    /// the sender's list lacks (and then deletes nothing).
    pub listed_by_receiver: bool,
    /// `--numeric-ids`: owners and groups by number; without it the
    /// sender names them and the receiver maps the names to its own ids.
    pub numeric_ids: bool,
    /// A remote receiver tells the sender of each change
    /// (`Message::Change`), for the client to list.
    pub list_changes: bool,
    /// The peer's Hello must come within this (a daemon's session: a
    /// client that holds its slot without starting is cut off).
    pub hello_wait: Option<std::time::Duration>,
    /// The sender is a daemon's client, trusted with the data but not with
    /// the host: set-user-ID and set-group-ID bits are dropped from what it
    /// lists, and of its extended attributes only `user.*` and POSIX ACLs
    /// are written (never `security.*`, such as file capabilities, or
    /// `trusted.*`).
    pub untrusted_sender: bool,
    /// Include and exclude rules, first match wins (see [`exclude`]).
    pub excludes: Excludes,
    /// `--delete-excluded`: excluded entries at the destination are not
    /// protected from `--delete` (which it implies).
    pub delete_excluded: bool,
    /// `--link-dest`: directories of earlier copies to hard-link unchanged
    /// files from (relative to the destination unless absolute).
    pub link_dest: Vec<std::path::PathBuf>,
    /// `--chmod`: permission changes the sender applies to what it lists.
    pub chmod: chmod::Chmod,
    /// `--backup`: the suffix of the backups of replaced and deleted
    /// entries, kept beside them (`None`: no backups).
    pub backup: Option<String>,
    /// `--backup-dir`: backups go there (relative to the destination
    /// unless absolute), under their relative paths.
    pub backup_dir: Option<std::path::PathBuf>,
    /// `--chown USER:GROUP`: the owner and group every entry gets, resolved
    /// on the receiving host (see [`ids::parse_chown`]).
    pub chown: Option<String>,
    /// rsync's options that leave some files alone (`--update`,
    /// `--ignore-existing`, `--min-size`, `--max-size`).
    pub skip: SkipRules,
    /// `--max-delete N`: delete at most N entries; the rest stay and the
    /// run reports them as a failure.
    pub max_delete: Option<u64>,
    /// Worker threads per side.
    pub threads: usize,
    pub delta: DeltaMode,
    /// `--bwlimit`: bytes per second the sender may put on the link.
    pub bwlimit: Option<u64>,
    /// Directory of the receiver's signature cache (`--sig-cache`).
    pub sig_cache: Option<std::path::PathBuf>,
    /// Compression of data on byte-stream links (`--compress`); the
    /// in-process link of a local run never compresses.
    pub compress: ferry_compress::Mode,
    /// The link moves the sender's own buffers (a local run): whole-file
    /// segments are not hashed, because hashing the same buffer on both
    /// sides verifies nothing. Deltas, assembled from the old copy, are
    /// always verified, and so is everything on a byte-stream link.
    pub in_process: bool,
    /// Write new files of [`direct::MIN_SIZE`] bytes or more with
    /// `O_DIRECT` where the filesystem allows (`--buffered-io` turns it
    /// off). See the `direct` module for why.
    pub direct_io: bool,
    /// Keep what an interrupted run wrote of a large file, with a journal,
    /// and resume from it (see [`journal`]); `--no-partial` turns it off
    /// and removes such state instead.
    pub partial: bool,
    /// `--partial-dir`: where the journal of a block device written in
    /// place is kept (a device has no directory of its own), so that it
    /// resumes too.
    pub partial_dir: Option<std::path::PathBuf>,
}

impl Default for SyncOptions {
    fn default() -> Self {
        Self {
            checksum: false,
            delete: false,
            force: false,
            sparsify: false,
            discard: false,
            ignore_errors: false,
            fsync: true,
            verify: false,
            timeout: None,
            expect_top: None,
            expect_patterns: Vec::new(),
            dry_run: false,
            inplace: false,
            xattrs: false,
            acls: false,
            owner: true,
            group: true,
            perms: true,
            times: true,
            hard_links: true,
            symlinks: true,
            recursive: true,
            list_root: true,
            listed: Vec::new(),
            listed_by_receiver: false,
            one_file_system: false,
            specials: false,
            numeric_ids: false,
            list_changes: false,
            hello_wait: None,
            untrusted_sender: false,
            excludes: Excludes::new(&[]).unwrap_or_else(|_| unreachable!("empty exclude set")),
            delete_excluded: false,
            max_delete: None,
            skip: SkipRules::default(),
            backup: None,
            backup_dir: None,
            chown: None,
            chmod: chmod::Chmod::default(),
            link_dest: Vec::new(),
            threads: default_threads(),
            delta: DeltaMode::Auto,
            bwlimit: None,
            sig_cache: None,
            compress: ferry_compress::Mode::Auto,
            in_process: false,
            direct_io: true,
            partial: true,
            partial_dir: None,
        }
    }
}

/// Files a sync leaves as the destination has them, whatever their
/// content (see `receiver::decide::leave_alone`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SkipRules {
    /// `--update`: a destination file newer than the source stays.
    pub update: bool,
    /// `--ignore-existing`: whatever exists at the destination stays.
    pub ignore_existing: bool,
    /// `--min-size`: smaller files are not transferred.
    pub min_size: Option<u64>,
    /// `--max-size`: larger files are not transferred.
    pub max_size: Option<u64>,
}

impl SyncOptions {
    /// Whether the receiver applies the attributes an entry carries
    /// (the sender sends only those `xattrs` and `acls` ask for).
    pub fn meta_xattrs(&self) -> bool {
        self.xattrs || self.acls
    }

    /// Whether the receiver makes the attribute `name` agree with the
    /// source (see [`fsutil::xattr_in_scope`]): a daemon's client only
    /// ever reaches `user.*` and the ACLs anyway.
    pub fn xattr_scope(&self, name: &[u8]) -> bool {
        fsutil::xattr_in_scope(name, self.xattrs, self.acls)
    }
}

/// Workers per side: the core count, at least 2 so that reading one file
/// overlaps writing another.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 16)
}

/// Plan a local sync from command-line paths. With `force`, a destination
/// that is a regular file or a symlink is planned as absent, to be replaced
/// (see [`SyncOptions::force`]).
pub fn plan_local(sources: &[String], dest: &str, force: bool) -> Result<Plan> {
    endpoint::check_sources_exist(sources)?;
    if endpoint::Kind::of(dest) == endpoint::Kind::Nbd {
        if sources.len() != 1 || endpoint::is_dir(&sources[0]) != Some(false) {
            return Err(Error::Usage(format!(
                "{dest}: an NBD destination takes exactly one file"
            )));
        }
        let specs = plan::source_specs(sources, endpoint::is_dir)?;
        return Ok(Plan {
            sources: specs,
            dest_root: ".".into(),
            dest_nbd: Some(dest.to_string()),
        });
    }
    // `dst/` is `dst`: a file there is a file (metadata fails on `file/`).
    let dest_kind = match std::fs::metadata(fsutil::bare(Path::new(dest))) {
        // A symlink to a directory is that directory, as in rsync.
        Ok(m) if force && m.is_file() => None,
        Ok(m) => Some(m.is_dir()),
        Err(_) => None,
    };
    plan::plan(sources, dest, endpoint::is_dir, dest_kind)
}

/// Run a local-to-local sync: sender and receiver in this process, joined
/// by an in-process link. `stats` is updated live. Local runs send whole
/// files unless `--delta` is given, as rsync does: reading both copies to
/// save a memory copy does not pay. A delta whose result fails
/// verification is asked for again whole in the same session.
pub fn sync_local(plan: &Plan, opts: &SyncOptions, stats: &Stats) -> Result<Report> {
    sync_local_pass(plan, opts, stats, Instant::now())
}

fn sync_local_pass(
    plan: &Plan,
    opts: &SyncOptions,
    stats: &Stats,
    start: Instant,
) -> Result<Report> {
    let opts = &SyncOptions {
        in_process: true,
        ..opts.clone()
    };
    let (a, b) = ferry_link::in_process();
    let mut a = a;
    if let Some(rate) = opts.bwlimit {
        a.tx = a.tx.with_rate_limit(rate);
    }
    let sent_a = a.sent.clone();
    let sent_b = b.sent.clone();
    let wire = || sent_a.get() + sent_b.get();
    let res = std::thread::scope(|s| {
        let sender = s.spawn(|| sender::run_sender(a, &plan.sources, opts, stats, false));
        let dest = match &plan.dest_nbd {
            Some(uri) => Dest::Nbd(uri.clone()),
            None => Dest::Dir(plan.dest_root.clone()),
        };
        let r = receiver::run_receiver(b, &dest, opts, stats);
        let sres = sender
            .join()
            .map_err(|_| Error::Protocol("sender thread panicked".into()))?;
        // A receiver error is the cause and the sender's its echo, unless
        // the receiver only saw the sender go (then the sender says why).
        match (r, sres) {
            (Err(Error::Link(ferry_link::LinkError::Closed)), Err(se)) => Err(se),
            (Err(re), _) => Err(re),
            (Ok(_), s) => s,
        }
    });
    stats.bytes_wire.fetch_add(wire(), Ordering::Relaxed);
    res?;
    finished(stats, start)
}

/// The report of a finished run; a run where some entries failed is a
/// partial transfer.
pub(crate) fn finished(stats: &Stats, start: Instant) -> Result<Report> {
    let report = stats.report(start.elapsed().as_secs_f64());
    if report.files_failed > 0 {
        return Err(Error::Partial {
            failed: report.files_failed,
            total: report.files_total,
        });
    }
    Ok(report)
}

/// Both sides open a session the same way: say Hello with `features`,
/// check the peer's (within `wait`, when given: keepalives alone do not
/// count) and return the features it announced. A version mismatch is
/// fatal and is told to the peer.
pub(crate) fn hello(
    tx: &ferry_link::MsgTx,
    rx: &ferry_link::MsgRx,
    wait: Option<std::time::Duration>,
    features: u64,
) -> Result<u64> {
    use ferry_link::Message;
    tx.send(Message::Hello {
        version: ferry_link::announced_version(),
        features,
    })?;
    let first = match wait {
        None => rx.recv()?,
        Some(d) => {
            let (ring, wake) = crossbeam_channel::bounded(1);
            std::thread::spawn(move || {
                std::thread::sleep(d);
                let _ = ring.send(());
            });
            rx.recv_or_wake(&wake)?
                .ok_or(Error::Link(ferry_link::LinkError::TimedOut(d.as_secs())))?
        }
    };
    match first {
        Message::Hello { version, features } if version == ferry_link::PROTOCOL_VERSION => {
            Ok(features)
        }
        Message::Hello { version, .. } => {
            let e = Error::PeerVersion { peer: version };
            let _ = tx.send(error::fatal(&e));
            Err(e)
        }
        Message::Fatal { class, error } => Err(error::from_fatal(class, error)),
        m => Err(Error::Protocol(format!("expected Hello, got {}", m.name()))),
    }
}

/// Convenience for tests and the demo: sync `sources` to `dest` with
/// `opts`, returning the report.
pub fn sync_paths(sources: &[&Path], dest: &Path, opts: &SyncOptions) -> Result<Report> {
    let srcs: Vec<String> = sources
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let plan = plan_local(&srcs, &dest.to_string_lossy(), opts.force)?;
    let stats = Stats::default();
    sync_local(&plan, opts, &stats)
}
