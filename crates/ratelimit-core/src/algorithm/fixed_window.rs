//! Fixed window: at most `limit` per window aligned on the clock's origin.
//!
//! One counter per key. Cheap and easy to explain, but a client can spend a
//! whole window's limit just before a boundary and another just after it, so up
//! to twice the limit can pass across a boundary.

use super::{check_limit, penalized, window_micros};
use crate::{Decision, PolicyError};
use std::time::Duration;

/// Parameters of a fixed window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    limit: u64,
    window: u64,
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
        Ok(FixedWindow {
            limit: check_limit(limit, "limit")?,
            window: window_micros(window, "window")?,
        })
    }

    /// The limit per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window in microseconds.
    pub fn window_micros(&self) -> u64 {
        self.window
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
    fn current(&self, state: &FixedWindowState, now: u64) -> (u64, u64) {
        let aligned = now - now % self.window;
        let start = state.window_last - state.window_last % self.window;
        // A count from a later window (a clock that stepped back) is kept: the
        // conservative choice.
        if state.count > 0 && start >= aligned {
            (start, state.count)
        } else {
            (aligned, 0)
        }
    }

    /// Decides one request of `cost` at `now` (µs).
    ///
    /// Only an admitted request of a positive cost writes the state, as the
    /// Redis script does: a state written under other numbers stays as it
    /// was until then, so both stores read it alike after a later change.
    pub(crate) fn decide(&self, state: &mut FixedWindowState, now: u64, cost: u64) -> Decision {
        let (start, count) = self.current(state, now);
        let until_end = start + self.window - now;
        if count + cost <= self.limit {
            let count = count + cost;
            if cost > 0 {
                *state = FixedWindowState {
                    window_last: start + (self.window - 1),
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
        let (start, count) = self.current(state, now);
        *state = FixedWindowState {
            window_last: start + (self.window - 1),
            count: penalized(count, amount, 2 * self.limit),
        };
        self.decide(state, now, 0)
    }

    /// Gives back `amount` of the current window's count (never below zero,
    /// so never beyond a full budget); returns what a peek then reports.
    pub(crate) fn reward(&self, state: &mut FixedWindowState, now: u64, amount: u64) -> Decision {
        let (start, count) = self.current(state, now);
        *state = FixedWindowState {
            window_last: start + (self.window - 1),
            count: count.saturating_sub(amount),
        };
        self.decide(state, now, 0)
    }
}
