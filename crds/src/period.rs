//! Calendar periods of budgets: a day, an ISO week (Monday first) or a
//! month, in a Gateway's time zone (IANA, `Gateway.spec.budgets.timeZone`;
//! the database is bundled, so pods without `/usr/share/zoneinfo` know it).
//! A period starts at local midnight of its first day — across daylight
//! saving changes a day may be 23 or 25 hours long — and its key names it:
//! `2026-11-26`, `2026-W48`, `2026-11`.

use jiff::Timestamp;
use jiff::civil::Date;
use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize};

/// How long a budget counts before it starts over.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, schemars::JsonSchema,
)]
pub enum Period {
    /// A calendar day.
    Day,
    /// An ISO week, Monday to Sunday.
    Week,
    /// A calendar month.
    #[default]
    Month,
}

/// One period of a budget: when it started, when the next starts, and its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Its first instant.
    pub start: Timestamp,
    /// The next period's first instant.
    pub end: Timestamp,
    /// `2026-11-26`, `2026-W48` or `2026-11`.
    pub key: String,
}

/// Why a time zone cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IANA time zone (such as UTC or Europe/Berlin)")]
pub struct UnknownTimeZone(pub String);

/// The time zone named `name` (`UTC`, `Europe/Berlin`).
///
/// # Errors
/// [`UnknownTimeZone`] when the bundled database does not know it.
pub fn time_zone(name: &str) -> Result<TimeZone, UnknownTimeZone> {
    TimeZone::get(name).map_err(|_| UnknownTimeZone(name.to_owned()))
}

impl Period {
    /// The period of this kind that holds `at` in `zone`.
    pub fn window(self, at: Timestamp, zone: &TimeZone) -> Window {
        let date = at.to_zoned(zone.clone()).date();
        let (first, next) = match self {
            Period::Day => (date, date.tomorrow().unwrap_or(date)),
            Period::Week => {
                let monday = date
                    .checked_sub(jiff::Span::new().days(i64::from(date.weekday().to_monday_zero_offset())))
                    .unwrap_or(date);
                (monday, monday.checked_add(jiff::Span::new().days(7)).unwrap_or(monday))
            }
            Period::Month => {
                let first = date.first_of_month();
                (first, first.checked_add(jiff::Span::new().months(1)).unwrap_or(first))
            }
        };
        let key = match self {
            Period::Day => date.to_string(),
            Period::Week => {
                let week = date.iso_week_date();
                format!("{:04}-W{:02}", week.year(), week.week())
            }
            Period::Month => format!("{:04}-{:02}", date.year(), date.month()),
        };
        Window { start: midnight(first, zone), end: midnight(next, zone), key }
    }
}

/// The first instant of `date` in `zone` (midnight, or the first instant
/// after it when a daylight saving change skips midnight).
fn midnight(date: Date, zone: &TimeZone) -> Timestamp {
    date.to_zoned(zone.clone()).map(|zoned| zoned.timestamp()).unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn window(period: Period, instant: &str, zone: &str) -> (String, String, String) {
        let window = period.window(at(instant), &time_zone(zone).unwrap());
        (window.key, window.start.to_string(), window.end.to_string())
    }

    #[test]
    fn periods_start_at_local_midnight() {
        let cases = [
            // (period, instant, zone) → (key, start, end)
            (
                Period::Day,
                "2026-11-26T10:00:00Z",
                "UTC",
                ("2026-11-26", "2026-11-26T00:00:00Z", "2026-11-27T00:00:00Z"),
            ),
            (Period::Month, "2026-11-30T23:59:59Z", "UTC", ("2026-11", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z")),
            (Period::Month, "2026-12-31T23:00:00Z", "UTC", ("2026-12", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z")),
            // Still November in UTC, already December in Berlin.
            (
                Period::Month,
                "2026-11-30T23:30:00Z",
                "Europe/Berlin",
                ("2026-12", "2026-11-30T23:00:00Z", "2026-12-31T23:00:00Z"),
            ),
            // A leap day, and the month it ends.
            (
                Period::Day,
                "2028-02-29T12:00:00Z",
                "UTC",
                ("2028-02-29", "2028-02-29T00:00:00Z", "2028-03-01T00:00:00Z"),
            ),
            (Period::Month, "2028-02-29T12:00:00Z", "UTC", ("2028-02", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z")),
            // ISO weeks: Monday first; the first week of 2027 starts in 2027-01-04,
            // 2026-12-31 (a Thursday) is in 2026-W53.
            (Period::Week, "2026-11-26T10:00:00Z", "UTC", ("2026-W48", "2026-11-23T00:00:00Z", "2026-11-30T00:00:00Z")),
            (Period::Week, "2026-12-31T10:00:00Z", "UTC", ("2026-W53", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z")),
            (Period::Week, "2027-01-03T10:00:00Z", "UTC", ("2026-W53", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z")),
            // Daylight saving in New York: the day clocks spring forward has
            // 23 hours, the day they fall back 25.
            (
                Period::Day,
                "2026-03-08T12:00:00Z",
                "America/New_York",
                ("2026-03-08", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"),
            ),
            (
                Period::Day,
                "2026-11-01T12:00:00Z",
                "America/New_York",
                ("2026-11-01", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"),
            ),
            // Where midnight itself is skipped (Santiago springs forward at
            // 00:00 to 01:00), the day starts at 01:00.
            (
                Period::Day,
                "2026-09-06T12:00:00Z",
                "America/Santiago",
                ("2026-09-06", "2026-09-06T04:00:00Z", "2026-09-07T03:00:00Z"),
            ),
        ];
        for (period, instant, zone, (key, start, end)) in cases {
            assert_eq!(
                window(period, instant, zone),
                (key.to_owned(), start.to_owned(), end.to_owned()),
                "{period:?} {instant} {zone}"
            );
        }
    }

    #[test]
    fn a_period_holds_its_own_instants_and_the_next_starts_where_it_ends() {
        let zone = time_zone("Europe/Berlin").unwrap();
        for period in [Period::Day, Period::Week, Period::Month] {
            let mut instant = at("2026-01-01T00:00:00Z");
            for _ in 0..60 {
                let window = period.window(instant, &zone);
                assert!(window.start <= instant && instant < window.end, "{period:?} {instant} {window:?}");
                let next = period.window(window.end, &zone);
                assert_eq!(next.start, window.end, "{period:?}: no gap, no overlap");
                assert_ne!(next.key, window.key);
                instant = window.end.checked_add(jiff::SignedDuration::from_hours(7)).unwrap();
            }
        }
    }

    #[test]
    fn unknown_zones_are_refused() {
        assert!(time_zone("UTC").is_ok() && time_zone("Asia/Kolkata").is_ok());
        assert_eq!(time_zone("Mars/Olympus"), Err(UnknownTimeZone("Mars/Olympus".into())));
    }
}
