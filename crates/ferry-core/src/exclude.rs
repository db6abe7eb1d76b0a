//! Include and exclude rules (`--exclude`, `--include`, `--filter` and
//! their `-from` files), with rsync's meaning: the rules are tried in the
//! order given and the first one whose pattern matches decides; a path no
//! rule matches is included. Patterns are rsync's: a leading `/` anchors
//! to the root of the transfer, a trailing `/` matches only directories,
//! `*` stays within one name, `**` crosses `/`, `dir/***` is the directory
//! and everything in it, and a pattern with a `/` inside it that is not
//! anchored matches the end of the path. Paths are relative to each source
//! root (and, for `--delete`, to the destination root); an excluded
//! directory is not entered.
//!
//! The rules are compiled to one gitignore matcher (the `ignore` crate),
//! whose last matching line wins: the rules go in reversed.

use std::path::Path;

use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::error::{Error, Result};

/// One rule: a pattern and whether a match includes or excludes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub include: bool,
    pub pattern: String,
}

impl Rule {
    pub fn exclude(p: &str) -> Rule {
        Rule {
            include: false,
            pattern: p.to_string(),
        }
    }
    pub fn include(p: &str) -> Rule {
        Rule {
            include: true,
            pattern: p.to_string(),
        }
    }
    /// The rule as `--filter` writes it: `- PATTERN` or `+ PATTERN`.
    pub fn to_filter(&self) -> String {
        format!("{} {}", if self.include { '+' } else { '-' }, self.pattern)
    }
}

/// One line of a `--filter` rule or a merge file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FilterLine {
    Rule(Rule),
    /// `. FILE` / `merge FILE`: the rules in FILE, here.
    Merge(String),
    /// `!`: forget the rules so far.
    Clear,
    /// A blank line or a comment (`#` or `;` first).
    Nothing,
}

/// Parse one filter rule in rsync's syntax: `- PAT`, `+ PAT`, `exclude
/// PAT`, `include PAT`, `. FILE`, `merge FILE`, `!` (also `-, PAT`-style
/// short forms without modifiers). Rules ferry does not implement
/// (protect, hide, show, risk, per-directory merges, modifiers) are a
/// usage error naming the rule, never silently ignored.
pub fn parse_filter(line: &str) -> Result<FilterLine> {
    let t = line.trim_end_matches(['\r', '\n']);
    if t.trim().is_empty() || t.starts_with('#') || t.starts_with(';') {
        return Ok(FilterLine::Nothing);
    }
    if t.trim() == "!" || t.trim() == "clear" {
        return Ok(FilterLine::Clear);
    }
    let (word, rest) = match t.split_once([' ', '_']) {
        Some((w, r)) => (w, r),
        None => (t, ""),
    };
    let bad = |why: &str| Err(Error::Usage(format!("--filter {line:?}: {why}")));
    // `-,` style modifiers follow the rule's letter after a comma.
    let (name, mods) = word.split_once(',').unwrap_or((word, ""));
    if !mods.is_empty() {
        return bad("rule modifiers are not supported (ferry takes - + . merge !)");
    }
    let pat = rest.to_string();
    match name {
        "-" | "exclude" if !pat.is_empty() => Ok(FilterLine::Rule(Rule::exclude(&pat))),
        "+" | "include" if !pat.is_empty() => Ok(FilterLine::Rule(Rule::include(&pat))),
        "." | "merge" if !pat.is_empty() => Ok(FilterLine::Merge(pat)),
        "-" | "exclude" | "+" | "include" | "." | "merge" => bad("the rule has no pattern"),
        ":" | "dir-merge" => bad("per-directory merge files are not supported"),
        "P" | "protect" | "R" | "risk" | "H" | "hide" | "S" | "show" => {
            bad("protect/risk/hide/show rules are not supported: use - and + rules")
        }
        _ => bad("unknown rule (ferry takes - + . merge !)"),
    }
}

/// An rsync pattern as gitignore lines (without the `!`), any of which
/// matches what the pattern matches.
fn gitignore_lines(p: &str) -> Vec<String> {
    // rsync reads `\` as an escape only in a pattern with wildcards.
    let mut p = if p.contains(['*', '?', '[']) {
        p.to_string()
    } else {
        p.replace('\\', "\\\\")
    };
    // rsync's `/**/` stands for at least one directory; gitignore's also
    // for none. A leading unanchored `**/` is the same in both.
    while let Some(at) = p.find("/**/") {
        p.replace_range(at..at + 4, "/*/\u{0}/");
    }
    let p = p.replace('\u{0}', "**");
    gitignore_line(&p)
}

