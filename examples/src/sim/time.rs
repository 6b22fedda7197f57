//! Wall-clock formatting for simulated headers (RFC 3339 and HTTP-date), no dependencies.

fn civil(days: i64) -> (i64, u32, u32) {
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn split(unix_ms: u64) -> (i64, u32, u32, u64, u64, u64, u64) {
    let secs = unix_ms / 1000;
    let (y, m, d) = civil((secs / 86_400) as i64);
    let rem = secs % 86_400;
    (
        y,
        m,
        d,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        unix_ms % 1000,
    )
}

/// `2026-11-29T10:00:00.250Z`.
pub fn rfc3339(unix_ms: u64) -> String {
    let (y, m, d, hh, mm, ss, ms) = split(unix_ms);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{ms:03}Z")
}

/// `Sun, 29 Nov 2026 10:00:00 GMT`.
pub fn http_date(unix_ms: u64) -> String {
    let (y, m, d, hh, mm, ss, _) = split(unix_ms);
    let days = (unix_ms / 86_400_000) as usize;
    let wd = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][days % 7];
    let mon = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][(m - 1) as usize];
    format!("{wd}, {d:02} {mon} {y} {hh:02}:{mm:02}:{ss:02} GMT")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(http_date(784_111_777_000), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(rfc3339(1_709_208_000_500), "2024-02-29T12:00:00.500Z");
    }
}
