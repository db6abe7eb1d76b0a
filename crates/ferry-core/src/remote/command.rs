//! The command line ferry runs on the other host: the `ferry serve`
//! arguments that carry the sync options (ssh runs them through
//! `ferry_link::rsh`, which quotes them for the remote shell).

use crate::{DeltaMode, SyncOptions};

/// The `ferry serve` arguments that carry `opts` to the other side.
pub fn serve_args(
    opts: &SyncOptions,
    send: bool,
    file_or_dir: bool,
    paths: &[String],
) -> Vec<String> {
    serve_args_with(opts, send, file_or_dir, false, paths)
}

pub(super) fn serve_args_with(
    opts: &SyncOptions,
    send: bool,
    file_or_dir: bool,
    direct: bool,
    paths: &[String],
) -> Vec<String> {
    let mut a: Vec<String> = vec!["serve".into(), "--stdio".into()];
    if direct {
        a.push("--direct".into());
    }
    a.push(if send { "--send" } else { "--receive" }.into());
    let flags = [
        (file_or_dir, "--file-or-dir"),
        (opts.delete, "--delete"),
        (opts.force, "--force"),
        (opts.sparsify, "--sparsify"),
        (opts.discard, "--discard"),
        (opts.ignore_errors, "--ignore-errors"),
        (!opts.fsync, "--no-fsync"),
        (opts.verify, "--verify"),
        (opts.checksum, "--checksum"),
        (opts.dry_run, "--dry-run"),
        (opts.inplace, "--inplace"),
        (opts.xattrs, "--xattrs"),
        (opts.acls, "--acls"),
        (opts.numeric_ids, "--numeric-ids"),
        (!opts.perms, "--no-perms"),
        (!opts.owner, "--no-owner"),
        (!opts.group, "--no-group"),
        (!opts.times, "--no-times"),
        (!opts.hard_links, "--no-hard-links"),
        (!opts.symlinks, "--no-links"),
        (!opts.recursive, "--no-recursive"),
        (!opts.list_root, "--no-root-entry"),
        (opts.one_file_system, "--one-file-system"),
        (opts.specials, "--specials"),
        (opts.list_changes, "--list-changes"),
        (opts.skip.update, "--update"),
        (opts.skip.ignore_existing, "--ignore-existing"),
        (opts.delta == DeltaMode::Delta, "--delta"),
        (opts.delta == DeltaMode::Whole, "--whole-file"),
        (!opts.direct_io, "--buffered-io"),
        (!opts.partial, "--no-partial"),
    ];
    a.extend(
        flags
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, f)| f.to_string()),
    );
    a.push(format!("--threads={}", opts.threads));
    // One flag for every rule keeps their order.
    for r in opts.excludes.rules() {
        a.push(format!("--filter={}", r.to_filter()));
    }
    if opts.delete_excluded {
        a.push("--delete-excluded".into());
    }
    if let Some(n) = opts.max_delete {
        a.push(format!("--max-delete={n}"));
    }
    for d in &opts.link_dest {
        a.push(format!("--link-dest={}", d.display()));
    }
    for c in opts.chmod.texts() {
        a.push(format!("--chmod={c}"));
    }
    if let Some(s) = &opts.backup {
        a.push("--backup".into());
        a.push(format!("--suffix={s}"));
    }
    if let Some(d) = &opts.backup_dir {
        a.push(format!("--backup-dir={}", d.display()));
    }
    if let Some(c) = &opts.chown {
        a.push(format!("--chown={c}"));
    }
    if let Some(n) = opts.skip.min_size {
        a.push(format!("--min-size={n}B"));
    }
    if let Some(n) = opts.skip.max_size {
        a.push(format!("--max-size={n}B"));
    }
    if let Some(r) = opts.bwlimit {
        // In bytes, said so: a bare number is KiB/s, as in rsync.
        a.push(format!("--bwlimit={r}B"));
    }
    if let Some(t) = opts.timeout {
        a.push(format!("--timeout={}", t.as_secs_f64()));
    }
    a.push(format!("--compress={}", opts.compress));
    if let Some(d) = &opts.sig_cache {
        a.push(format!("--sig-cache={}", d.display()));
    }
    if let Some(d) = &opts.partial_dir {
        a.push(format!("--partial-dir={}", d.display()));
    }
    a.push("--".into());
    a.extend(paths.iter().cloned());
    a
}
