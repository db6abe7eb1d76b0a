//! rsync's include/exclude options turned into one ordered rule list:
//! `--exclude`, `--include`, `--exclude-from`, `--include-from` and
//! `--filter` (`-f`) keep the order they were given in across all five
//! (clap keeps each option's values apart, so the order comes from their
//! command-line indices), rule files are read here, on the side the user
//! runs, and the engine gets plain `+`/`-` rules.

use std::path::{Path, PathBuf};

use clap::ArgMatches;
use ferry_core::{parse_filter, FilterLine, FilterRule};

/// One include/exclude option as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleArg {
    Exclude(String),
    Include(String),
    ExcludeFrom(PathBuf),
    IncludeFrom(PathBuf),
    Filter(String),
}

/// Rule files larger than this are refused (a wrong file, not rules).
const MAX_FILE: u64 = 16 << 20;
/// Merge files may name merge files this deep.
const MAX_DEPTH: usize = 16;

/// The options of `m` (the matches of the command whose arguments hold
/// the five options) in command-line order.
pub fn in_order(m: &ArgMatches) -> Vec<RuleArg> {
    let mut v: Vec<(usize, RuleArg)> = Vec::new();
    let mut take = |id: &str, make: &dyn Fn(String) -> RuleArg| {
        if let (Some(idx), Some(vals)) = (m.indices_of(id), m.get_many::<String>(id)) {
            v.extend(idx.zip(vals).map(|(i, s)| (i, make(s.clone()))));
        }
    };
    take("exclude", &RuleArg::Exclude);
    take("include", &RuleArg::Include);
    take("exclude_from", &|s| RuleArg::ExcludeFrom(s.into()));
    take("include_from", &|s| RuleArg::IncludeFrom(s.into()));
    take("filter", &RuleArg::Filter);
    v.sort_by_key(|x| x.0);
    v.into_iter().map(|x| x.1).collect()
}

/// The rules the options say, in order; a rule file that cannot be read
/// or a rule ferry does not take is an error (one line).
pub fn rules(args: &[RuleArg]) -> Result<Vec<FilterRule>, String> {
    let mut out = Vec::new();
    for a in args {
        match a {
            RuleArg::Exclude(p) => simple(p, false, &mut out),
            RuleArg::Include(p) => simple(p, true, &mut out),
            RuleArg::ExcludeFrom(f) | RuleArg::IncludeFrom(f) => {
                let include = matches!(a, RuleArg::IncludeFrom(_));
                for l in read_lines(f)? {
                    if !(l.trim().is_empty() || l.starts_with('#') || l.starts_with(';')) {
                        simple(&l, include, &mut out);
                    }
                }
            }
            RuleArg::Filter(r) => filter(r, &mut out, 0)?,
        }
    }
    // An empty pattern matches nothing (rsync ignores it too).
    out.retain(|r| !r.pattern.is_empty());
    Ok(out)
}

/// `--files-from FILE`: only the paths FILE lists (relative to the source
/// directory; blank lines and lines starting with `#` or `;` skipped), with
/// the directories that lead to them; a listed directory's contents only
/// when `recursive` (rsync's `-r` given explicitly: `-a` does not imply it
/// here, as in rsync). As rules: each leading directory and each path
/// included, anchored and with its wildcards escaped, then `- *`; and the
/// paths as listed (without `.` components), which must exist.
pub fn files_from(file: &Path, recursive: bool) -> Result<(Vec<FilterRule>, Vec<String>), String> {
    let mut out = Vec::new();
    let mut paths = Vec::new();
    let mut dirs = std::collections::HashSet::new();
    for l in read_lines(file)? {
        if l.trim().is_empty() || l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        let parts: Vec<&str> = l
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        if parts.contains(&"..") {
            return Err(format!("{}: {l:?}: .. is not allowed", file.display()));
        }
        if parts.is_empty() {
            continue;
        }
        let mut at = String::new();
        for (i, c) in parts.iter().enumerate() {
            at.push('/');
            at.push_str(&escape(c));
            if i + 1 < parts.len() && dirs.insert(at.clone()) {
                out.push(FilterRule::include(&format!("{at}/")));
            }
        }
        out.push(FilterRule::include(&at));
        paths.push(parts.join("/"));
        if recursive {
            out.push(FilterRule::include(&format!("{at}/***")));
        }
    }
    out.push(FilterRule::exclude("*"));
    Ok((out, paths))
}

/// A name as a pattern that matches only itself.
fn escape(name: &str) -> String {
    let mut s = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            s.push('\\');
        }
        s.push(c);
    }
    s
}

