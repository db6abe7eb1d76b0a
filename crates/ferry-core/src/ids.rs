//! Owners and groups by name, as rsync maps them: the sender names each
//! user and group id the first time it lists it (`Entry::owner`,
//! `Entry::group`), and the receiver gives files the id that name has on
//! its host, keeping the number where the name is unknown there (or
//! with `--numeric-ids`). Id 0 is never mapped: root is root.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};

/// Most distinct ids either side keeps track of; past it, ids go by
/// number (a list that names more users than this is not a real tree).
pub const MAX_IDS: usize = 1 << 16;

/// Which kind of id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Which {
    User,
    Group,
}

/// Call a `get*_r` lookup with a buffer that grows while it says the
/// buffer is too small (a group with many members needs more than 4 KiB).
fn with_buffer<T>(mut call: impl FnMut(&mut [u8]) -> Result<Option<T>, i32>) -> Option<T> {
    let mut len = 4096;
    loop {
        let mut buf = vec![0u8; len];
        match call(&mut buf) {
            Err(libc::ERANGE) if len < (1 << 22) => len *= 4,
            Err(_) => return None,
            Ok(v) => return v,
        }
    }
}

/// One `get*_r` lookup: `call` fills an entry of type `E` using the
/// buffer; `take` reads what is wanted from it while the buffer lives.
fn lookup<E, T>(
    call: impl Fn(&mut E, &mut [u8], &mut *mut E) -> i32,
    take: impl Fn(&E) -> Option<T>,
) -> Option<T> {
    with_buffer(|buf| {
        // SAFETY: `E` is a C struct (passwd, group) for which all zeroes
        // is a valid value; the `*_r` functions write only into it and
        // `buf` (of the length they are given), and `res` is null or
        // points to the entry, whose strings point into `buf`, read by
        // `take` before `buf` goes.
        let mut ent: E = unsafe { std::mem::zeroed() };
        let mut res = std::ptr::null_mut();
        match call(&mut ent, buf, &mut res) {
            0 if res.is_null() => Ok(None),
            0 => Ok(take(&ent)),
            rc => Err(rc),
        }
    })
}

/// The bytes of a C string in a looked-up entry.
fn c_bytes(p: *const libc::c_char) -> Option<Vec<u8>> {
    // SAFETY: `p` is null or a NUL-terminated string in the lookup's buffer.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes().to_vec())
}

/// The name of `id` on this host.
pub fn name_of(which: Which, id: u32) -> Option<Vec<u8>> {
    // SAFETY (the calls): each gets its own entry, the buffer and its length.
    match which {
        Which::User => lookup(
            |e: &mut libc::passwd, b, r| unsafe {
                libc::getpwuid_r(id, e, b.as_mut_ptr().cast(), b.len(), r)
            },
            |e| c_bytes(e.pw_name),
        ),
        Which::Group => lookup(
            |e: &mut libc::group, b, r| unsafe {
                libc::getgrgid_r(id, e, b.as_mut_ptr().cast(), b.len(), r)
            },
            |e| c_bytes(e.gr_name),
        ),
    }
}

/// The id `name` has on this host.
pub fn id_of(which: Which, name: &[u8]) -> Option<u32> {
    let name = CString::new(name).ok()?;
    let n = name.as_ptr();
    // SAFETY (the calls): as in `name_of`; `n` lives as long as `name`.
    match which {
        Which::User => lookup(
            |e: &mut libc::passwd, b, r| unsafe {
                libc::getpwnam_r(n, e, b.as_mut_ptr().cast(), b.len(), r)
            },
            |e| Some(e.pw_uid),
        ),
        Which::Group => lookup(
            |e: &mut libc::group, b, r| unsafe {
                libc::getgrnam_r(n, e, b.as_mut_ptr().cast(), b.len(), r)
            },
            |e| Some(e.gr_gid),
        ),
    }
}

/// `--chown`'s `USER`, `USER:GROUP` or `:GROUP` as this host's ids
/// (names or numbers); an unknown name is an error.
pub fn parse_chown(spec: &str) -> Result<(Option<u32>, Option<u32>), String> {
    let (user, group) = spec.split_once(':').unwrap_or((spec, ""));
    let one = |which: Which, s: &str| -> Result<Option<u32>, String> {
        if s.is_empty() {
            return Ok(None);
        }
        if let Ok(n) = s.parse::<u32>() {
            return Ok(Some(n));
        }
        id_of(which, s.as_bytes()).map(Some).ok_or_else(|| {
            format!(
                "--chown {spec}: no {} {s:?} on this host",
                match which {
                    Which::User => "user",
                    Which::Group => "group",
                }
            )
        })
    };
    let ids = (one(Which::User, user)?, one(Which::Group, group)?);
    if ids == (None, None) {
        return Err(format!(
            "--chown {spec:?}: name a user, a group, or both (USER:GROUP)"
        ));
    }
    Ok(ids)
}

