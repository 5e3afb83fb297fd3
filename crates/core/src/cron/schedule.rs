//! When a job fires: 5-field cron expressions and the shorthands, parsed into
//! one [`Schedule`], and the next firing after an instant in a time zone.
//!
//! Shorthands are written as the cron expression they mean, so a job shows one
//! form whichever way it was entered: `every 30m` is `*/30 * * * *`, `every 2h`
//! `0 */2 * * *`, `daily at 9am` `0 9 * * *`, `weekdays at 09:30`
//! `30 9 * * 1-5`. Like cron, `every` steps are aligned to the hour (minutes)
//! or the day (hours).
//!
//! Daylight saving: a local time that does not exist (the hour skipped in
//! spring) fires at the first valid time after the gap; a local time that
//! happens twice (the hour repeated in autumn) fires once, at its first
//! occurrence.

use std::fmt;

use chrono::{DateTime, Datelike, Days, LocalResult, NaiveDate, NaiveDateTime, TimeZone, Timelike};
use chrono_tz::Tz;

/// A parsed schedule: which minutes, hours, days and months fire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The normalised cron expression, as shown to users.
    expr: String,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Both day fields restricted: a day matches either (cron's rule).
    day_or: bool,
}

/// Why a schedule was refused; the message names the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScheduleError(String);

impl ScheduleError {
    fn new(message: impl Into<String>) -> Self {
        ScheduleError(message.into())
    }
}

/// One of the five fields: its name, range and value names.
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Field = Field { name: "minute", min: 0, max: 59, names: &[] };
const HOUR: Field = Field { name: "hour", min: 0, max: 23, names: &[] };
const DAY: Field = Field { name: "day of month", min: 1, max: 31, names: &[] };
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
};
/// 0 and 7 are both Sunday.
const WEEKDAY: Field = Field {
    name: "day of week",
    min: 0,
    max: 7,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

impl Schedule {
    /// Parses a 5-field cron expression (`*`, `a`, `a-b`, `*/s`, `a-b/s`, `a/s`,
    /// lists with `,`, month and day names) or a shorthand: `every <n>m`,
    /// `every <n>h` (also `min`, `minutes`, `hours`…), `hourly`, `daily at <time>`,
    /// `weekdays at <time>`, `@hourly`, `@daily`, `@weekly`, `@monthly`; a time is
    /// `9am`, `9:30pm`, `21:15` or `09:30`.
    ///
    /// # Errors
    /// [`ScheduleError`] naming the part that is wrong, or saying the schedule
    /// never fires (`0 0 30 2 *`).
    pub fn parse(raw: &str) -> Result<Schedule, ScheduleError> {
        let text = raw.trim().to_ascii_lowercase();
        if text.is_empty() {
            return Err(ScheduleError::new("schedule is empty"));
        }
        let expr = shorthand(&text)?.unwrap_or(text);
        Schedule::cron(&expr)
    }

    fn cron(expr: &str) -> Result<Schedule, ScheduleError> {
        let fields: Vec<&str> = expr.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = fields[..] else {
            return Err(ScheduleError::new(format!(
                "expected 5 fields (minute hour day month weekday) or a shorthand such as \
                 `every 30m`, `daily at 9am`, `weekdays at 09:30`, found {} field(s)",
                fields.len()
            )));
        };
        let mut weekdays = parse_field(weekday, &WEEKDAY)?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & !(1 << 7);
        }
        let schedule = Schedule {
            expr: fields.join(" "),
            minutes: parse_field(minute, &MINUTE)?,
            hours: parse_field(hour, &HOUR)?,
            days: parse_field(day, &DAY)?,
            months: parse_field(month, &MONTH)?,
            weekdays,
            day_or: !day.starts_with('*') && !weekday.starts_with('*'),
        };
        // A day that no chosen month has (the 30th of February) never fires,
        // unless a weekday can fire instead.
        let some_day = (1..=12u32).filter(|m| schedule.months & (1 << m) != 0).any(|m| {
            let longest = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][m as usize - 1];
            (1..=longest).any(|d| schedule.days & (1 << d) != 0)
        });
        if !some_day && !schedule.day_or {
            return Err(ScheduleError::new(format!(
                "`{expr}` never fires: no chosen month has that day"
            )));
        }
        Ok(schedule)
    }

    /// The normalised cron expression.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The first firing strictly after `after`, in `tz`; `None` only if there is
    /// none within the next eight years.
    pub fn next_after<Z: TimeZone>(&self, after: &DateTime<Z>, tz: &Tz) -> Option<DateTime<Tz>> {
        let after = after.with_timezone(tz);
        let local = after.naive_local();
        // The next whole minute after `after`.
        let mut at = local.with_second(0)?.with_nanosecond(0)? + chrono::Duration::minutes(1);
        let horizon = local + chrono::Duration::days(366 * 8);
        while at <= horizon {
            if !self.has(self.months, at.month()) {
                let (y, m) =
                    if at.month() == 12 { (at.year() + 1, 1) } else { (at.year(), at.month() + 1) };
                at = NaiveDate::from_ymd_opt(y, m, 1)?.and_hms_opt(0, 0, 0)?;
                continue;
            }
            if !self.day_matches(at.date()) {
                at = at.date().checked_add_days(Days::new(1))?.and_hms_opt(0, 0, 0)?;
                continue;
            }
            if !self.has(self.hours, at.hour()) {
                at = at.with_minute(0)? + chrono::Duration::hours(1);
                continue;
            }
            if !self.has(self.minutes, at.minute()) {
                at += chrono::Duration::minutes(1);
                continue;
            }
            if let Some(instant) = resolve_local(tz, at).filter(|instant| *instant > after) {
                return Some(instant);
            }
            at += chrono::Duration::minutes(1);
        }
        None
    }

    fn has(&self, set: u64, value: u32) -> bool {
        set & (1 << value) != 0
    }

    fn day_matches(&self, date: NaiveDate) -> bool {
        let day = self.has(self.days, date.day());
        let weekday = self.has(self.weekdays, date.weekday().num_days_from_sunday());
        if self.day_or {
            day || weekday
        } else {
            day && weekday
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.expr)
    }
}

