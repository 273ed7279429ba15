//! Calendar periods: the edges of a fixed window that counts per day, ISO
//! week, month or year of the calendar rather than per fixed length.
//!
//! A plan sold "per month" resets on the first of the month, not every
//! 30 days: January's window is 31 days long, February's 28 or 29. A
//! [`Calendar`] says which periods, in UTC or at a fixed offset from it;
//! [`Policy::calendar`](crate::Policy::calendar) makes it a fixed window.
//!
//! Times are microseconds of Unix time (the Redis server's `TIME`, a
//! [`MonotonicClock`](crate::clock::MonotonicClock), which is anchored at
//! the wall clock, or a [`ManualClock`](crate::clock::ManualClock) set to a
//! Unix time). The calendar is the proleptic Gregorian one, in integer
//! arithmetic only (days from a civil date and back, as in Howard Hinnant's
//! `chrono`-compatible algorithms), and Unix time has no leap seconds, so a
//! day is always 86,400 s. The Redis scripts compute the same edges in Lua
//! (`calendar.lua`), exactly for every time below 2^53 µs less a day (the
//! year 2255).

use crate::PolicyError;

const DAY_MICROS: i128 = 86_400_000_000;

/// The largest offset from UTC accepted, in seconds, either way: less than
/// a day.
pub const MAX_UTC_OFFSET_SECONDS: i32 = 86_399;

/// A unit of the calendar a [`Calendar`] counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Period {
    /// A day, from midnight to midnight (always 24 hours: the offset from
    /// UTC is fixed, no daylight saving time applies).
    Day,
    /// An ISO 8601 week, from Monday 00:00 to the next Monday 00:00.
    Week,
    /// A month of the calendar, 28 to 31 days, from the 1st at 00:00.
    Month,
    /// A year of the calendar, 365 or 366 days, from January 1st at 00:00.
    Year,
}

impl Period {
    /// Every period, shortest first.
    pub const ALL: [Period; 4] = [Period::Day, Period::Week, Period::Month, Period::Year];

    /// The period's name: `day`, `week`, `month` or `year`.
    pub const fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
            Period::Year => "year",
        }
    }

    /// The same period at `seconds_east` seconds east of UTC (negative: west),
    /// checked when the policy is built (less than 24 hours either way).
    ///
    /// ```
    /// use ratelimit_core::{Period, Policy};
    ///
    /// // Days from midnight in Paris in winter (UTC+01:00).
    /// let daily = Policy::calendar(1_000, Period::Day.utc_offset(3_600))?;
    /// assert_eq!(daily.name(), "fixed-window-1000-per-day-utc-east-1h");
    /// # Ok::<(), ratelimit_core::PolicyError>(())
    /// ```
    pub const fn utc_offset(self, seconds_east: i32) -> Calendar {
        Calendar {
            period: self,
            offset_seconds: seconds_east,
        }
    }

    /// The longest a period of this kind lasts, in microseconds: a day, a
    /// week, 31 days, 366 days.
    pub const fn longest_micros(self) -> u64 {
        const DAY: u64 = 86_400_000_000;
        match self {
            Period::Day => DAY,
            Period::Week => 7 * DAY,
            Period::Month => 31 * DAY,
            Period::Year => 366 * DAY,
        }
    }

    /// The period's number in the scripts' parameter (see [`Calendar::code`]).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    const fn number(self) -> u64 {
        match self {
            Period::Day => 1,
            Period::Week => 2,
            Period::Month => 3,
            Period::Year => 4,
        }
    }
}

/// A name that is not one of [`Period`]'s; its message lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPeriod(String);

super::named_kinds!(Period, UnknownPeriod, "calendar period");

/// Calendar periods at a fixed offset from UTC: what
/// [`Policy::calendar`](crate::Policy::calendar) counts in.
///
/// Made from a [`Period`] (UTC) or with [`Period::utc_offset`]; the offset is
/// checked when the policy is built.
///
/// ```
/// use ratelimit_core::algorithm::Calendar;
/// use ratelimit_core::Period;
///
/// const DAY: u64 = 86_400_000_000;
/// // 2024-02-10 12:00 UTC, in microseconds of Unix time.
/// let now = 19_763 * DAY + DAY / 2;
/// let (start, end) = Calendar::from(Period::Month).bounds(now);
/// assert_eq!(start, 19_754 * DAY); // 2024-02-01
/// assert_eq!(end, 19_783 * DAY); // 2024-03-01: 29 days, a leap year
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Calendar {
    period: Period,
    offset_seconds: i32,
}

impl From<Period> for Calendar {
    fn from(period: Period) -> Self {
        Calendar {
            period,
            offset_seconds: 0,
        }
    }
}

impl Calendar {
    /// The same periods at `seconds_east` seconds east of UTC (negative:
    /// west), checked when the policy is built.
    #[must_use]
    pub const fn utc_offset(mut self, seconds_east: i32) -> Self {
        self.offset_seconds = seconds_east;
        self
    }

    /// The unit of the calendar.
    pub const fn period(&self) -> Period {
        self.period
    }

