//! The engine options shared by `ferry sync` and the remote side it starts
//! (`ferry serve`): defined once, so what the client writes on the serve
//! command line (`ferry_core::remote::serve_args`) is what the server
//! parses.

use clap::Args;
use ferry_core::{DeltaMode, Excludes, SyncOptions};

#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Skip files by content (BLAKE3 of both sides) rather than size+mtime.
    #[arg(short = 'c', long)]
    pub checksum: bool,
    /// Delete destination entries that the source does not have.
    #[arg(long)]
    pub delete: bool,
    /// Replace what is in the way: a non-empty directory where the source
    /// has a file, or a file given as the destination of a directory
    /// (devices are never replaced). With --sparsify: copy an image whose
    /// filesystem looks mounted or in use.
    #[arg(long)]
    pub force: bool,
    /// For disk images, devices and NBD exports named as sources: read the
    /// partition table (GPT, MBR) and the allocation maps of ext2/3/4, XFS
    /// and swap, and treat the blocks the guest does not use as holes
    /// (never read, never sent). Unknown or damaged filesystems are copied
    /// whole; the summary says which.
    #[arg(long)]
    pub sparsify: bool,
    /// Where the destination is written in place (a block device, an NBD
    /// export, --inplace): make the blocks the source's guest does not use
    /// (--sparsify on the sending side) read as zeros, discarding them
    /// where the device can. Without it they are left as they are.
    #[arg(long)]
    pub discard: bool,
    /// With --delete: delete even when the sender could not read part of
    /// the source (by default any such error turns deletion off).
    #[arg(long)]
    pub ignore_errors: bool,
    /// Do not fsync: faster on many small files, but after a power cut a
    /// file the run reported may be empty or old.
    #[arg(long)]
    pub no_fsync: bool,
    /// After each file reaches the disk, read it back (past the page
    /// cache) and check it against the sender's digests: for storage you
    /// do not trust. Costs a second read of everything written.
    #[arg(long)]
    pub verify: bool,
    /// Show what would change; change nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Skip paths matching PATTERN (rsync's patterns; repeatable). All
    /// include and exclude rules are tried in the order given, across
    /// --exclude, --include, their -from files and --filter: the first
    /// that matches decides, and what none matches is included.
    #[arg(long, value_name = "PATTERN", allow_hyphen_values = true)]
    pub exclude: Vec<String>,
    /// Do not skip paths matching PATTERN (a rule that comes before the
    /// --exclude it makes an exception to).
    #[arg(long, value_name = "PATTERN", allow_hyphen_values = true)]
    pub include: Vec<String>,
    /// Read exclude patterns from FILE, one per line (`-`: stdin; blank
    /// lines and lines starting with # or ; are skipped).
    #[arg(long, value_name = "FILE")]
    pub exclude_from: Vec<String>,
    /// Read include patterns from FILE, one per line.
    #[arg(long, value_name = "FILE")]
    pub include_from: Vec<String>,
    /// A filter rule as rsync writes it: `- PATTERN`, `+ PATTERN`,
    /// `. FILE` or `merge FILE` (rules from FILE), `!` (clear the rules
    /// so far). Other rsync rule kinds are refused.
    #[arg(short = 'f', long, value_name = "RULE", allow_hyphen_values = true)]
    pub filter: Vec<String>,
    /// Copy only the paths FILE lists, one per line, relative to the one
    /// source directory (whatever its trailing slash), with the
    /// directories leading to them; a listed directory's contents only
    /// with an explicit -r, as in rsync. `-` reads stdin. A listed path
    /// that is not there is an error (exit 2; --delete then deletes
    /// nothing), unless the source is remote.
    #[arg(long, value_name = "FILE")]
    pub files_from: Option<String>,
    /// rsync's -r was given (for --files-from; set by `sync`).
    #[arg(skip)]
    pub recursive: bool,
    /// With --delete (which it implies): delete excluded entries at the
    /// destination too, instead of protecting them.
    #[arg(long)]
    pub delete_excluded: bool,
    /// Keep each file a run replaces or deletes beside it as NAME~ (an
    /// older backup of that name replaced); names ending in the suffix are
    /// not deleted by --delete. Not with --inplace.
    #[arg(short = 'b', long)]
    pub backup: bool,
    /// The backups' suffix (default `~`; none with --backup-dir).
    #[arg(long, value_name = "SUFFIX", allow_hyphen_values = true)]
    pub suffix: Option<String>,
    /// Keep backups (implies --backup) in DIR, under their paths relative
    /// to the destination, instead of beside them. DIR is on the
    /// receiving host, relative to the destination unless absolute, and
    /// on the destination's filesystem.
    #[arg(long, value_name = "DIR")]
    pub backup_dir: Option<std::path::PathBuf>,
    /// Give every file this owner and group on the receiving host (names
    /// or numbers; `USER`, `USER:GROUP` or `:GROUP`), as rsync's --chown.
    /// Only a receiver running as root can.
    #[arg(long, value_name = "USER:GROUP")]
    pub chown: Option<String>,
    /// Hard-link files that DIR (an earlier copy; relative to the
    /// destination unless absolute) holds unchanged, instead of sending
    /// them: snapshots that share what did not change. Repeatable.
    #[arg(long, value_name = "DIR")]
    pub link_dest: Vec<std::path::PathBuf>,
    /// Change the permissions the copy gets, as rsync's --chmod:
    /// comma-separated clauses, each `D` (directories) or `F` (files) or
    /// neither, then an octal mode or chmod's symbolic form (`u+rwX`,
    /// `go-w`, `a=r`). Repeatable; applied in order.
    #[arg(long, value_name = "CLAUSES")]
    pub chmod: Vec<String>,
    /// Skip files that are newer at the destination (equal times are
    /// updated), as rsync's -u.
    #[arg(short = 'u', long)]
    pub update: bool,
    /// Leave every file that exists at the destination alone.
    #[arg(long)]
    pub ignore_existing: bool,
    /// Do not transfer files smaller than SIZE (bytes; K M G or KB MB GB).
    #[arg(long, value_name = "SIZE", value_parser = parse_file_size)]
    pub min_size: Option<u64>,
    /// Do not transfer files larger than SIZE.
    #[arg(long, value_name = "SIZE", value_parser = parse_file_size)]
    pub max_size: Option<u64>,
    /// Delete at most N entries; the rest stay and the run ends with exit
    /// 2 (0: delete nothing, only report).
    #[arg(long, value_name = "N")]
    pub max_delete: Option<u64>,
    /// The include/exclude options in command-line order (filled from the
    /// parsed matches: see [`EngineArgs::order_rules`]).
    #[arg(skip)]
    pub rule_order: Vec<crate::filter_args::RuleArg>,
    /// Update changed files in place instead of temp file + rename.
    #[arg(long)]
    pub inplace: bool,
    /// Keep what an interrupted run wrote of a large file (32 MiB or more)
    /// as .NAME.ferry-partial with a journal, and resume from it: the
    /// default. Accepted for rsync's sake.
    #[arg(long, overrides_with = "no_partial")]
    pub partial: bool,
    /// Keep no partial files: an interrupted file starts over next time,
    /// and partial state left by earlier runs is removed.
    #[arg(long)]
    pub no_partial: bool,
    /// Keep the journal of a block device or NBD export written in place
    /// in DIR (on the receiving host), so that an interrupted copy onto it
    /// resumes too: the segments it names are read back and sent only if
    /// they differ.
    #[arg(long, value_name = "DIR")]
    pub partial_dir: Option<std::path::PathBuf>,
    /// Copy extended attributes.
    #[arg(short = 'X', long)]
    pub xattrs: bool,
    /// Copy POSIX ACLs (access and default), by numeric ids. A receiver
    /// that is not root can set ACLs only on files it owns.
    #[arg(short = 'A', long)]
    pub acls: bool,
    /// Owner and group by number: do not map them by name (by default
    /// the receiver gives each file the owner and group of the same
    /// name, and the number where the name is unknown, as rsync does).
    #[arg(long)]
    pub numeric_ids: bool,
    /// Leave permissions alone: new entries get the source's less the
    /// umask, existing ones keep theirs (rsync without -p).
    #[arg(long, visible_alias = "no-p")]
    pub no_perms: bool,
    /// Do not set modification times (so every file is compared and sent
    /// as a delta each run, as rsync without -t).
    #[arg(long, visible_alias = "no-t")]
    pub no_times: bool,
    /// Do not set owners (root's default is to set them).
    #[arg(long, visible_alias = "no-o")]
    pub no_owner: bool,
    /// Do not set groups (root's default is to set them).
    #[arg(long, visible_alias = "no-g")]
    pub no_group: bool,
    /// Copy each name of a hard-linked file as a file of its own.
    #[arg(long, visible_alias = "no-H")]
    pub no_hard_links: bool,
    /// Skip symlinks (rsync without -l).
    #[arg(long, visible_alias = "no-l")]
    pub no_links: bool,
    /// Do not recurse: directories are skipped (rsync without -r).
    #[arg(long, visible_alias = "no-r")]
    pub no_recursive: bool,
    /// Copy device nodes, FIFOs and sockets as such (rsync's -D,
    /// --devices --specials; part of -a). Devices are made only by a
    /// receiver running as root, skipped otherwise, as rsync does.
    #[arg(short = 'D', long = "specials", visible_alias = "devices")]
    pub specials: bool,
    /// Skip device nodes, FIFOs and sockets (each named with -v), even
    /// with -a.
    #[arg(long = "no-specials", visible_aliases = ["no-D", "no-devices"])]
    pub no_specials: bool,
    /// Do not cross filesystem boundaries: a directory on another
    /// filesystem than its source (a mount point) is copied empty.
    #[arg(short = 'x', long)]
    pub one_file_system: bool,
    /// The sender does not list the root directory itself (what
    /// --files-from asks of a remote sender).
    #[arg(long, hide = true)]
    pub no_root_entry: bool,
    /// The receiver tells the sending side of each change it makes (what
    /// a client asks of a remote receiver when it lists changes).
    #[arg(long, hide = true)]
    pub list_changes: bool,
    /// Always send whole files, never deltas.
    #[arg(short = 'W', long, conflicts_with = "delta")]
    pub whole_file: bool,
    /// Always send deltas against the destination's old copy.
    #[arg(long)]
    pub delta: bool,
    /// Limit the bytes the sender puts on the link per second, as rsync
    /// reads it: a bare number is KiB/s, 110M = 110 MiB/s, 110MB = 110 MB/s
    /// (K M G powers of 1024, KB MB GB powers of 1000); 0 = no limit.
    #[arg(long, value_name = "RATE", value_parser = parse_bwlimit)]
    pub bwlimit: Option<u64>,
    /// Compression across a link: auto (per block, from the measured link
    /// rate, the share of the data that compresses and the cores free on
    /// this machine; incompressible blocks, and all blocks while the CPU is
    /// busy, go raw; the first 100 ms go at zstd level 1), zstd,
    /// zstd:LEVEL, lz4, none.
    #[arg(long, value_name = "MODE", default_value = "auto")]
    pub compress: ferry_compress::Mode,
    /// Keep delta signatures of received files in DIR, so the next delta
    /// re-sync need not re-read unchanged destination files.
    #[arg(long, value_name = "DIR")]
    pub sig_cache: Option<std::path::PathBuf>,
    /// Worker threads per side (default: core count, at least 2).
    #[arg(short = 'j', long, value_name = "N")]
    pub threads: Option<usize>,
    /// Write new files through the page cache. By default files of 256 KiB
    /// or more are written with O_DIRECT where the filesystem allows: they
    /// are not read again, and filling the page cache with them costs more
    /// CPU than the copy itself on many machines.
    #[arg(long)]
    pub buffered_io: bool,
    /// Fail when the peer has sent or taken nothing for SECONDS (both sides
    /// send keepalives while busy, so only a dead peer or link is silent);
    /// exit 5. Default: wait forever, as rsync does.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
}

