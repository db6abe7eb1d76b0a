//! Human-readable sizes, rates and durations.

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
}