/// The instant a local wall time names: the earlier of a repeated time, and for
/// a skipped time the first valid minute after the gap.
fn resolve_local(tz: &Tz, at: NaiveDateTime) -> Option<DateTime<Tz>> {
    match tz.from_local_datetime(&at) {
        LocalResult::Single(instant) => Some(instant),
        LocalResult::Ambiguous(earlier, _) => Some(earlier),
        LocalResult::None => {
            let mut later = at;
            for _ in 0..(24 * 60) {
                later += chrono::Duration::minutes(1);
                match tz.from_local_datetime(&later) {
                    LocalResult::Single(instant) | LocalResult::Ambiguous(instant, _) => {
                        return Some(instant)
                    }
                    LocalResult::None => {}
                }
            }
            None
        }
    }
}

/// The cron expression a shorthand stands for; `None` when `text` is none.
fn shorthand(text: &str) -> Result<Option<String>, ScheduleError> {
    let fixed = match text {
        "@hourly" | "hourly" => Some("0 * * * *"),
        "@daily" | "@midnight" | "daily" => Some("0 0 * * *"),
        "@weekly" | "weekly" => Some("0 0 * * 0"),
        "@monthly" | "monthly" => Some("0 0 1 * *"),
        _ => None,
    };
    if let Some(expr) = fixed {
        return Ok(Some(expr.to_owned()));
    }
    if let Some(every) = text.strip_prefix("every ") {
        return every_expr(every.trim()).map(Some);
    }
    for (prefix, days) in [("daily at ", "*"), ("weekdays at ", "1-5"), ("weekends at ", "0,6")] {
        if let Some(time) = text.strip_prefix(prefix) {
            let (hour, minute) = parse_time(time.trim())?;
            return Ok(Some(format!("{minute} {hour} * * {days}")));
        }
    }
    if text.starts_with('@') {
        return Err(ScheduleError::new(format!(
            "unknown shorthand `{text}` (known: @hourly, @daily, @weekly, @monthly)"
        )));
    }
    Ok(None)
}

