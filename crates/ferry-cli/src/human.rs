//! Human-readable sizes, rates and durations, and the one parser of
//! sizes and rates that every command's options use.

/// `1536` → `1.5 KiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Bytes per second over `secs`, in the same binary units as [`bytes`]:
/// `117.7 MiB/s`.
pub fn rate(n: u64, secs: f64) -> String {
    if secs <= 0.0 {
        return "-".into();
    }
    format!("{}/s", bytes((n as f64 / secs) as u64))
}

/// `1 file`, `2 files`: a count with its noun, singular or plural.
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Seconds as `0.123 s` or `2m03s`.
pub fn secs(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.3} s")
    } else {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    }
}

/// Parses a size or a rate the way rsync reads `--max-size` and
/// `--bwlimit`: `K`, `M`, `G`, `T` (also `KiB`…, `Ki`…, any case) are
/// powers of 1024, `KB`, `MB`, `GB`, `TB` powers of 1000, a fraction is
/// allowed (`1.5M`), a trailing `B` or `/s` is ignored, and a bare number
/// counts units of `bare` bytes (rsync's `--bwlimit` takes KiB).
pub fn parse_size(s: &str, bare: u64) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: not a size (e.g. 64K, 1.5M, 2GB)"))?;
    let unit = unit.trim().trim_end_matches("/s").to_ascii_lowercase();
    let (letter, rest) = unit.split_at(unit.len().min(1));
    let power = match letter {
        "" => None,
        "b" if rest.is_empty() => Some(0),
        "k" => Some(1),
        "m" => Some(2),
        "g" => Some(3),
        "t" => Some(4),
        _ => {
            return Err(format!(
                "{s:?}: unknown unit (use K, M, G, T; KB… for powers of 1000)"
            ))
        }
    };
    let mult = match (power, rest) {
        (None, _) => bare as f64,
        (Some(p), "" | "i" | "ib") => 1024f64.powi(p),
        (Some(p), "b") => 1000f64.powi(p),
        _ => {
            return Err(format!(
                "{s:?}: unknown unit (use K, M, G, T; KB… for powers of 1000)"
            ))
        }
    };
    let n = (v * mult).round();
    if !(0.0..9.2e18).contains(&n) {
        return Err(format!("{s:?}: too large"));
    }
    if n == 0.0 && v != 0.0 {
        // Not a silent 0, which some options read as "no limit".
        return Err(format!("{s:?}: less than one byte"));
    }
    Ok(n as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats() {
        assert_eq!(super::bytes(5), "5 B");
        assert_eq!(super::bytes(1536), "1.5 KiB");
        assert_eq!(super::rate(2 << 20, 1.0), "2.0 MiB/s");
        assert_eq!(super::count(1, "file", "files"), "1 file");
        assert_eq!(super::count(0, "file", "files"), "0 files");
        assert_eq!(super::secs(125.0), "2m05s");
    }

    #[test]
    fn sizes_as_rsync_reads_them() {
        use super::parse_size as p;
        assert_eq!(p("256M", 1), Ok(256 << 20));
        assert_eq!(p("1MiB", 1), Ok(1 << 20));
        assert_eq!(p("64k", 1), Ok(64 << 10));
        assert_eq!(p("64Ki", 1), Ok(64 << 10));
        assert_eq!(p("110MB", 1), Ok(110_000_000));
        assert_eq!(p("110MB/s", 1), Ok(110_000_000));
        assert_eq!(p("1.5m", 1), Ok(3 << 19));
        assert_eq!(p("2g", 1), Ok(2 << 30));
        assert_eq!(p("1T", 1), Ok(1 << 40));
        assert_eq!(p("1000", 1), Ok(1000));
        assert_eq!(p("100b", 1), Ok(100));
        assert_eq!(p("500", 1024), Ok(500 << 10));
        assert!(p("M", 1).is_err());
        assert!(p("fast", 1).is_err());
        assert!(p("5X", 1).is_err());
        assert!(p("5Mx", 1).is_err());
        assert!(p("99999999999T", 1).is_err());
        assert!(p("0.1b", 1).is_err());
        assert_eq!(p("0", 1024), Ok(0));
        assert_eq!(p("0.0M", 1), Ok(0));
    }
}
