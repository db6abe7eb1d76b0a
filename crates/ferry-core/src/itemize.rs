//! The changes a run makes, as rsync's `--itemize-changes` names them: an
//! 11-character code `YXcstpoguax` and the path, from which `-v`'s lines
//! are derived too. The receiver builds each [`Change`]; the side that
//! prints (over the wire when the receiver is remote, see
//! `Message::Change`) renders it with [`itemized`] or [`verbose`].
//!
//! - `Y`: `>` received (printed `<` by a sender: sent), `c` created
//!   locally (a directory, a symlink), `h` a hard link, `.` only
//!   attributes changed, `*` a message (`*deleting`).
//! - `X`: `f` file, `d` directory, `L` symlink, `D` device, `S` FIFO or
//!   socket.
//! - then `c` checksum (or a symlink's target) differs, `s` size, `t`
//!   modification time, `p` permissions, `o` owner, `g` group, `u`
//!   (never: ferry keeps no access times), `a` ACL, `x` extended
//!   attributes; `.` where nothing changed, and `+++++++++` for a new
//!   entry.

pub use ferry_link::Change;

/// How an entry was brought up to date (rsync's first letter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Update {
    /// Its data came over the link (`>`).
    Received,
    /// Made at the destination without data: a directory, a symlink (`c`).
    Local,
    /// A further name of a file (`h`).
    HardLink,
    /// Only attributes changed (`.`).
    Meta,
}

/// The kind of the entry (rsync's second letter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A device node (`D`).
    Device,
    /// A FIFO or socket (`S`).
    Special,
}

/// Which attributes differ from what the destination had.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attrs {
    /// The content (`--checksum`) or a symlink's target.
    pub checksum: bool,
    pub size: bool,
    pub time: bool,
    pub perms: bool,
    pub owner: bool,
    pub group: bool,
    pub acl: bool,
    pub xattr: bool,
}

impl Attrs {
    pub fn any(&self) -> bool {
        *self != Attrs::default()
    }
}

/// The code of a change to an entry that existed (`new`: it did not).
pub fn code(update: Update, kind: Kind, new: bool, a: Attrs) -> [u8; 11] {
    let y = match update {
        Update::Received => b'>',
        Update::Local => b'c',
        Update::HardLink => b'h',
        Update::Meta => b'.',
    };
    let x = match kind {
        Kind::File => b'f',
        Kind::Dir => b'd',
        Kind::Symlink => b'L',
        Kind::Device => b'D',
        Kind::Special => b'S',
    };
    if new {
        return [y, x, b'+', b'+', b'+', b'+', b'+', b'+', b'+', b'+', b'+'];
    }
    let f = |on: bool, c: u8| if on { c } else { b'.' };
    [
        y,
        x,
        f(a.checksum, b'c'),
        f(a.size, b's'),
        f(a.time, b't'),
        f(a.perms, b'p'),
        f(a.owner, b'o'),
        f(a.group, b'g'),
        b'.',
        f(a.acl, b'a'),
        f(a.xattr, b'x'),
    ]
}

/// The code of a deletion.
pub const DELETING: [u8; 11] = *b"*deleting  ";

/// A change of `path` (relative to the destination; a directory's with a
/// trailing `/`, the root `./`).
pub fn change(code: [u8; 11], path: &[u8], is_dir: bool, to: &[u8]) -> Change {
    let mut p = if path.is_empty() && is_dir {
        b".".to_vec()
    } else {
        path.to_vec()
    };
    if is_dir {
        p.push(b'/');
    }
    Change {
        code,
        path: p,
        to: to.to_vec(),
    }
}

/// What a run lists: a change, or a line of its own (a file that failed
/// verification and is sent again, a skipped special file).
#[derive(Clone, Copy, Debug)]
pub enum Listed<'a> {
    Change(&'a Change),
    Line(&'a str),
}

/// Whether `c` must not reach a terminal or a log as it is: a control
/// character, or one that reorders or hides text (bidi overrides and
/// isolates, zero-width and line/paragraph separators).
pub fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{FEFF}')
}

/// `bytes` for a terminal: valid UTF-8 as it is, anything else and every
/// [`unsafe_char`] as rsync writes them, `\#ooo` (octal), so that a
/// name from a peer cannot move the cursor, retitle the window, start a
/// line or reorder what follows.
pub fn escaped(bytes: &[u8]) -> String {
    escaped_but(bytes, |_| false)
}

/// [`escaped`], except the characters `keep` allows (a multi-line text's
/// newlines).
pub fn escaped_but(bytes: &[u8], keep: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for ch in chunk.valid().chars() {
            if unsafe_char(ch) && !keep(ch) {
                let mut b = [0u8; 4];
                for byte in ch.encode_utf8(&mut b).bytes() {
                    out.push_str(&format!("\\#{byte:03o}"));
                }
            } else {
                out.push(ch);
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\#{byte:03o}"));
        }
    }
    out
}

/// rsync's `-i` line (`%i %n%L`). `sending`: the side printing is the
/// one that sent the data, so received becomes `<`, as rsync prints it
/// on the sending side.
pub fn itemized(c: &Change, sending: bool) -> String {
    let mut code = c.code;
    if sending && code[0] == b'>' {
        code[0] = b'<';
    }
    let mut line = format!("{} {}", String::from_utf8_lossy(&code), escaped(&c.path));
    if !c.to.is_empty() {
        let arrow = if c.code[0] == b'h' { "=>" } else { "->" };
        line.push_str(&format!(" {arrow} {}", escaped(&c.to)));
    }
    line
}