/// `30m`, `30 minutes`, `2h`, `1 hour`, `minute`, `hour`.
fn every_expr(every: &str) -> Result<String, ScheduleError> {
    let split = every.find(|c: char| !c.is_ascii_digit()).unwrap_or(every.len());
    let (digits, unit) = every.split_at(split);
    let bad = || {
        ScheduleError::new(format!(
            "`every {every}`: expected a number of minutes or hours, such as `every 30m` or `every 2h`"
        ))
    };
    let n: u32 = if digits.is_empty() { 1 } else { digits.parse().map_err(|_| bad())? };
    match unit.trim() {
        "m" | "min" | "mins" | "minute" | "minutes" => match n {
            1 => Ok("* * * * *".to_owned()),
            2..=59 => Ok(format!("*/{n} * * * *")),
            _ => Err(ScheduleError::new(format!(
                "`every {every}`: minutes must be 1 to 59 (use hours for longer)"
            ))),
        },
        "h" | "hr" | "hrs" | "hour" | "hours" => match n {
            1 => Ok("0 * * * *".to_owned()),
            2..=23 => Ok(format!("0 */{n} * * *")),
            _ => Err(ScheduleError::new(format!(
                "`every {every}`: hours must be 1 to 23 (use `daily at` for a day)"
            ))),
        },
        "d" | "day" => match n {
            1 => Ok("0 0 * * *".to_owned()),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// `9am`, `9 am`, `9:30pm`, `12am` (midnight), `21:15`, `09:30`.
fn parse_time(time: &str) -> Result<(u32, u32), ScheduleError> {
    let bad = || {
        ScheduleError::new(format!("`{time}` is not a time of day (such as 9am, 9:30pm, 21:15)"))
    };
    let (clock, meridiem) = if let Some(rest) = time.strip_suffix("am") {
        (rest.trim(), Some(false))
    } else if let Some(rest) = time.strip_suffix("pm") {
        (rest.trim(), Some(true))
    } else {
        (time, None)
    };
    let (hour, minute) = match clock.split_once(':') {
        Some((h, m)) if m.len() == 2 => (h, m),
        Some(_) => return Err(bad()),
        None if meridiem.is_some() => (clock, "0"),
        None => return Err(bad()),
    };
    let digits = |s: &str| !s.is_empty() && s.len() <= 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(hour) || !digits(minute) {
        return Err(bad());
    }
    let (hour, minute): (u32, u32) =
        (hour.parse().map_err(|_| bad())?, minute.parse().map_err(|_| bad())?);
    let hour = match meridiem {
        Some(pm) if (1..=12).contains(&hour) => hour % 12 + if pm { 12 } else { 0 },
        Some(_) => return Err(bad()),
        None if hour <= 23 => hour,
        None => return Err(bad()),
    };
    if minute > 59 {
        return Err(bad());
    }
    Ok((hour, minute))
}

/// One field as a bit set of its values.
fn parse_field(text: &str, field: &Field) -> Result<u64, ScheduleError> {
    let mut set = 0u64;
    for item in text.split(',') {
        set |= parse_item(item, field)
            .map_err(|why| ScheduleError::new(format!("{} field `{text}`: {why}", field.name)))?;
    }
    Ok(set)
}

fn parse_item(item: &str, field: &Field) -> Result<u64, String> {
    if item.is_empty() {
        return Err("empty list item".to_owned());
    }
    let (range, step) = match item.split_once('/') {
        Some((range, step)) => {
            let step: u32 = step
                .parse()
                .ok()
                .filter(|step| *step >= 1)
                .ok_or_else(|| format!("step `{step}` must be a whole number of at least 1"))?;
            (range, Some(step))
        }
        None => (item, None),
    };
    let (low, high) = if range == "*" {
        (field.min, field.max)
    } else if let Some((a, b)) = range.split_once('-') {
        let (low, high) = (value(a, field)?, value(b, field)?);
        if low > high {
            return Err(format!("range `{range}` goes backwards"));
        }
        (low, high)
    } else {
        let low = value(range, field)?;
        // `5/15`: from 5 to the end in steps of 15.
        (low, if step.is_some() { field.max } else { low })
    };
    let mut set = 0u64;
    let mut v = low;
    while v <= high {
        set |= 1 << v;
        v += step.unwrap_or(1);
    }
    Ok(set)
}

fn value(text: &str, field: &Field) -> Result<u32, String> {
    if let Some(at) = field.names.iter().position(|name| *name == text) {
        return Ok(at as u32 + if field.min == 1 { 1 } else { 0 });
    }
    match text.parse::<u32>() {
        Ok(v) if (field.min..=field.max).contains(&v) => Ok(v),
        Ok(v) => Err(format!("{v} is out of range {}-{}", field.min, field.max)),
        Err(_) => Err(format!("`{text}` is not a number{}", names_hint(field))),
    }
}

fn names_hint(field: &Field) -> String {
    match field.names.first() {
        Some(first) => format!(" or a name such as `{first}`"),
        None => String::new(),
    }
}

/// A time zone by its IANA name (`Europe/Berlin`, `UTC`).
///
/// # Errors
/// A message naming the zone when it is unknown.
pub fn parse_timezone(name: &str) -> Result<Tz, ScheduleError> {
    name.trim().parse::<Tz>().map_err(|_| {
        ScheduleError::new(format!(
            "unknown time zone `{name}` (use an IANA name such as Europe/Berlin or UTC)"
        ))
    })
}

#[cfg(test)]
mod tests;
