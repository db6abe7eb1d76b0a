//! A client's path, confined to the daemon's root.
//!
//! The client names paths relative to the root (`ferry://host:port/a/b`
//! asks for `a/b`; a leading `/` means the root too). They are never joined
//! onto the root as strings: the directories leading to the last component
//! are opened from the root's handle beneath it (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, see `destdir::open_beneath`),
//! so `..`, a symlink on the way or a directory renamed meanwhile cannot
//! lead outside; the last component is looked at without following it and
//! refused when it is a symlink. The engine then gets a path through
//! `/proc/self/fd/N`, which names the very directory opened (not what a
//! path resolves to later), and the handles stay open for the session.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// A path the engine may use, and the handles it goes through.
pub struct Confined {
    pub path: String,
    _held: Vec<OwnedFd>,
}

/// Why a client's path was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("{0:?}: `..` may not appear in a path on the daemon")]
    DotDot(String),
    #[error("{0:?} is a symlink; the daemon does not follow symlinks its clients name")]
    Symlink(String),
    #[error("{path:?}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{0:?} is neither a regular file nor a directory; the daemon writes only those (and a stream only into a regular file)")]
    Special(String),
    #[error("{0:?}: a stream goes into or comes from a regular file, not a directory")]
    NotAFile(String),
}

/// `s` with control characters escaped, for a log line: a client's
/// path or argument cannot forge lines or drive a terminal.
pub fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let esc = c.is_control();
            let e: Vec<char> = if esc {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            e
        })
        .collect()
}

/// The components of `p`: `.` and empty ones dropped, `..` refused.
pub fn components(p: &str) -> Result<Vec<&str>, ConfineError> {
    let mut out = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(ConfineError::DotDot(p.into())),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn proc_fd(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// `client` (relative to the root, whose handle is `root` and whose path
/// the operator gave as `root_path`), as a path the engine may open.
/// `contents` (a trailing `/`): the directory itself is opened, so what is
/// walked is what was checked. A missing last component is allowed when
/// `may_create` (a push's destination); a missing directory on the way
/// never is.
pub fn confine(
    root: &OwnedFd,
    root_path: &str,
    client: &str,
    may_create: bool,
) -> Result<Confined, ConfineError> {
    let comps = components(client)?;
    let slash = if client.ends_with('/') { "/" } else { "" };
    let Some((last, dirs)) = comps.split_last() else {
        // The root itself: the operator's own path.
        let mut path = root_path.trim_end_matches('/').to_string();
        if path.is_empty() {
            path.push('/');
        }
        path.push_str(slash);
        return Ok(Confined {
            path: path.replace("//", "/"),
            _held: Vec::new(),
        });
    };
    let io = |source: io::Error| ConfineError::Io {
        path: client.into(),
        source,
    };
    let parent = if dirs.is_empty() {
        root.try_clone().map_err(io)?
    } else {
        crate::destdir::open_beneath(root, dirs.join("/").as_bytes()).map_err(io)?
    };
    match rustix::fs::statat(
        &parent,
        OsStr::from_bytes(last.as_bytes()),
        AtFlags::SYMLINK_NOFOLLOW,
    ) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
            return Err(ConfineError::Symlink(client.into()))
        }
        Ok(st)
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory && !slash.is_empty() =>
        {
            let dir = rustix::fs::openat(
                &parent,
                OsStr::from_bytes(last.as_bytes()),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| io(e.into()))?;
            return Ok(Confined {
                path: format!("{}/", proc_fd(&dir)),
                _held: vec![parent, dir],
            });
        }
        // A push writes into what it names: a FIFO or a device there
        // would block the session or take its data elsewhere.
        Ok(st)
            if may_create
                && !matches!(
                    FileType::from_raw_mode(st.st_mode),
                    FileType::RegularFile | FileType::Directory
                ) =>
        {
            return Err(ConfineError::Special(client.into()))
        }
        Ok(_) => {}
        Err(rustix::io::Errno::NOENT) if may_create => {}
        // `ARCHIVE#MEMBER` (a pull): the archive is checked as a last
        // component would be (beneath the root, not a symlink, a regular
        // file); the sender opens it without following a link.
        Err(rustix::io::Errno::NOENT) if archive_of(last).is_some() => {
            let archive = archive_of(last).unwrap_or_default();
            let st = rustix::fs::statat(
                &parent,
                OsStr::from_bytes(archive.as_bytes()),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| io(e.into()))?;
            match FileType::from_raw_mode(st.st_mode) {
                FileType::RegularFile => {}
                FileType::Symlink => return Err(ConfineError::Symlink(client.into())),
                _ => return Err(ConfineError::Special(client.into())),
            }
        }
        Err(e) => return Err(io(e.into())),
    }
    Ok(Confined {
        path: format!("{}/{last}{slash}", proc_fd(&parent)),
        _held: vec![parent],
    })
}

