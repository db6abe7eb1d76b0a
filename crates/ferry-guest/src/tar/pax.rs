//! PAX extended headers: "LEN key=value\n" records, read strictly.

/// What the extended headers before an entry say about it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Pax {
    /// `path`: the entry's name, overriding the header's.
    pub path: Option<Vec<u8>>,
    /// `GNU.sparse.name`: the real name of a sparse member (whose header
    /// carries a made-up "GNUSparseFile.N" name); overrides `path`.
    pub sparse_name: Option<Vec<u8>>,
    /// `size`: the size of the entry's data, overriding the header's.
    pub size: Option<u64>,
    /// Any `GNU.sparse.*` record: the member is stored sparse.
    pub sparse: bool,
}

impl Pax {
    /// The entry's name according to these records, if they give one.
    pub fn name(&self) -> Option<&[u8]> {
        self.sparse_name.as_deref().or(self.path.as_deref())
    }
}

/// Read the records of an extended header's data into `pax` (later
/// records override earlier ones). An error says what is wrong.
///
/// Each record is "LEN key=value\n", LEN being the decimal length of the
/// whole record. NUL padding after the last record is tolerated (GNU tar
/// does); anything else that is not a well-formed record is refused.
pub(super) fn parse(mut data: &[u8], pax: &mut Pax) -> Result<(), String> {
    while let Some(&first) = data.first() {
        if first == 0 {
            if data.iter().all(|&c| c == 0) {
                return Ok(());
            }
            return Err("a NUL among its records".into());
        }
        let digits = data.iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 20 {
            return Err("a record without a length".into());
        }
        if data.get(digits) != Some(&b' ') {
            return Err("a record length not followed by a space".into());
        }
        let len = data
            .get(..digits)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| d.parse::<usize>().ok())
            .ok_or("a record length out of range")?;
        let record = data
            .get(..len)
            .ok_or_else(|| format!("a record of {len} bytes past the end of the header"))?;
        // "LEN " + "k=" + "\n" at least.
        let body = record
            .get(digits + 1..)
            .and_then(|r| r.strip_suffix(b"\n"))
            .ok_or_else(|| format!("a record of {len} bytes not ending with a newline"))?;
        let eq = body
            .iter()
            .position(|&c| c == b'=')
            .ok_or("a record without '='")?;
        let (key, value) = (&body[..eq], &body[eq + 1..]);
        if key.is_empty() {
            return Err("a record with an empty keyword".into());
        }
        apply(key, value, pax)?;
        data = &data[len..];
    }
    Ok(())
}

fn apply(key: &[u8], value: &[u8], pax: &mut Pax) -> Result<(), String> {
    // An empty value undoes the keyword: the header's own field applies.
    let owned = (!value.is_empty()).then(|| value.to_vec());
    match key {
        b"path" => pax.path = owned,
        b"size" => {
            pax.size = match value {
                [] => None,
                _ => Some(decimal(value).ok_or("a size record that is not a number")?),
            }
        }
        b"GNU.sparse.name" => {
            pax.sparse = true;
            pax.sparse_name = owned;
        }
        k if k.starts_with(b"GNU.sparse.") => pax.sparse = true,
        _ => {}
    }
    Ok(())
}

/// A decimal number of digits only, that fits in a u64.
fn decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |v, &c| {
        let d = c.checked_sub(b'0').filter(|d| *d <= 9)?;
        v.checked_mul(10)?.checked_add(u64::from(d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kv: &str) -> String {
        // The length counts itself: find the fixed point.
        let mut len = kv.len() + 3;
        loop {
            let s = format!("{len} {kv}\n");
            if s.len() == len {
                return s;
            }
            len = s.len();
        }
    }

    fn parsed(data: &[u8]) -> Result<Pax, String> {
        let mut pax = Pax::default();
        parse(data, &mut pax).map(|()| pax)
    }

    #[test]
    fn reads_path_size_and_sparse() {
        let long = "d/".repeat(200) + "disk.vmdk";
        let data = rec(&format!("path={long}")) + &rec("size=8589934593") + &rec("mtime=1.5");
        let pax = parsed(data.as_bytes()).unwrap();
        assert_eq!(pax.path.as_deref(), Some(long.as_bytes()));
        assert_eq!(pax.size, Some(8589934593));
        assert!(!pax.sparse);

        let data = rec("GNU.sparse.major=1") + &rec("GNU.sparse.name=d/sp") + &rec("path=x");
        let pax = parsed(data.as_bytes()).unwrap();
        assert!(pax.sparse);
        assert_eq!(pax.name(), Some(&b"d/sp"[..]));
    }

    #[test]
    fn a_value_may_hold_newlines_and_equals() {
        let data = rec("path=a=b\nc");
        assert_eq!(
            parsed(data.as_bytes()).unwrap().path.as_deref(),
            Some(&b"a=b\nc"[..])
        );
    }

    #[test]
    fn nul_padding_after_the_records_is_fine() {
        let mut data = rec("path=x").into_bytes();
        data.extend_from_slice(&[0; 20]);
        assert_eq!(parsed(&data).unwrap().path.as_deref(), Some(&b"x"[..]));
    }

    #[test]
    fn an_empty_value_undoes_the_keyword() {
        let data = rec("path=x") + &rec("path=") + &rec("size=5") + &rec("size=");
        assert_eq!(parsed(data.as_bytes()).unwrap(), Pax::default());
    }

    #[test]
    fn refuses_bad_records() {
        let overflow = rec("size=99999999999999999999");
        let bad: &[&[u8]] = &[
            b"path=x\n",         // no length
            b"11path=x\n",       // no space
            b"99 path=x\n",      // longer than the data
            b"9 path=xy\n",      // the length is off by one: no newline at its end
            b"7 path\n",         // no '='
            b"5 =x\n",           // empty keyword
            b"12 size=12x\n",    // size not a number
            overflow.as_bytes(), // size overflows
            b"3 \n",             // too short for its own length
            b"0 \n",
            b"1 x=\n",
            b"9 path=x\n\0junk",
            b"99999999999999999999999 x=y\n",
            b"-5 path=x\n",
        ];
        for b in bad {
            assert!(
                parsed(b).is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(b)
            );
        }
    }
}