impl EngineArgs {
    /// Record the order of the include/exclude options, from `m`: the
    /// matches of the command these arguments were parsed for.
    pub fn order_rules(&mut self, m: &clap::ArgMatches) {
        self.rule_order = crate::filter_args::in_order(m);
    }

    /// The engine's options; a bad exclude pattern is a usage error.
    pub fn options(&self) -> Result<SyncOptions, String> {
        let mut rules = crate::filter_args::rules(&self.rule_order)?;
        let mut listed = Vec::new();
        if let Some(f) = &self.files_from {
            let (more, paths) =
                crate::filter_args::files_from(std::path::Path::new(f), self.recursive)?;
            rules.extend(more);
            listed = paths;
        }
        let excludes = Excludes::from_rules(&rules).map_err(|e| e.to_string())?;
        let timeout = match self.timeout {
            None => None,
            // 0 means no timeout, as in rsync.
            Some(0.0) => None,
            // Keepalives go every second: a shorter timeout would fire on
            // a healthy link.
            Some(t) if (2.0..1e9).contains(&t) => Some(std::time::Duration::from_secs_f64(t)),
            Some(_) => {
                return Err("--timeout takes a number of seconds, at least 2 (0: none)".into())
            }
        };
        let backing_up = self.backup || self.backup_dir.is_some();
        let backup = match (backing_up, &self.suffix) {
            (false, _) => None,
            (true, _) if self.inplace => {
                return Err("--backup with --inplace: ferry backs up by a hard link before the rename that --inplace does without".into())
            }
            (true, Some(s)) if (s.is_empty() && self.backup_dir.is_none()) || s.contains('/') => {
                return Err(format!(
                    "--suffix {s:?}: a suffix has no / (and is empty only with --backup-dir)"
                ))
            }
            (true, Some(s)) => Some(s.clone()),
            (true, None) if self.backup_dir.is_some() => Some(String::new()),
            (true, None) => Some("~".into()),
        };
        if let Some(c) = &self.chown {
            ferry_core::ids::parse_chown(c)?;
        }
        Ok(SyncOptions {
            checksum: self.checksum,
            delete: self.delete || self.delete_excluded,
            delete_excluded: self.delete_excluded,
            max_delete: self.max_delete,
            backup,
            backup_dir: self.backup_dir.clone(),
            chown: self.chown.clone(),
            link_dest: self.link_dest.clone(),
            chmod: ferry_core::chmod::Chmod::parse(&self.chmod).map_err(|e| e.to_string())?,
            skip: ferry_core::SkipRules {
                update: self.update,
                ignore_existing: self.ignore_existing,
                min_size: self.min_size,
                max_size: self.max_size,
            },
            force: self.force,
            sparsify: self.sparsify,
            discard: self.discard,
            ignore_errors: self.ignore_errors,
            fsync: !self.no_fsync,
            verify: self.verify,
            dry_run: self.dry_run,
            inplace: self.inplace,
            xattrs: self.xattrs,
            acls: self.acls,
            numeric_ids: self.numeric_ids,
            perms: !self.no_perms,
            times: !self.no_times,
            owner: !self.no_owner,
            group: !self.no_group,
            hard_links: !self.no_hard_links,
            symlinks: !self.no_links,
            recursive: !self.no_recursive,
            list_root: !self.no_root_entry && self.files_from.is_none(),
            listed,
            one_file_system: self.one_file_system,
            specials: self.specials && !self.no_specials,
            list_changes: self.list_changes,
            excludes,
            threads: self
                .threads
                .unwrap_or_else(ferry_core::default_threads)
                .clamp(1, 64),
            delta: if self.whole_file {
                DeltaMode::Whole
            } else if self.delta {
                DeltaMode::Delta
            } else {
                DeltaMode::Auto
            },
            bwlimit: self.bwlimit.filter(|&r| r > 0),
            sig_cache: self.sig_cache.clone(),
            compress: self.compress,
            direct_io: !self.buffered_io,
            partial: !self.no_partial,
            partial_dir: self.partial_dir.clone(),
            timeout,
            ..SyncOptions::default()
        })
    }
}

/// `--min-size`, `--max-size`: rsync's units, a bare number in bytes.
fn parse_file_size(s: &str) -> Result<u64, String> {
    crate::human::parse_size(s, 1)
}

/// `--bwlimit`: rsync's units (a bare number is KiB/s); 0 is no limit,
/// anything else at least 512 B/s, as in rsync.
fn parse_bwlimit(s: &str) -> Result<u64, String> {
    match crate::human::parse_size(s, 1024)? {
        r @ 1..512 => Err(format!(
            "{s:?}: {r} B/s is too small (at least 512 B/s; 0 means no limit)"
        )),
        r => Ok(r),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bwlimit_as_rsync_reads_it() {
        use super::parse_bwlimit as p;
        assert_eq!(p("100"), Ok(100 << 10));
        assert_eq!(p("110MB"), Ok(110_000_000));
        assert_eq!(p("0"), Ok(0));
        assert!(p("1b").is_err());
        assert!(p("0.0001").is_err());
        assert!(p("-5").is_err());
    }
}