/// An `--exclude`/`--include` pattern: `+ ` and `- ` in front choose the
/// rule's kind, and `!` alone clears the rules so far, as in rsync.
fn simple(p: &str, include: bool, out: &mut Vec<FilterRule>) {
    let rule = match (p.strip_prefix("+ "), p.strip_prefix("- ")) {
        _ if p == "!" => {
            out.clear();
            return;
        }
        (Some(x), _) => FilterRule::include(x),
        (_, Some(x)) => FilterRule::exclude(x),
        _ if include => FilterRule::include(p),
        _ => FilterRule::exclude(p),
    };
    out.push(rule);
}

fn filter(rule: &str, out: &mut Vec<FilterRule>, depth: usize) -> Result<(), String> {
    match parse_filter(rule).map_err(|e| e.to_string())? {
        FilterLine::Rule(r) => out.push(r),
        FilterLine::Clear => out.clear(),
        FilterLine::Nothing => {}
        FilterLine::Merge(f) => {
            if depth >= MAX_DEPTH {
                return Err(format!(
                    "--filter: merge files nested deeper than {MAX_DEPTH}"
                ));
            }
            for l in read_lines(Path::new(&f))? {
                filter(&l, out, depth + 1)?;
            }
        }
    }
    Ok(())
}

/// The lines of a rule file (`-`: standard input).
fn read_lines(f: &Path) -> Result<Vec<String>, String> {
    use std::io::Read;
    let mut b = Vec::new();
    let res = if f == Path::new("-") {
        std::io::stdin().take(MAX_FILE + 1).read_to_end(&mut b)
    } else {
        std::fs::File::open(f).and_then(|h| h.take(MAX_FILE + 1).read_to_end(&mut b))
    };
    res.map_err(|e| format!("{}: {e}", f.display()))?;
    if b.len() as u64 > MAX_FILE {
        return Err(format!("{}: a rule file of more than 16 MiB", f.display()));
    }
    let text =
        String::from_utf8(b).map_err(|_| format!("{}: rule file is not UTF-8", f.display()))?;
    Ok(text
        .lines()
        .map(|l| l.trim_end_matches('\r').to_string())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(r: Result<Vec<FilterRule>, String>) -> Vec<String> {
        r.unwrap().iter().map(|r| r.to_filter()).collect()
    }

    #[test]
    fn options_keep_their_order_and_files_are_read() {
        let d = tempfile::tempdir().unwrap();
        let ex = d.path().join("ex");
        std::fs::write(&ex, "# comment\n*.o\n\n+ keep.o\n; more\nbuild/\n").unwrap();
        let merge = d.path().join("m");
        std::fs::write(&merge, "+ *.c\n- *\n").unwrap();
        let args = vec![
            RuleArg::Include("a".into()),
            RuleArg::ExcludeFrom(ex.clone()),
            RuleArg::Filter(format!(". {}", merge.display())),
        ];
        let got = texts(rules(&args));
        assert_eq!(
            got,
            ["+ a", "- *.o", "+ keep.o", "- build/", "+ *.c", "- *"]
        );
        let cleared = rules(&[RuleArg::Exclude("x".into()), RuleArg::Filter("!".into())]);
        assert!(cleared.unwrap().is_empty());
        let cleared = rules(&[
            RuleArg::Exclude("a".into()),
            RuleArg::Exclude("!".into()),
            RuleArg::Exclude("b".into()),
            RuleArg::Include(String::new()),
        ]);
        assert_eq!(texts(cleared), ["- b"]);
        let missing = rules(&[RuleArg::IncludeFrom(d.path().join("nope"))]).unwrap_err();
        assert!(missing.contains("nope"), "{missing}");
        // A merge file that merges itself stops at the depth limit.
        let looped = d.path().join("loop");
        std::fs::write(&looped, format!("merge {}\n", looped.display())).unwrap();
        let e = rules(&[RuleArg::Filter(format!("merge {}", looped.display()))]).unwrap_err();
        assert!(e.contains("deeper"), "{e}");
        assert!(rules(&[RuleArg::Filter("P x".into())]).is_err());
    }

    #[test]
    fn files_from_lists_paths_and_their_directories() {
        let d = tempfile::tempdir().unwrap();
        let list = d.path().join("list");
        std::fs::write(&list, "a/b/c.txt\n# no\n./a/d\n/x*y\n\n").unwrap();
        let (rules, paths) = files_from(&list, false).unwrap();
        assert_eq!(paths, ["a/b/c.txt", "a/d", "x*y"]);
        let got = texts(Ok(rules));
        assert_eq!(
            got,
            [
                "+ /a/",
                "+ /a/b/",
                "+ /a/b/c.txt",
                "+ /a/d",
                "+ /x\\*y",
                "- *"
            ]
        );
        let (rec, _) = files_from(&list, true).unwrap();
        assert!(rec.iter().any(|r| r.to_filter() == "+ /a/d/***"));
        std::fs::write(&list, "a/../../etc\n").unwrap();
        assert!(files_from(&list, false).is_err());
    }
}
