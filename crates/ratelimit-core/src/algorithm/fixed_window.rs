//! Fixed window: at most `limit` per window aligned on the clock's origin,
//! or per period of the calendar (see [`calendar`](super::calendar)).
//!
//! One counter per key. Cheap and easy to explain, but a client can spend a
//! whole window's limit just before a boundary and another just after it, so up
//! to twice the limit can pass across a boundary.

use super::calendar::Calendar;
use super::{check_limit, limit_per_window, penalized};
use crate::{Decision, PolicyError};
use std::time::Duration;

/// Parameters of a fixed window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    limit: u64,
    /// The window in µs; for calendar periods, the longest period.
    window: u64,
    /// Calendar periods instead of windows aligned on the clock's origin.
    calendar: Option<Calendar>,
}

/// State of a fixed window for one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FixedWindowState {
    /// A time (µs) in the window the count belongs to: its last microsecond
    /// as the stores write it. Under the window length that wrote it, any
    /// time in the window reads alike (a state holding the window's first
    /// microsecond, as multi-region decisions pass it, too); under a shorter
    /// one, the count lasts until the window that holds this time ends, so
    /// never less than the window that wrote it.
    pub(crate) window_last: u64,
    /// Cost admitted in that window.
    pub(crate) count: u64,
}

impl FixedWindow {
    /// At most `limit` per `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        let (limit, window) = limit_per_window(limit, window)?;
        Ok(FixedWindow {
            limit,
            window,
            calendar: None,
        })
    }

    /// At most `limit` per period of `calendar`: windows whose edges are the
    /// calendar's (midnight, Monday, the 1st of the month, January 1st) at
    /// the calendar's offset from UTC, which must be less than 24 hours.
    pub fn calendar(limit: u64, calendar: Calendar) -> Result<Self, PolicyError> {
        let calendar = calendar.validated()?;
        Ok(FixedWindow {
            limit: check_limit(limit, "limit")?,
            window: calendar.period().longest_micros(),
            calendar: Some(calendar),
        })
    }

    /// The same window with another limit.
    pub(crate) fn with_limit(self, limit: u64) -> Result<Self, PolicyError> {
        Ok(FixedWindow {
            limit: check_limit(limit, "limit")?,
            ..self
        })
    }

    /// The limit per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window in microseconds; for calendar periods, the longest of
    /// them (31 days for months).
    pub fn window_micros(&self) -> u64 {
        self.window
    }

    /// The calendar periods counted in, when this window follows the
    /// calendar ([`Policy::calendar`](crate::Policy::calendar)).
    pub fn calendar_periods(&self) -> Option<Calendar> {
        self.calendar
    }

    /// The second parameter of the Redis scripts: the window in µs, or the
    /// calendar's code (above every window length; see `calendar.lua`).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn script_window(&self) -> u64 {
        self.calendar.map_or(self.window, |c| c.code())
    }

    /// The window that holds `t` (µs): its first microsecond and the first
    /// one after it.
    pub fn bounds(&self, t: u64) -> (u64, u64) {
        match &self.calendar {
            Some(calendar) => calendar.bounds(t),
            None => {
                let start = t - t % self.window;
                (start, start.saturating_add(self.window))
            }
        }
    }

    /// The window and count that apply at `now`.
    ///
    /// A state written under another window length (the same policy name
    /// with other numbers) ends where no window of this length ends: its
    /// count belongs to the window of this length that holds its last
    /// microsecond, so it counts until that window ends. Under a shorter
    /// window, a count written in a longer one thus counts, in every window
    /// of this length, until the longer window would have ended, or later:
    /// never less than under the numbers that admitted it. (A state lives as
    /// long as the decision that wrote it said, so on the stores a count
    /// lasts at most until the window that wrote it ends.)
    ///
    /// Returns the window's start and end (µs) and the count.
    fn current(&self, state: &FixedWindowState, now: u64) -> (u64, u64, u64) {
        let (aligned, end) = self.bounds(now);
        if state.count == 0 {
            return (aligned, end, 0);
        }
        let (start, state_end) = self.bounds(state.window_last);
        // A count from a later window (a clock that stepped back) is kept: the
        // conservative choice.
        if start >= aligned {
            (start, state_end, state.count)
        } else {
            (aligned, end, 0)
        }
    }

    /// Decides one request of `cost` at `now` (µs).
    ///
    /// Only an admitted request of a positive cost writes the state, as the
    /// Redis script does: a state written under other numbers stays as it
    /// was until then, so both stores read it alike after a later change.
    pub(crate) fn decide(&self, state: &mut FixedWindowState, now: u64, cost: u64) -> Decision {
        let (_, end, count) = self.current(state, now);
        let until_end = end - now;
        if count + cost <= self.limit {
            let count = count + cost;
            if cost > 0 {
                *state = FixedWindowState {
                    window_last: end - 1,
                    count,
                };
            }
            let reset = if count > 0 { until_end } else { 0 };
            Decision::allow(self.limit, self.limit - count, reset)
        } else {
            // A penalty, or a limit since lowered, may have pushed the count
            // past the limit.
            let remaining = self.limit.saturating_sub(count);
            Decision::deny(self.limit, remaining, until_end, until_end)
        }
    }

    /// Consumes `amount` more in the current window even past the limit (an
    /// admin penalty), counting at most `2 × limit`; returns what a peek
    /// then reports.
    ///
    /// The count is per window: the key is denied at most until the current
    /// window ends, and a penalty never carries over into the next window.
    pub(crate) fn penalize(&self, state: &mut FixedWindowState, now: u64, amount: u64) -> Decision {
        let (_, end, count) = self.current(state, now);
        *state = FixedWindowState {
            window_last: end - 1,
            count: penalized(count, amount, 2 * self.limit),
        };
        self.decide(state, now, 0)
    }

    /// Gives back `amount` of the current window's count (never below zero,
    /// so never beyond a full budget); returns what a peek then reports.
    pub(crate) fn reward(&self, state: &mut FixedWindowState, now: u64, amount: u64) -> Decision {
        let (_, end, count) = self.current(state, now);
        *state = FixedWindowState {
            window_last: end - 1,
            count: count.saturating_sub(amount),
        };
        self.decide(state, now, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Period;

    const DAY: u64 = 86_400_000_000;
    /// 2024-01-31 00:00 UTC, in µs of Unix time.
    const JAN_31_2024: u64 = 19_753 * DAY;

    #[test]
    fn a_month_counts_until_its_real_end_and_starts_again_at_the_first() {
        let monthly = FixedWindow::calendar(2, Period::Month.into()).expect("valid");
        let mut state = FixedWindowState::default();
        let noon = JAN_31_2024 + DAY / 2;
        let d = monthly.decide(&mut state, noon, 2);
        assert!(d.is_allowed());
        assert_eq!(d.reset_after_micros(), DAY / 2);
        assert_eq!(state.window_last, JAN_31_2024 + DAY - 1);
        let d = monthly.decide(&mut state, JAN_31_2024 + DAY - 1, 1);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after_micros(), 1);
        // February 1st: a new window of 29 days (2024 is a leap year).
        let d = monthly.decide(&mut state, JAN_31_2024 + DAY, 1);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 1);
        assert_eq!(d.reset_after_micros(), 29 * DAY);
    }

    #[test]
    fn a_count_written_under_a_plain_window_is_read_under_the_calendar_and_back() {
        let daily = FixedWindow::calendar(5, Period::Day.into()).expect("valid");
        let hourly = FixedWindow::new(5, Duration::from_secs(3600)).expect("valid");
        // Written by the hourly window that ends at 01:00: under the day it
        // counts until midnight, never less than under the hour.
        let mut state = FixedWindowState::default();
        hourly.decide(&mut state, JAN_31_2024 + 1, 4);
        let d = daily.decide(&mut state.clone(), JAN_31_2024 + 2 * DAY / 3, 0);
        assert_eq!((d.remaining(), d.reset_after_micros()), (1, DAY / 3));
        // Written by the day: under the hour it counts in the last hour of
        // the day, so until midnight too.
        let mut state = FixedWindowState::default();
        daily.decide(&mut state, JAN_31_2024 + 1, 4);
        let d = hourly.decide(&mut state.clone(), JAN_31_2024 + DAY / 2, 0);
        assert_eq!(d.remaining(), 1);
        assert_eq!(d.reset_after_micros(), DAY / 2);
    }

    #[test]
    fn penalties_and_rewards_stay_in_the_calendar_period() {
        let weekly = FixedWindow::calendar(3, Period::Week.into()).expect("valid");
        let mut state = FixedWindowState::default();
        // 2024-01-31 was a Wednesday: the week ends on Monday 2024-02-05.
        let d = weekly.penalize(&mut state, JAN_31_2024, 10);
        assert!(!d.is_allowed());
        assert_eq!(state.count, 6);
        assert_eq!(d.retry_after_micros(), 5 * DAY);
        let d = weekly.reward(&mut state, JAN_31_2024 + DAY, 4);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 1);
        assert!(
            weekly
                .decide(&mut state, JAN_31_2024 + 5 * DAY, 3)
                .is_allowed()
        );
    }

    #[test]
    fn a_calendar_is_another_window_than_a_plain_one_of_its_length() {
        let daily = FixedWindow::calendar(5, Period::Day.into()).expect("valid");
        let day = FixedWindow::new(5, Duration::from_secs(86_400)).expect("valid");
        assert_ne!(daily, day);
        assert_eq!(daily.window_micros(), day.window_micros());
        assert_ne!(daily.script_window(), day.script_window());
        assert_eq!(
            daily.with_limit(2).expect("valid").calendar_periods(),
            daily.calendar_periods()
        );
        assert!(FixedWindow::calendar(0, Period::Day.into()).is_err());
    }
}
