//! Sliding window counter: the previous window's count, weighted by how much of
//! it still overlaps the sliding window, plus the current window's count.
//!
//! Two counters per key, smooth across boundaries, approximate: it assumes the
//! previous window's requests were spread evenly. It never admits more than
//! `limit` within one aligned window.

use std::time::Duration;

use super::{MAX_EXACT, check_limit, window_micros};
use crate::{Decision, PolicyError};

/// Parameters of a sliding window counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingWindowCounter {
    limit: u64,
    window: u64,
}

/// State of a sliding window counter for one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlidingWindowCounterState {
    /// Start of the current window, in µs.
    pub window_start: u64,
    /// Cost admitted in the window before it.
    pub previous: u64,
    /// Cost admitted in the current window.
    pub current: u64,
}

impl SlidingWindowCounter {
    /// About `limit` per sliding `window`.
    ///
    /// The stores compare `limit * window` (in µs) exactly, so this product must
    /// stay below 2^52: for example up to 1,000 per 52 days, or 1,000,000 per
    /// 75 minutes.
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        let limit = check_limit(limit, "limit")?;
        let window = window_micros(window, "window")?;
        if limit.checked_mul(window).is_none_or(|p| p > MAX_EXACT / 2) {
            return Err(PolicyError::Unrepresentable {
                what: "limit times window in microseconds",
                max: MAX_EXACT / 2,
            });
        }
        Ok(SlidingWindowCounter { limit, window })
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
    pub fn decide(&self, state: &mut SlidingWindowCounterState, now: u64, cost: u64) -> Decision {
        let w = self.window;
        let aligned = now - now % w;
        let empty = state.previous == 0 && state.current == 0;
        let (start, previous, current) = if empty || state.window_start + w < aligned {
            (aligned, 0, 0)
        } else if state.window_start + w == aligned {
            (aligned, state.current, 0)
        } else {
            // The same window, or a later one if the clock stepped back.
            (state.window_start, state.previous, state.current)
        };
        let elapsed = now.saturating_sub(start);
        // Everything below is scaled by `w` to stay in integers.
        let weighted_previous = previous * (w - elapsed);
        let budget = self.limit * w;
        if weighted_previous + (current + cost) * w <= budget {
            let current = current + cost;
            *state = SlidingWindowCounterState {
                window_start: start,
                previous,
                current,
            };
            let remaining = (budget - weighted_previous - current * w) / w;
            Decision::allow(
                self.limit,
                remaining,
                reset_after(start, w, now, previous, current),
            )
        } else {
            *state = SlidingWindowCounterState {
                window_start: start,
                previous,
                current,
            };
            let remaining = budget.saturating_sub(weighted_previous + current * w) / w;
            let retry = if current + cost <= self.limit {
                // Passes later in this window, once the previous window's
                // weight has decayed: previous * (w - e) <= (limit - current - cost) * w.
                let allowance = (self.limit - current - cost) * w / previous;
                (w - allowance.min(w)) - elapsed
            } else {
                // Passes in the next window, where `current` becomes the previous count.
                let allowance = (self.limit - cost) * w / current;
                (w - elapsed) + (w - allowance.min(w))
            };
            Decision::deny(
                self.limit,
                remaining,
                reset_after(start, w, now, previous, current),
                retry,
            )
        }
    }
}

fn reset_after(start: u64, w: u64, now: u64, previous: u64, current: u64) -> u64 {
    if current > 0 {
        (start + 2 * w).saturating_sub(now)
    } else if previous > 0 {
        (start + w).saturating_sub(now)
    } else {
        0
    }
}