/// [`gitignore_lines`] once its escapes and `/**/` are settled.
fn gitignore_line(p: &str) -> Vec<String> {
    // `dir/***`: the directory and everything in it.
    if let Some(dir) = p.strip_suffix("/***") {
        let mut v = gitignore_line(dir);
        v.extend(gitignore_line(&format!("{dir}/**")));
        return v;
    }
    // rsync's `**` inside a name (`a/**.o`) crosses `/`; gitignore's
    // only does as a whole component. Two lines: within one name, and
    // across one or more directories.
    if let Some(at) = unbounded_double_star(p) {
        let (head, tail) = (&p[..at], &p[at + 2..]);
        let mut v = gitignore_line(&format!("{head}*{tail}"));
        v.extend(gitignore_line(&format!("{head}*/**/*{tail}")));
        return v;
    }
    let body = p.trim_end_matches('/');
    let inner_slash = !p.starts_with('/') && body.contains('/') && !body.starts_with("**/");
    let mut s = String::new();
    // gitignore anchors a pattern with an inner `/`; rsync matches it
    // against the end of the path.
    if inner_slash {
        s.push_str("**/");
    }
    // A `#` or `!` at the start is literal in rsync.
    if p.starts_with('#') || p.starts_with('!') {
        s.push('\\');
    }
    // Braces are literal in rsync, alternatives in gitignore.
    let mut escaped = false;
    for c in p.chars() {
        if !escaped && matches!(c, '{' | '}') {
            s.push('\\');
        }
        escaped = !escaped && c == '\\';
        s.push(c);
    }
    // gitignore drops trailing spaces unless escaped; rsync keeps them.
    let spaces = s.len() - s.trim_end_matches(' ').len();
    if spaces > 0 {
        s.truncate(s.len() - spaces);
        for _ in 0..spaces {
            s.push_str("\\ ");
        }
    }
    vec![s]
}

/// Where the first `**` that is not a whole path component starts.
fn unbounded_double_star(p: &str) -> Option<usize> {
    let b = p.as_bytes();
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'\\' {
            i += 2;
        } else if b[i] == b'*' && b[i + 1] == b'*' {
            let mut j = i;
            while j < b.len() && b[j] == b'*' {
                j += 1;
            }
            let before = i == 0 || b[i - 1] == b'/';
            let after = j == b.len() || b[j] == b'/';
            if !(before && after) {
                return Some(i);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    None
}

/// A compiled, ordered set of include and exclude rules.
#[derive(Clone, Debug)]
pub struct Excludes {
    set: Option<Gitignore>,
    rules: Vec<Rule>,
}

impl Excludes {
    /// Exclude `patterns`; an invalid glob is a usage error.
    pub fn new(patterns: &[String]) -> Result<Self> {
        let rules: Vec<Rule> = patterns.iter().map(|p| Rule::exclude(p)).collect();
        Self::from_rules(&rules)
    }

    /// Compile `rules`, first match wins; an invalid glob is a usage error.
    pub fn from_rules(rules: &[Rule]) -> Result<Self> {
        if rules.is_empty() {
            return Ok(Self {
                set: None,
                rules: Vec::new(),
            });
        }
        let mut b = GitignoreBuilder::new("/");
        for r in rules.iter().rev() {
            for line in gitignore_lines(&r.pattern) {
                let line = if r.include { format!("!{line}") } else { line };
                b.add_line(None, &line)
                    .map_err(|e| Error::Usage(format!("pattern {:?}: {e}", r.pattern)))?;
            }
        }
        let set = b
            .build()
            .map_err(|e| Error::Usage(format!("include/exclude patterns: {e}")))?;
        Ok(Self {
            set: Some(set),
            rules: rules.to_vec(),
        })
    }

    /// The rules as given, in order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// True when the entry at `rel` (relative, `/`-separated) is excluded.
    pub fn excluded(&self, rel: &Path, is_dir: bool) -> bool {
        match &self.set {
            None => false,
            // Not `matched_path_or_any_parents`: it also tries the
            // transfer's root itself (the empty path), which `*/`, `/*/`
            // or `**/` match as a directory, and so excluded every file.
            Some(s) => {
                let (mut at, mut dir) = (Some(rel), is_dir);
                while let Some(p) = at.filter(|p| !p.as_os_str().is_empty()) {
                    let m = s.matched(Path::new("/").join(p), dir);
                    if !m.is_none() {
                        return m.is_ignore();
                    }
                    (at, dir) = (p.parent(), true);
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests;
