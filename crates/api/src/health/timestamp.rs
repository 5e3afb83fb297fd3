//! ISO-8601 UTC timestamps from the system clock, without a date crate.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub(super) fn iso8601_now() -> String {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    iso8601(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub(super) fn iso8601(unix_ms: i64) -> String {
    let days = unix_ms.div_euclid(86_400_000);
    let ms_of_day = unix_ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60);
    let (second, milli) = (ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{milli:03}Z")
}

/// The proleptic Gregorian date of a day count since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let day = doy - (153 * mp + 2) / 5 + 1; // [1, 31]
    let month = if mp < 10 { mp + 3 } else { mp - 9 }; // [1, 12]
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Both are small and positive by construction.
    (year, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    use super::iso8601;

    fn check(unix_ms: i64, expected: &str) {
        assert_eq!(iso8601(unix_ms), expected, "{unix_ms}");
    }

    #[test]
    fn formats_known_instants() {
        check(0, "1970-01-01T00:00:00.000Z");
        check(951_782_400_000, "2000-02-29T00:00:00.000Z");
        check(1_709_210_096_789, "2024-02-29T12:34:56.789Z");
        check(1_735_689_599_999, "2024-12-31T23:59:59.999Z");
        check(4_107_542_400_000, "2100-03-01T00:00:00.000Z");
        check(-1, "1969-12-31T23:59:59.999Z");
    }
}