    /// The offset from UTC, in seconds east (negative: west).
    pub const fn utc_offset_seconds(&self) -> i32 {
        self.offset_seconds
    }

    /// The calendar, its offset checked: less than 24 hours either way.
    pub(crate) fn validated(self) -> Result<Self, PolicyError> {
        if self.offset_seconds.unsigned_abs() > MAX_UTC_OFFSET_SECONDS.unsigned_abs() {
            return Err(PolicyError::UtcOffsetOutOfRange {
                seconds: self.offset_seconds,
            });
        }
        Ok(self)
    }

    /// The period that holds `now` (µs of Unix time): its first microsecond
    /// and the first microsecond after it, `start <= now < end`. A period
    /// that began before the Unix epoch (at a positive offset, the first
    /// hours of 1970) starts at 0.
    pub fn bounds(&self, now: u64) -> (u64, u64) {
        let offset = i128::from(self.offset_seconds) * 1_000_000;
        let day = (i128::from(now) + offset).div_euclid(DAY_MICROS);
        let (first, next) = match self.period {
            Period::Day => (day, day + 1),
            // 1970-01-01 was a Thursday: Monday is 3 days before.
            Period::Week => {
                let monday = day - (day + 3).rem_euclid(7);
                (monday, monday + 7)
            }
            Period::Month => {
                let (year, month, _) = civil_from_days(day);
                let next = if month == 12 {
                    days_from_civil(year + 1, 1, 1)
                } else {
                    days_from_civil(year, month + 1, 1)
                };
                (days_from_civil(year, month, 1), next)
            }
            Period::Year => {
                let (year, _, _) = civil_from_days(day);
                (days_from_civil(year, 1, 1), days_from_civil(year + 1, 1, 1))
            }
        };
        let micros =
            |days: i128| u64::try_from((days * DAY_MICROS - offset).max(0)).unwrap_or(u64::MAX);
        (micros(first), micros(next))
    }

    /// The fixed window's second script parameter for this calendar: above
    /// [`CALENDAR_CODE_BASE`] (past every window length, at most
    /// [`MAX_HORIZON_MICROS`](super::MAX_HORIZON_MICROS)), the period's
    /// number (1 day, 2 week, 3 month, 4 year) times 10^6, plus 100,000 plus
    /// the offset in seconds. Exact in a Lua double.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn code(&self) -> u64 {
        let offset = u64::try_from(100_000 + i64::from(self.offset_seconds)).unwrap_or(0);
        CALENDAR_CODE_BASE + self.period.number() * 1_000_000 + offset
    }
}

/// Where the calendar codes of the scripts' fixed-window parameter begin
/// (2^51; see `calendar.lua`).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const CALENDAR_CODE_BASE: u64 = 1 << 51;

/// The days since 1970-01-01 of `year`-`month`-`day` (proleptic Gregorian).
fn days_from_civil(year: i128, month: u32, day: u32) -> i128 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    // Months counted from March, so the leap day is the era's last.
    let march_month = (i128::from(month) + 9) % 12;
    let day_of_year = (153 * march_month + 2) / 5 + i128::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date (year, month, day) `days` after 1970-01-01.
