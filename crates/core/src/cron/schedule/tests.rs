use chrono::{TimeZone, Utc};
use chrono_tz::Tz;

use super::*;

fn check_expr(input: &str, expected: &str) {
    let schedule = Schedule::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
    assert_eq!(schedule.expr(), expected, "{input}");
}

fn check_error(input: &str, expected: &str) {
    let error = Schedule::parse(input).expect_err(input).to_string();
    assert!(error.contains(expected), "{input}: {error:?} should contain {expected:?}");
}

/// The next `n` firings after `start` (UTC text), as local texts in `tz`.
fn check_next(expr: &str, tz: &str, start: &str, expected: &[&str]) {
    let schedule = Schedule::parse(expr).unwrap();
    let tz: Tz = tz.parse().unwrap();
    let mut at = chrono::DateTime::parse_from_rfc3339(start).unwrap().with_timezone(&Utc);
    let mut got = Vec::new();
    for _ in expected {
        let next = schedule.next_after(&at, &tz).unwrap();
        got.push(next.to_rfc3339());
        at = next.with_timezone(&Utc);
    }
    assert_eq!(got, expected, "{expr} in {tz} after {start}");
}

#[test]
fn every_shorthand_is_its_cron_expression() {
    check_expr("every 30m", "*/30 * * * *");
    check_expr("every 5 minutes", "*/5 * * * *");
    check_expr("every 1m", "* * * * *");
    check_expr("every minute", "* * * * *");
    check_expr("every 2h", "0 */2 * * *");
    check_expr("every 1 hour", "0 * * * *");
    check_expr("Every 15 Min", "*/15 * * * *");
    check_expr("daily at 9am", "0 9 * * *");
    check_expr("daily at 9:30pm", "30 21 * * *");
    check_expr("daily at 12am", "0 0 * * *");
    check_expr("daily at 12pm", "0 12 * * *");
    check_expr("daily at 21:15", "15 21 * * *");
    check_expr("weekdays at 09:30", "30 9 * * 1-5");
    check_expr("weekends at 10am", "0 10 * * 0,6");
    check_expr("@hourly", "0 * * * *");
    check_expr("@daily", "0 0 * * *");
    check_expr("@weekly", "0 0 * * 0");
    check_expr("hourly", "0 * * * *");
    check_expr("  0   9 * * MON-fri ", "0 9 * * mon-fri");
}

#[test]
fn bad_schedules_say_what_is_wrong() {
    check_error("", "empty");
    check_error("* * * *", "expected 5 fields");
    check_error("every 90m", "minutes must be 1 to 59");
    check_error("every 0m", "minutes must be 1 to 59");
    check_error("every 24h", "hours must be 1 to 23");
    check_error("every fortnight", "`every fortnight`");
    check_error("daily at 25:00", "`25:00` is not a time of day");
    check_error("daily at 13pm", "not a time of day");
    check_error("daily at noon", "not a time of day");
    check_error("weekdays at 9:5", "not a time of day");
    check_error("60 * * * *", "minute field `60`: 60 is out of range 0-59");
    check_error("* 24 * * *", "hour field");
    check_error("* * 0 * *", "day of month field `0`");
    check_error("* * * 13 *", "month field");
    check_error("* * * foo *", "`foo` is not a number or a name such as `jan`");
    check_error("* * * * 8", "day of week field");
    check_error("*/0 * * * *", "step `0`");
    check_error("5-1 * * * *", "goes backwards");
    check_error("1,,2 * * * *", "empty list item");
    check_error("0 0 30 2 *", "never fires");
    check_error("@yearly", "unknown shorthand");
}

#[test]
fn fields_take_ranges_steps_lists_and_names() {
    check_next(
        "0,30 9-10 * * *",
        "UTC",
        "2026-03-02T08:59:00Z",
        &["2026-03-02T09:00:00+00:00", "2026-03-02T09:30:00+00:00", "2026-03-02T10:00:00+00:00"],
    );
    check_next(
        "10-50/20 * * * *",
        "UTC",
        "2026-03-02T08:00:00Z",
        &["2026-03-02T08:10:00+00:00", "2026-03-02T08:30:00+00:00", "2026-03-02T08:50:00+00:00"],
    );
    check_next("5/20 8 * * *", "UTC", "2026-03-02T08:30:00Z", &["2026-03-02T08:45:00+00:00"]);
    // 2026-03-02 is a Monday.
    check_next(
        "0 12 * * sat,SUN",
        "UTC",
        "2026-03-02T00:00:00Z",
        &["2026-03-07T12:00:00+00:00", "2026-03-08T12:00:00+00:00"],
    );
    check_next("0 0 * * 7", "UTC", "2026-03-02T00:00:00Z", &["2026-03-08T00:00:00+00:00"]);
    check_next("0 0 1 jan,jul *", "UTC", "2026-03-02T00:00:00Z", &["2026-07-01T00:00:00+00:00"]);
    check_next("0 0 29 2 *", "UTC", "2026-03-02T00:00:00Z", &["2028-02-29T00:00:00+00:00"]);
    // Day of month and day of week both restricted: either matches.
    check_next(
        "0 0 13 * fri",
        "UTC",
        "2026-03-02T00:00:00Z",
        &["2026-03-06T00:00:00+00:00", "2026-03-13T00:00:00+00:00", "2026-03-20T00:00:00+00:00"],
    );
}

