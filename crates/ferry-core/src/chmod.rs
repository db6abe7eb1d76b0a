//! `--chmod`: rsync's permission changes applied to each entry as the
//! sender lists it, so the copy gets them (the source is not touched).
//! A comma-separated list of clauses; each is `D` (directories only) or
//! `F` (everything else) or nothing (both), then either an octal mode
//! (`755`) or chmod(1)'s symbolic form: who (`ugoa`; none meaning all
//! but the bits set in the umask, as chmod(1) and rsync have it), then
//! one or more operations (`+`, `-`, `=`) with permissions from
//! `rwxXst` (`X`: execute where a directory, or where someone already
//! may execute). Clauses apply in order. Symlinks are never changed.

use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    All,
    Dirs,
    Files,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Change {
    Octal(u32),
    /// Who (mask of the u/g/o bits), then (op, perms) pairs; no who
    /// given: the umask's bits are left out.
    Symbolic(u32, Vec<(char, String)>, bool),
}

/// Parsed `--chmod` clauses, with the text they came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chmod {
    clauses: Vec<(Target, Change)>,
    texts: Vec<String>,
    /// The process's umask when parsed (clauses without who).
    umask: u32,
}

impl Chmod {
    /// Parse each `--chmod` argument; a bad clause is a usage error.
    pub fn parse(args: &[String]) -> Result<Chmod> {
        Self::parse_with(args, crate::fsutil::umask())
    }

    fn parse_with(args: &[String], umask: u32) -> Result<Chmod> {
        let mut c = Chmod {
            umask,
            ..Chmod::default()
        };
        for a in args {
            for clause in a.split(',') {
                c.clauses.push(parse_clause(clause).ok_or_else(|| {
                    Error::Usage(format!("--chmod {a:?}: cannot read {clause:?}"))
                })?);
            }
            c.texts.push(a.clone());
        }
        Ok(c)
    }

    /// The arguments as given (for the remote side's command line).
    pub fn texts(&self) -> &[String] {
        &self.texts
    }

    pub fn is_empty(&self) -> bool {
        self.clauses.is_empty()
    }

    /// `mode` (a full `st_mode`) of a directory or not, changed.
    pub fn apply(&self, mode: u32, is_dir: bool) -> u32 {
        let mut perm = mode & 0o7777;
        for (t, ch) in &self.clauses {
            let hit = match t {
                Target::All => true,
                Target::Dirs => is_dir,
                Target::Files => !is_dir,
            };
            if hit {
                perm = change(perm, ch, is_dir, self.umask);
            }
        }
        (mode & !0o7777) | perm
    }
}

fn parse_clause(s: &str) -> Option<(Target, Change)> {
    let (target, rest) = match s.as_bytes().first()? {
        b'D' => (Target::Dirs, &s[1..]),
        b'F' => (Target::Files, &s[1..]),
        _ => (Target::All, s),
    };
    if !rest.is_empty() && rest.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return (rest.len() <= 4)
            .then(|| u32::from_str_radix(rest, 8).ok())
            .flatten()
            .map(|m| (target, Change::Octal(m)));
    }
    let who_end = rest.find(['+', '-', '='])?;
    let mut who = 0;
    for c in rest[..who_end].chars() {
        who |= match c {
            'u' => 0o4700,
            'g' => 0o2070,
            'o' => 0o1007,
            'a' => 0o7777,
            _ => return None,
        };
    }
    let masked = who == 0;
    if masked {
        who = 0o7777;
    }
    let mut ops = Vec::new();
    let mut cur: Option<(char, String)> = None;
    for c in rest[who_end..].chars() {
        match c {
            '+' | '-' | '=' => {
                ops.extend(cur.take());
                cur = Some((c, String::new()));
            }
            'r' | 'w' | 'x' | 'X' | 's' | 't' => cur.as_mut()?.1.push(c),
            _ => return None,
        }
    }
    ops.extend(cur);
    Some((target, Change::Symbolic(who, ops, masked)))
}

fn change(perm: u32, ch: &Change, is_dir: bool, umask: u32) -> u32 {
    let (who, ops, masked) = match ch {
        Change::Octal(m) => return *m,
        Change::Symbolic(who, ops, masked) => (*who, ops, *masked),
    };
    let mut perm = perm;
    for (op, perms) in ops {
        let mut bits = 0;
        for p in perms.chars() {
            bits |= match p {
                'r' => 0o444,
                'w' => 0o222,
                'x' => 0o111,
                'X' if is_dir || perm & 0o111 != 0 => 0o111,
                'X' => 0,
                's' => 0o6000,
                't' => 0o1000,
                _ => 0,
            };
        }
        let bits = if masked {
            bits & who & !umask
        } else {
            bits & who
        };
        perm = match op {
            '+' => perm | bits,
            '-' => perm & !bits,
            // `=`: the named classes get exactly these rwx bits, the
            // others are kept; set-id and sticky bits stay unless named
            // (as rsync has it).
            _ => (perm & !(who & 0o777)) | bits,
        };
    }
    perm
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Chmod {
        Chmod::parse_with(&[s.to_string()], 0o022).unwrap()
    }

    #[test]
    fn octal_and_targets() {
        let m = c("D755,F644");
        assert_eq!(m.apply(0o40700, true), 0o40755);
        assert_eq!(m.apply(0o100600, false), 0o100644);
        assert_eq!(c("0640").apply(0o100777, false), 0o100640);
    }

    #[test]
    fn symbolic_as_chmod_has_it() {
        assert_eq!(c("u+x").apply(0o100644, false), 0o100744);
        assert_eq!(c("go-w").apply(0o100666, false), 0o100644);
        assert_eq!(c("a=r").apply(0o100755, false), 0o100444);
        assert_eq!(c("+x").apply(0o100600, false), 0o100711);
        assert_eq!(c("o=").apply(0o100757, false), 0o100750);
        assert_eq!(c("u=rwX,g=rX,o=").apply(0o104750, false), 0o104750);
        assert_eq!(c("u+r-w").apply(0o100200, false), 0o100400);
        assert_eq!(c("g+s").apply(0o40755, true), 0o42755);
        assert_eq!(c("+t").apply(0o40777, true), 0o41777);
        // X: directories, and files someone may execute already.
        let x = c("a+X");
        assert_eq!(x.apply(0o40700, true), 0o40711);
        assert_eq!(x.apply(0o100600, false), 0o100600);
        assert_eq!(x.apply(0o100700, false), 0o100711);
        // No who: the umask's bits are left out (rsync with umask 022).
        assert_eq!(c("+w").apply(0o100600, false), 0o100600);
        assert_eq!(c("+w").apply(0o40555, true), 0o40755);
        assert_eq!(c("=rw").apply(0o100600, false), 0o100644);
        assert_eq!(c("D=rwx").apply(0o40700, true), 0o40755);
        let strict = Chmod::parse_with(&["+x".into(), "=r".into()], 0o077).unwrap();
        assert_eq!(strict.apply(0o100600, false), 0o100400);
        // Clauses in order.
        assert_eq!(c("a=,u+rw").apply(0o100777, false), 0o100600);
    }

    #[test]
    fn bad_clauses_are_refused() {
        for bad in ["", "u", "z+r", "u+q", "D", "99", "17777", "u+r,"] {
            assert!(Chmod::parse(&[bad.to_string()]).is_err(), "{bad}");
        }
    }
}
