//! rsync flags that ferry does not take, each answered with one line that
//! names what ferry does instead. People type rsync's flags from habit;
//! clap's generic "unexpected argument" with a tip about `--` helps nobody.

/// What to tell someone who typed `flag` (as clap reports it: `-a`,
/// `--archive`), if it is an rsync flag ferry does not take.
pub fn advice(flag: &str) -> Option<&'static str> {
    let default = "is what ferry does by default: leave it out";
    Some(match flag {
        "-a" | "--archive" => {
            "rsync's -a (permissions, times, symlinks, owners as root) is what ferry does by default: leave it out (-H hard links too)"
        }
        "-r" | "--recursive" => "directories are always copied whole: leave -r out",
        "-l" | "--links" => "symlinks are always copied as symlinks: leave -l out",
        "-p" | "--perms" => "permissions are always copied: leave -p out",
        "-t" | "--times" => "modification times (to the nanosecond) are always copied: leave -t out",
        "-o" | "--owner" | "-g" | "--group" | "--numeric-ids" => {
            "owner and group are copied by number when ferry runs as root: leave it out"
        }
        "-H" | "--hard-links" => "hard links are always kept: leave -H out",
        "-S" | "--sparse" => "holes and all-zero blocks are always kept as holes: leave -S out",
        "-z" | "--compress" | "--zc" | "--compress-choice" | "--zl" | "--compress-level" => {
            "across a link ferry compresses when it pays (--compress auto); choose with --compress zstd[:LEVEL]|lz4|none"
        }
        "-P" => "ferry keeps and resumes partial files by default (--partial): use --progress for progress",
        "--info" => "use --progress for progress, -v to list changes, --json for statistics",
        "-i" | "--itemize-changes" => "use -v to list each change",
        "--stats" => "ferry always prints a summary line; --json prints every counter",
        "-h" | "--human-readable" => "sizes are always printed in human units",
        "--delete-after" | "--delete-before" | "--delete-during" | "--delete-delay" => {
            "use --delete: ferry deletes only after the whole list has arrived"
        }
        "-W" => default,
        "--append" | "--append-verify" => {
            "not supported: ferry sends only the changed parts of a file anyway (--delta)"
        }
        "-u" | "--update" | "-x" | "--one-file-system" | "-R" | "--relative" | "--exclude-from"
        | "--include" | "--include-from" | "--filter" | "-f" | "-A" | "--acls" | "--files-from"
        | "--link-dest" | "--backup" | "-b" | "--chmod" | "--chown" | "--max-size"
        | "--min-size" | "--remove-source-files" | "--existing" | "--ignore-existing" => {
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
        for f in ["-a", "--archive", "-z", "-P", "--stats", "-r"] {
            assert!(super::advice(f).is_some(), "{f}");
        }
        assert!(super::unknown_option("--stats").contains("--json"));
        assert!(super::unknown_option("--frobnicate").contains("unknown option --frobnicate"));
    }
}