#[test]
fn firings_are_strictly_after_the_instant_and_on_whole_minutes() {
    check_next("* * * * *", "UTC", "2026-03-02T08:00:00Z", &["2026-03-02T08:01:00+00:00"]);
    check_next("* * * * *", "UTC", "2026-03-02T08:00:30.5Z", &["2026-03-02T08:01:00+00:00"]);
    check_next(
        "every 30m",
        "UTC",
        "2026-03-02T08:29:59Z",
        &["2026-03-02T08:30:00+00:00", "2026-03-02T09:00:00+00:00"],
    );
}

#[test]
fn shorthands_fire_when_they_say() {
    check_next(
        "every 2h",
        "UTC",
        "2026-03-02T03:00:00Z",
        &["2026-03-02T04:00:00+00:00", "2026-03-02T06:00:00+00:00"],
    );
    check_next(
        "daily at 9am",
        "UTC",
        "2026-03-02T09:00:00Z",
        &["2026-03-03T09:00:00+00:00", "2026-03-04T09:00:00+00:00"],
    );
    // Friday 2026-03-06 → Monday 2026-03-09.
    check_next(
        "weekdays at 09:30",
        "UTC",
        "2026-03-06T10:00:00Z",
        &["2026-03-09T09:30:00+00:00", "2026-03-10T09:30:00+00:00"],
    );
}

#[test]
fn a_time_zone_moves_the_firing() {
    check_next(
        "daily at 9am",
        "Europe/Berlin",
        "2026-01-10T00:00:00Z",
        &["2026-01-10T09:00:00+01:00"],
    );
    check_next(
        "daily at 9am",
        "America/New_York",
        "2026-07-10T00:00:00Z",
        &["2026-07-10T09:00:00-04:00"],
    );
    check_next(
        "daily at 21:15",
        "Asia/Kolkata",
        "2026-07-10T15:00:00Z",
        &["2026-07-10T21:15:00+05:30"],
    );
    assert_eq!(parse_timezone("Europe/Berlin").unwrap(), chrono_tz::Europe::Berlin);
    let error = parse_timezone("Mars/Olympus").unwrap_err().to_string();
    assert!(error.contains("unknown time zone `Mars/Olympus`"), "{error}");
}

#[test]
fn a_skipped_hour_fires_at_the_next_valid_time() {
    // Berlin skips 02:00-03:00 on 2026-03-29.
    check_next(
        "30 2 * * *",
        "Europe/Berlin",
        "2026-03-28T12:00:00Z",
        &["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"],
    );
    // Every 30 minutes through the gap: 01:30, then 03:00 once, then 03:30.
    check_next(
        "every 30m",
        "Europe/Berlin",
        "2026-03-29T00:15:00Z",
        &["2026-03-29T01:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T03:30:00+02:00"],
    );
}

#[test]
fn a_repeated_hour_fires_once() {
    // Berlin repeats 02:00-03:00 on 2026-10-25.
    check_next(
        "30 2 * * *",
        "Europe/Berlin",
        "2026-10-24T12:00:00Z",
        &["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"],
    );
    let schedule = Schedule::parse("30 2 * * *").unwrap();
    let tz = chrono_tz::Europe::Berlin;
    let first =
        schedule.next_after(&Utc.with_ymd_and_hms(2026, 10, 24, 12, 0, 0).unwrap(), &tz).unwrap();
    // From inside the repeat (the second 02:30 is 01:30 UTC), the next is the next day.
    let second = schedule.next_after(&first, &tz).unwrap();
    assert_eq!(second.to_rfc3339(), "2026-10-26T02:30:00+01:00");
}

proptest::proptest! {
    #[test]
    fn next_firings_increase_and_match(minute in 0u32..60, hour in 0u32..24, start in 1_700_000_000i64..1_900_000_000) {
        let schedule = Schedule::parse(&format!("{minute} {hour} * * *")).unwrap();
        let tz = chrono_tz::America::New_York;
        let mut at = Utc.timestamp_opt(start, 0).unwrap().with_timezone(&tz);
        for _ in 0..3 {
            let next = schedule.next_after(&at, &tz).unwrap();
            proptest::prop_assert!(next > at);
            at = next;
        }
    }
}