/// The archive of a last component that names a member (`vm.ova#disk`).
fn archive_of(last: &str) -> Option<&str> {
    last.rsplit_once('#')
        .filter(|(a, m)| !a.is_empty() && !m.is_empty())
        .map(|(a, _)| a)
}

/// The file `client` names beneath the root, opened for a stream to be
/// written into it (created, mode 0644 less the umask, when missing): the
/// directories on the way as [`confine`] opens them, the file itself
/// without following a symlink, and only a regular file (a FIFO or a
/// device would block the session or take its data elsewhere).
pub fn open_file(root: &OwnedFd, client: &str) -> Result<std::fs::File, ConfineError> {
    open_regular(root, client, true)
}

/// As [`open_file`], to read an existing regular file (a stream the
/// daemon sends).
pub fn open_to_read(root: &OwnedFd, client: &str) -> Result<std::fs::File, ConfineError> {
    open_regular(root, client, false)
}

fn open_regular(root: &OwnedFd, client: &str, write: bool) -> Result<std::fs::File, ConfineError> {
    let comps = components(client)?;
    let io = |source: io::Error| ConfineError::Io {
        path: client.into(),
        source,
    };
    let Some((last, dirs)) = comps.split_last().filter(|_| !client.ends_with('/')) else {
        return Err(io(io::Error::other("a stream goes into a file: name one")));
    };
    let parent = if dirs.is_empty() {
        root.try_clone().map_err(io)?
    } else {
        crate::destdir::open_beneath(root, dirs.join("/").as_bytes()).map_err(io)?
    };
    let name = OsStr::from_bytes(last.as_bytes());
    let regular = |mode| FileType::from_raw_mode(mode) == FileType::RegularFile;
    match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
            return Err(ConfineError::Symlink(client.into()))
        }
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            return Err(ConfineError::NotAFile(client.into()))
        }
        Ok(st) if !regular(st.st_mode) => return Err(ConfineError::Special(client.into())),
        Ok(_) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(io(e.into())),
    }
    let how = if write {
        OFlags::RDWR | OFlags::CREATE
    } else {
        OFlags::RDONLY
    };
    let flags = how | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd =
        rustix::fs::openat(&parent, name, flags, Mode::from_raw_mode(0o644)).map_err(
            |e| match e {
                rustix::io::Errno::LOOP => ConfineError::Symlink(client.into()),
                e => io(e.into()),
            },
        )?;
    // Whatever raced the look above, what was opened is what is written.
    let st = rustix::fs::fstat(&fd).map_err(|e| io(e.into()))?;
    if !regular(st.st_mode) {
        return Err(ConfineError::Special(client.into()));
    }
    let fd = if !write {
        fd
    } else if st.st_nlink != 1 || st.st_uid != rustix::process::geteuid().as_raw() {
        // Another name of a file (perhaps outside the root), or another
        // user's file: not written through. The name gets a new file, as a
        // sync's rename would give it.
        drop(fd);
        rustix::fs::unlinkat(&parent, name, AtFlags::empty()).map_err(|e| io(e.into()))?;
        let excl = flags | OFlags::EXCL;
        rustix::fs::openat(&parent, name, excl, Mode::from_raw_mode(0o644))
            .map_err(|e| io(e.into()))?
    } else {
        // Set-ID bits a write by root would keep: never for a client's bytes.
        let mode = st.st_mode & 0o777;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| io(e.into()))?;
        fd
    };
    rustix::fs::fcntl_setfl(&fd, OFlags::empty()).map_err(|e| io(e.into()))?;
    Ok(std::fs::File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(d: &std::path::Path) -> OwnedFd {
        std::fs::File::open(d).unwrap().into()
    }

    #[test]
    fn paths_stay_beneath_the_root() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = t.path().join("root");
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        std::fs::write(r.join("a/f"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("a/out")).unwrap();
        let fd = root(&r);
        let rs = r.to_str().unwrap();
        // Inside: usable paths naming the same things.
        for (p, want) in [
            ("a/b/", "a/b"),
            ("/a/f", "a/f"),
            ("a/./new", "a/new"),
            ("", ""),
        ] {
            let c = confine(&fd, rs, p, true).unwrap();
            let got = std::fs::canonicalize(&c.path).ok();
            if want.ends_with("new") {
                assert!(std::path::Path::new(&c.path).parent().unwrap().is_dir());
            } else {
                assert_eq!(
                    got.unwrap(),
                    std::fs::canonicalize(r.join(want)).unwrap(),
                    "{p}"
                );
            }
        }
        // Outside: refused, whichever way.
        assert!(matches!(
            confine(&fd, rs, "../x", true),
            Err(ConfineError::DotDot(_))
        ));
        assert!(matches!(
            confine(&fd, rs, "a/../../x", true),
            Err(ConfineError::DotDot(_))
        ));
        assert!(matches!(
            confine(&fd, rs, "out", true),
            Err(ConfineError::Symlink(_))
        ));
        assert!(matches!(
            confine(&fd, rs, "out/", true),
            Err(ConfineError::Symlink(_))
        ));
        assert!(matches!(
            confine(&fd, rs, "out/x", true),
            Err(ConfineError::Io { .. })
        ));
        assert!(matches!(
            confine(&fd, rs, "a/out/x", true),
            Err(ConfineError::Io { .. })
        ));
        assert!(matches!(
            confine(&fd, rs, "missing/x", true),
            Err(ConfineError::Io { .. })
        ));
    }

    #[test]
    fn stream_files_stay_beneath_the_root_and_are_regular() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = t.path().join("root");
        std::fs::create_dir_all(r.join("a")).unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), r.join("a/link")).unwrap();
        let fifo = std::process::Command::new("mkfifo")
            .arg(r.join("a/fifo"))
            .status()
            .unwrap();
        assert!(fifo.success());
        let fd = root(&r);
        use std::io::Write;
        open_file(&fd, "a/new.zfs")
            .unwrap()
            .write_all(b"data")
            .unwrap();
        assert_eq!(std::fs::read(r.join("a/new.zfs")).unwrap(), b"data");
        assert!(open_file(&fd, "/a/new.zfs").is_ok());
        for bad in [
            "../x",
            "out/secret",
            "a/link",
            "a/fifo",
            "a/",
            "",
            "missing/x",
        ] {
            assert!(open_file(&fd, bad).is_err(), "{bad}");
        }
        assert_eq!(std::fs::read(outside.path().join("secret")).unwrap(), b"s");
        // To read: only what is there, and the same refusals.
        assert!(open_to_read(&fd, "a/new.zfs").is_ok());
        for bad in ["a/none", "../x", "out/secret", "a/link", "a/fifo", "a/"] {
            assert!(open_to_read(&fd, bad).is_err(), "{bad}");
        }
        assert!(!r.join("a/none").exists());
    }
}
