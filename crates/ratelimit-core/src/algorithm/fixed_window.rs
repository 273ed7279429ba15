//! Fixed window: at most `limit` per window aligned on the clock's origin.
//!
//! One counter per key. Cheap and easy to explain, but a client can spend a
//! whole window's limit just before a boundary and another just after it, so up
//! to twice the limit can pass across a boundary.

use super::{check_limit, window_micros};
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
pub struct FixedWindowState {
    /// Start of the window the count belongs to, in µs.
    pub window_start: u64,
    /// Cost admitted in that window.
    pub count: u64,
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

    /// Decides one request of `cost` at `now` (µs).
    pub fn decide(&self, state: &mut FixedWindowState, now: u64, cost: u64) -> Decision {
        let aligned = now - now % self.window;
        // A count from a later window (a clock that stepped back) is kept: the
        // conservative choice.
        let (start, count) = if state.count > 0 && state.window_start >= aligned {
            (state.window_start, state.count)
        } else {
            (aligned, 0)
        };
        let until_end = start + self.window - now;
        if count + cost <= self.limit {
            let count = count + cost;
            *state = FixedWindowState {
                window_start: start,
                count,
            };
            let reset = if count > 0 { until_end } else { 0 };
            Decision::allow(self.limit, self.limit - count, reset)
        } else {
            *state = FixedWindowState {
                window_start: start,
                count,
            };
            Decision::deny(self.limit, self.limit - count, until_end, until_end)
        }
    }
}