/// The sender's side: which ids have been named already.
#[derive(Debug, Default)]
pub struct Namer {
    named: HashSet<(Which, u32)>,
    /// The last user and group asked about: a tree mostly has one owner.
    last: [Option<u32>; 2],
}

impl Namer {
    /// The name to send with this entry's `id`: only the first time, and
    /// never for 0 (or past [`MAX_IDS`]).
    pub fn name(&mut self, which: Which, id: u32) -> Vec<u8> {
        self.name_with(which, id, name_of)
    }

    fn name_with(
        &mut self,
        which: Which,
        id: u32,
        lookup: impl Fn(Which, u32) -> Option<Vec<u8>>,
    ) -> Vec<u8> {
        let last = &mut self.last[which as usize];
        if *last == Some(id) {
            return Vec::new();
        }
        *last = Some(id);
        if id == 0 || self.named.len() >= MAX_IDS || self.named.contains(&(which, id)) {
            return Vec::new();
        }
        self.named.insert((which, id));
        lookup(which, id)
            .filter(|n| n.len() <= ferry_link::codec::MAX_NAME)
            .unwrap_or_default()
    }
}

/// The receiver's side: the sender's ids mapped to this host's.
#[derive(Debug, Default)]
pub struct Mapper {
    map: HashMap<(Which, u32), u32>,
    /// The last user and group mapped (sender's id, ours): an id once
    /// mapped stays so, and a tree mostly has one owner.
    last: [Option<(u32, u32)>; 2],
}

impl Mapper {
    /// This host's id for the sender's `id`, learning from `name` when
    /// the sender names it (the first entry with that id).
    pub fn map(&mut self, which: Which, id: u32, name: &[u8]) -> u32 {
        self.map_with(which, id, name, id_of)
    }

    fn map_with(
        &mut self,
        which: Which,
        id: u32,
        name: &[u8],
        lookup: impl Fn(Which, &[u8]) -> Option<u32>,
    ) -> u32 {
        if id == 0 {
            return 0;
        }
        if let Some((from, to)) = self.last[which as usize] {
            if from == id {
                return to;
            }
        }
        if !name.is_empty() && self.map.len() < MAX_IDS && !self.map.contains_key(&(which, id)) {
            let local = lookup(which, name).unwrap_or(id);
            self.map.insert((which, id), local);
        }
        let local = self.map.get(&(which, id)).copied();
        if let Some(to) = local {
            self.last[which as usize] = Some((id, to));
        }
        local.unwrap_or(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_go_once_per_id_and_never_for_root() {
        let mut n = Namer::default();
        let look = |_: Which, id: u32| Some(format!("u{id}").into_bytes());
        assert_eq!(n.name_with(Which::User, 1000, look), b"u1000");
        assert!(n.name_with(Which::User, 1000, look).is_empty());
        // A group of the same number is named on its own.
        assert_eq!(n.name_with(Which::Group, 1000, look), b"u1000");
        assert!(n.name_with(Which::User, 0, look).is_empty());
        let unnamed = |_: Which, _: u32| None;
        assert!(n.name_with(Which::User, 7, unnamed).is_empty());
    }

    #[test]
    fn names_map_to_local_ids_and_unknown_names_keep_the_number() {
        let mut m = Mapper::default();
        let look = |_: Which, name: &[u8]| (name == b"alice").then_some(501);
        assert_eq!(m.map_with(Which::User, 1000, b"alice", look), 501);
        // Later entries carry no name: the mapping stays.
        assert_eq!(m.map_with(Which::User, 1000, b"", look), 501);
        assert_eq!(m.map_with(Which::User, 1001, b"bob", look), 1001);
        assert_eq!(m.map_with(Which::Group, 1000, b"", look), 1000);
        // Root is root, whatever the sender calls it.
        assert_eq!(m.map_with(Which::User, 0, b"alice", look), 0);
        // A name sent again cannot remap an id already mapped.
        assert_eq!(m.map_with(Which::User, 1000, b"bob", look), 501);
    }

    #[test]
    fn chown_specs() {
        assert_eq!(parse_chown("root:root"), Ok((Some(0), Some(0))));
        assert_eq!(parse_chown("65534"), Ok((Some(65534), None)));
        assert_eq!(parse_chown(":7"), Ok((None, Some(7))));
        assert!(parse_chown(":").is_err());
        assert!(parse_chown("no-such-user-here:")
            .unwrap_err()
            .contains("no user"));
    }

    #[test]
    fn this_host_names_root() {
        assert_eq!(name_of(Which::User, 0).as_deref(), Some(&b"root"[..]));
        assert_eq!(id_of(Which::User, b"root"), Some(0));
        assert_eq!(id_of(Which::Group, b"no such group here"), None);
    }
}
