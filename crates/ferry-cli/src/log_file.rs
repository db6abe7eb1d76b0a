//! `--log-file FILE`: what a run did, appended to FILE as rsync does: each
//! line stamped with the UTC time and the process id (each change, each
//! error and notice, and the summary).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

pub struct LogFile(Mutex<File>);

impl LogFile {
    pub fn open(path: &Path) -> std::io::Result<LogFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o644)
            .open(path)?;
        Ok(LogFile(Mutex::new(f)))
    }

    /// Append `text` as one stamped line (a write that fails is dropped:
    /// the log never stops a run).
    pub fn line(&self, text: &str) {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // One line each, whatever a peer put in the text.
        let text = ferry_core::itemize::escaped(text.as_bytes());
        let l = format!("{} [{}] {text}\n", stamp(secs), std::process::id());
        if let Ok(mut f) = self.0.lock() {
            let _ = f.write_all(l.as_bytes());
        }
    }
}

/// `YYYY/MM/DD HH:MM:SS` (UTC) of `secs` since the epoch, rsync's form.
fn stamp(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let t = secs % 86400;
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}/{m:02}/{d:02} {:02}:{:02}:{:02}",
        t / 3600,
        t % 3600 / 60,
        t % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn stamps() {
        assert_eq!(super::stamp(0), "1970/01/01 00:00:00");
        assert_eq!(super::stamp(951_782_400), "2000/02/29 00:00:00");
        assert_eq!(super::stamp(1_796_439_510), "2026/12/05 02:58:30");
    }
}