fn civil_from_days(days: i128) -> (i128, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let march_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * march_month + 2) / 5 + 1;
    let month = if march_month < 10 {
        march_month + 3
    } else {
        march_month - 9
    };
    let year = year_of_era + era * 400 + i128::from(month <= 2);
    // Both are in range by construction (1..=31, 1..=12).
    let small = |n: i128| u32::try_from(n).unwrap_or(1);
    (year, small(month), small(day))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400_000_000;
    const HOUR: u64 = 3_600_000_000;

    #[test]
    fn periods_parse_back_and_an_unknown_name_lists_them() {
        for period in Period::ALL {
            assert_eq!(period.name().parse::<Period>(), Ok(period));
            assert_eq!(period.to_string(), period.name());
        }
        assert_eq!(
            "fortnight".parse::<Period>().unwrap_err().to_string(),
            "unknown calendar period \"fortnight\" (one of: day, week, month, year)"
        );
    }

    /// The Unix time (µs) of `year`-`month`-`day` at 00:00 UTC.
    fn date(year: i128, month: u32, day: u32) -> u64 {
        u64::try_from(days_from_civil(year, month, day)).expect("after 1970") * DAY
    }

    #[test]
    fn civil_dates_round_trip_over_many_centuries() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        let mut previous = civil_from_days(-800_000);
        for days in -799_999..800_000 {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
            // The next day of the previous date.
            let (py, pm, pd) = previous;
            let leap = (py % 4 == 0 && py % 100 != 0) || py % 400 == 0;
            let february = if leap { 29 } else { 28 };
            let month_days = [31, february, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
            let expected = if pd < month_days[pm as usize - 1] {
                (py, pm, pd + 1)
            } else if pm < 12 {
                (py, pm + 1, 1)
            } else {
                (py + 1, 1, 1)
            };
            assert_eq!((y, m, d), expected, "day {days}");
            previous = (y, m, d);
        }
    }

    #[test]
    fn months_are_28_to_31_days_and_leap_years_count() {
        let month = Calendar::from(Period::Month);
        let cases = [
            (
                date(2024, 1, 31) + DAY - 1,
                date(2024, 1, 1),
                date(2024, 2, 1),
            ),
            (date(2024, 2, 1), date(2024, 2, 1), date(2024, 3, 1)),
            (date(2024, 2, 29), date(2024, 2, 1), date(2024, 3, 1)),
            (date(2023, 2, 28), date(2023, 2, 1), date(2023, 3, 1)),
            (date(2100, 2, 28), date(2100, 2, 1), date(2100, 3, 1)),
            (date(2000, 2, 29), date(2000, 2, 1), date(2000, 3, 1)),
            (date(2024, 12, 31), date(2024, 12, 1), date(2025, 1, 1)),
            (date(2025, 1, 1), date(2025, 1, 1), date(2025, 2, 1)),
        ];
        for (now, start, end) in cases {
            assert_eq!(month.bounds(now), (start, end), "at {now}");
        }
        assert_eq!(date(2024, 3, 1) - date(2024, 2, 1), 29 * DAY);
        assert_eq!(date(2023, 3, 1) - date(2023, 2, 1), 28 * DAY);
        let year = Calendar::from(Period::Year);
        assert_eq!(
            year.bounds(date(2024, 7, 1)),
            (date(2024, 1, 1), date(2025, 1, 1))
        );
        assert_eq!(date(2025, 1, 1) - date(2024, 1, 1), 366 * DAY);
        assert_eq!(year.bounds(date(2025, 1, 1) - 1).1, date(2025, 1, 1));
    }

    #[test]
    fn weeks_start_on_monday_and_offsets_move_every_edge() {
        let week = Calendar::from(Period::Week);
        // 2024-01-01 was a Monday; 1970-01-01 a Thursday.
        assert_eq!(
            week.bounds(date(2024, 1, 7)),
            (date(2024, 1, 1), date(2024, 1, 8))
        );
        assert_eq!(
            week.bounds(date(2024, 1, 8)),
            (date(2024, 1, 8), date(2024, 1, 15))
        );
        assert_eq!(week.bounds(0), (0, 4 * DAY));
        // UTC+02:00: the day starts at 22:00 UTC the day before.
        let day = Period::Day.utc_offset(2 * 3600);
        let start = date(2024, 3, 1) - 2 * HOUR;
        assert_eq!(day.bounds(start), (start, start + DAY));
        assert_eq!(day.bounds(start - 1), (start - DAY, start));
        // UTC-05:00: the month ends at 05:00 UTC on the 1st.
        let month = Period::Month.utc_offset(-5 * 3600);
        assert_eq!(
            month.bounds(date(2024, 3, 1) + 4 * HOUR),
            (date(2024, 2, 1) + 5 * HOUR, date(2024, 3, 1) + 5 * HOUR)
        );
        // A period that began before the epoch starts at 0.
        assert_eq!(day.bounds(0), (0, DAY - 2 * HOUR));
        assert_eq!(Period::Day.utc_offset(-3600).bounds(0), (0, HOUR));
    }

    #[test]
    fn offsets_of_a_day_or_more_are_refused() {
        for ok in [0, 1, -1, MAX_UTC_OFFSET_SECONDS, -MAX_UTC_OFFSET_SECONDS] {
            assert!(Period::Day.utc_offset(ok).validated().is_ok(), "{ok}");
        }
        for bad in [86_400, -86_400, i32::MAX, i32::MIN] {
            assert_eq!(
                Period::Day.utc_offset(bad).validated(),
                Err(PolicyError::UtcOffsetOutOfRange { seconds: bad })
            );
        }
    }

    #[test]
    fn codes_are_distinct_exact_and_past_every_window() {
        let mut codes = std::collections::HashSet::new();
        for period in Period::ALL {
            for offset in [-MAX_UTC_OFFSET_SECONDS, -1, 0, 1, MAX_UTC_OFFSET_SECONDS] {
                let code = period.utc_offset(offset).code();
                assert!(code > super::super::MAX_HORIZON_MICROS && code < super::super::MAX_EXACT);
                assert!(codes.insert(code), "{period} {offset}");
            }
        }
    }

    #[test]
    fn periods_parse_and_print() {
        for period in Period::ALL {
            assert_eq!(period.name().parse::<Period>(), Ok(period));
            assert!(period.longest_micros() >= DAY);
        }
        let err = "Month".parse::<Period>().unwrap_err().to_string();
        assert!(err.contains("\"Month\"") && err.contains("week"), "{err}");
    }

    #[test]
    fn every_time_is_in_its_period_and_periods_tile() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for period in Period::ALL {
            for offset in [0, 3600 * 14, -3600 * 12, 19_800, -1] {
                let calendar = period.utc_offset(offset);
                for _ in 0..2_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let now = x % (1 << 53);
                    let (start, end) = calendar.bounds(now);
                    assert!(start <= now && now < end, "{calendar:?} {now}");
                    assert!(end - start <= period.longest_micros());
                    assert_eq!(calendar.bounds(end).0, end);
                    if start > 0 {
                        assert_eq!(calendar.bounds(start - 1).1, start);
                    }
                }
            }
        }
    }
}