/// ferry's `-v` line for `c`; `None` for what `-v` does not list (only
/// attributes changed).
pub fn verbose(c: &Change) -> Option<String> {
    let path = escaped(&c.path);
    let to = escaped(&c.to);
    let new = c.code[2] == b'+';
    Some(match (c.code[0], c.code[1]) {
        (b'*', _) => format!("delete {path}"),
        (b'h', _) => format!("hardlink {path} => {to}"),
        (_, b'L') if new || c.code[2] == b'c' => format!("symlink {path} -> {to}"),
        // The root is named on the summary line's side, not here.
        (b'c', b'd') if new && c.path != b"./" => format!("create {path}"),
        (b'c', b'D' | b'S') if new => format!("new {path}"),
        (b'>', _) if new => format!("new {path}"),
        (b'>', _) => format!("update {path}"),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(c: [u8; 11]) -> String {
        String::from_utf8_lossy(&c).into_owned()
    }

    #[test]
    fn codes_read_as_rsync_writes_them() {
        let none = Attrs::default();
        assert_eq!(
            s(code(Update::Received, Kind::File, true, none)),
            ">f+++++++++"
        );
        assert_eq!(s(code(Update::Local, Kind::Dir, true, none)), "cd+++++++++");
        assert_eq!(
            s(code(Update::HardLink, Kind::File, true, none)),
            "hf+++++++++"
        );
        let st = Attrs {
            size: true,
            time: true,
            ..none
        };
        assert_eq!(
            s(code(Update::Received, Kind::File, false, st)),
            ">f.st......"
        );
        let p = Attrs {
            perms: true,
            ..none
        };
        assert_eq!(s(code(Update::Meta, Kind::File, false, p)), ".f...p.....");
        let link = Attrs {
            checksum: true,
            time: true,
            ..none
        };
        assert_eq!(
            s(code(Update::Local, Kind::Symlink, false, link)),
            "cLc.t......"
        );
        let all = Attrs {
            checksum: true,
            size: true,
            time: true,
            perms: true,
            owner: true,
            group: true,
            acl: true,
            xattr: true,
        };
        assert_eq!(s(code(Update::Meta, Kind::Dir, false, all)), ".dcstpog.ax");
        assert_eq!(s(DELETING), "*deleting  ");
    }

    #[test]
    fn lines_as_rsync_and_as_ferry_v() {
        let none = Attrs::default();
        let f = change(
            code(Update::Received, Kind::File, true, none),
            b"d/b",
            false,
            b"",
        );
        assert_eq!(itemized(&f, false), ">f+++++++++ d/b");
        assert_eq!(itemized(&f, true), "<f+++++++++ d/b");
        assert_eq!(verbose(&f).as_deref(), Some("new d/b"));
        let root = change(code(Update::Local, Kind::Dir, true, none), b"", true, b"");
        assert_eq!(itemized(&root, false), "cd+++++++++ ./");
        assert_eq!(verbose(&root), None);
        let d = change(code(Update::Local, Kind::Dir, true, none), b"d", true, b"");
        assert_eq!(verbose(&d).as_deref(), Some("create d/"));
        let l = change(
            code(Update::Local, Kind::Symlink, true, none),
            b"l",
            false,
            b"a",
        );
        assert_eq!(itemized(&l, true), "cL+++++++++ l -> a");
        assert_eq!(verbose(&l).as_deref(), Some("symlink l -> a"));
        let h = change(
            code(Update::HardLink, Kind::File, true, none),
            b"b",
            false,
            b"a",
        );
        assert_eq!(itemized(&h, false), "hf+++++++++ b => a");
        assert_eq!(verbose(&h).as_deref(), Some("hardlink b => a"));
        let del = change(DELETING, b"gone", true, b"");
        assert_eq!(itemized(&del, false), "*deleting   gone/");
        assert_eq!(verbose(&del).as_deref(), Some("delete gone/"));
        let t = Attrs { time: true, ..none };
        let meta = change(code(Update::Meta, Kind::Dir, false, t), b"e", true, b"");
        assert_eq!(itemized(&meta, false), ".d..t...... e/");
        assert_eq!(verbose(&meta), None);
        let upd = change(
            code(Update::Received, Kind::File, false, t),
            b"a",
            false,
            b"",
        );
        assert_eq!(verbose(&upd).as_deref(), Some("update a"));
    }

    #[test]
    fn names_from_a_peer_cannot_drive_the_terminal() {
        assert_eq!(escaped(b"a\x1b]0;pwned\x07b"), "a\\#033]0;pwned\\#007b");
        assert_eq!(escaped(b"caf\xc3\xa9 \xff"), "caf\u{e9} \\#377");
        assert_eq!(escaped("x\u{85}y".as_bytes()), "x\\#302\\#205y");
        let c = change(*b">f+++++++++", b"\n", false, b"");
        assert_eq!(itemized(&c, false), ">f+++++++++ \\#012");
        // Right-to-left overrides and line separators are escaped too.
        assert_eq!(
            escaped("a\u{202E}b\u{2028}".as_bytes()),
            "a\\#342\\#200\\#256b\\#342\\#200\\#250"
        );
        assert_eq!(escaped_but(b"a\nb\x1b", |c| c == '\n'), "a\nb\\#033");
    }
}
