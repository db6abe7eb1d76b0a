//! rsync flags that ferry does not take, each answered with one line that
//! names what ferry does instead. People type rsync's flags from habit;
//! clap's generic "unexpected argument" with a tip about `--` helps nobody.

use clap::Args;

/// rsync's everyday flags, accepted with rsync's meaning. Most name what
/// ferry always does; they are taken so that an rsync command line works
/// as it is.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "rsync compatibility")]
pub struct RsyncArgs {
    /// Archive mode, as rsync's -a (-rlptgoD): with any of -a -r -l -p -t
    /// -g -o -H, ferry keeps exactly what they name, as rsync does (hard
    /// links only with -H); with none of them it keeps all but device and
    /// special files, and hard links. Owner and group are set when ferry
    /// runs as root, device nodes made only then.
    #[arg(short = 'a', long)]
    pub archive: bool,
    /// Recurse into directories.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// Copy symlinks as symlinks.
    #[arg(short = 'l', long)]
    pub links: bool,
    /// Keep permissions.
    #[arg(short = 'p', long)]
    pub perms: bool,
    /// Keep modification times (to the nanosecond).
    #[arg(short = 't', long)]
    pub times: bool,
    /// Keep the group (as root).
    #[arg(short = 'g', long)]
    pub group: bool,
    /// Keep the owner (as root).
    #[arg(short = 'o', long)]
    pub owner: bool,
    /// Keep hard links.
    #[arg(short = 'H', long)]
    pub hard_links: bool,
    /// Keep holes: always (all-zero blocks become holes too).
    #[arg(short = 'S', long)]
    pub sparse: bool,
    /// List each change as rsync's --itemize-changes does (YXcstpoguax
    /// and the name), unchanged entries left out.
    #[arg(short = 'i', long)]
    pub itemize_changes: bool,
    /// Compress across a link: ferry compresses when it pays (the default
    /// --compress auto); -z is taken as that.
    #[arg(short = 'z')]
    pub z: bool,
    /// --partial --progress (partial files are kept by default).
    #[arg(short = 'P')]
    pub partial_progress: bool,
    /// Sizes in human units: always.
    #[arg(short = 'h', long)]
    pub human_readable: bool,
    /// progress2 (or progress): show whole-transfer progress; other
    /// --info flags are refused.
    #[arg(long, value_name = "FLAGS")]
    pub info: Option<String>,
    /// Print rsync-style transfer statistics at the end.
    #[arg(long)]
    pub stats: bool,
    /// Exit with rsync's numbers (23 partial, 11 file I/O, 12 protocol or
    /// link lost, 30 timeout, 20 interrupted, 1 usage) for scripts that
    /// test them.
    #[arg(long)]
    pub rsync_exit_codes: bool,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
}

impl RsyncArgs {
    /// rsync's selection: with any of -a -r -l -p -t -g -o -H, what is
    /// kept is what they name (turned off in `opts` where they do not
    /// name it); with none, `opts` keeps ferry's defaults.
    pub fn select(&self, opts: &mut ferry_core::SyncOptions, files_from: bool, no_specials: bool) {
        let a = self.archive;
        let any = [
            a,
            self.recursive,
            self.links,
            self.perms,
            self.times,
            self.group,
            self.owner,
            self.hard_links,
        ];
        if !any.contains(&true) {
            return;
        }
        // --files-from lists what to copy; its directories are made.
        opts.recursive &= a || self.recursive || files_from;
        opts.symlinks &= a || self.links;
        opts.perms &= a || self.perms;
        opts.times &= a || self.times;
        opts.group &= a || self.group;
        opts.owner &= a || self.owner;
        opts.hard_links &= self.hard_links;
        // rsync's -a has -D.
        opts.specials |= a && !no_specials;
    }

    /// Whether progress was asked for the rsync way (-P, --info=progress2).
    pub fn progress(&self) -> Result<bool, String> {
        let info = match self.info.as_deref() {
            None => false,
            Some(v) => {
                for f in v.split(',') {
                    match f {
                        "progress" | "progress1" | "progress2" => {}
                        "progress0" | "" => {}
                        other => {
                            return Err(format!(
                                "--info={other}: ferry takes --info=progress2 only (-v lists changes, --json prints statistics)"
                            ))
                        }
                    }
                }
                v.split(',')
                    .any(|f| f.starts_with("progress") && f != "progress0")
            }
        };
        Ok(info || self.partial_progress)
    }
}

/// What to tell someone who typed `flag` (as clap reports it: `-a`,
/// `--archive`), if it is an rsync flag ferry does not take.
pub fn advice(flag: &str) -> Option<&'static str> {
    let default = "is what ferry does by default: leave it out";
    Some(match flag {
        "--zc" | "--compress-choice" | "--zl" | "--compress-level" => {
            "choose with --compress zstd[:LEVEL]|lz4|none (ferry's --compress takes the mode)"
        }
        "--out-format" => "use -i (rsync's %i %n%L) or -v to list each change",
        "--delete-after" | "--delete-before" | "--delete-during" | "--delete-delay" => {
            "use --delete: ferry deletes in a directory once the list has left it, as rsync's default"
        }
        "-W" => default,
        "--append" | "--append-verify" => {
            "not supported: ferry sends only the changed parts of a file anyway (--delta)"
        }
        "--size-only" => {
            "not supported: ferry compares size and modification time (to the nanosecond), or content with -c"
        }
        "-I" | "--ignore-times" => "not supported: -c compares every file by content instead",
        "--compare-dest" | "--copy-dest" => {
            "not supported: --link-dest hard-links unchanged files from an earlier copy"
        }
        "--rsync-path" => "use --remote-ferry PATH (ferry's path on the remote host)",
        "--daemon" => "use ferry serve --listen ADDR:PORT (and ferry:// URLs)",
        "--no-whole-file" => "use --delta",
        "-C" | "--cvs-exclude" | "-F" => {
            "not supported: give the rules with --exclude, --exclude-from or --filter"
        }
        "-R" | "--relative" | "--remove-source-files" | "--existing" | "--modify-window" => {
            "ferry does not take this rsync option yet (see ferry sync --help)"
        }
        _ => return None,
    })
}

/// The one line printed for an unknown option.
pub fn unknown_option(flag: &str) -> String {
    match advice(flag) {
        Some(a) => format!("ferry: {flag}: {a}"),
        None => format!("ferry: unknown option {flag} (see ferry sync --help)"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn common_rsync_flags_get_advice() {
        for f in [
            "--zc",
            "--out-format",
            "--append",
            "-R",
            "--size-only",
            "--rsync-path",
        ] {
            assert!(super::advice(f).is_some(), "{f}");
        }
        assert!(super::unknown_option("--out-format").contains("-i"));
        assert!(super::unknown_option("--frobnicate").contains("unknown option --frobnicate"));
    }
}
