//! Sliding window log: at most `limit` in every interval of length `window`.
//!
//! Exact: it remembers when each admitted unit was admitted (requests admitted
//! in the same microsecond share one entry), so its state grows with the limit.

use std::collections::VecDeque;
use std::time::Duration;

use super::{check_limit, window_micros};
use crate::{Decision, PolicyError};

/// Parameters of a sliding window log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingWindowLog {
    limit: u64,
    window: u64,
}

/// State of a sliding window log for one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingWindowLogState {
    /// Admission times (µs) and the cost admitted then, oldest first.
    pub entries: VecDeque<(u64, u64)>,
    /// The sum of the costs in `entries`.
    pub total: u64,
}

impl SlidingWindowLog {
    /// At most `limit` in any `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        Ok(SlidingWindowLog {
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
    pub fn decide(&self, state: &mut SlidingWindowLogState, now: u64, cost: u64) -> Decision {
        // An entry admitted at `t` counts during [t, t + window).
        while let Some(&(t, c)) = state.entries.front() {
            if t + self.window > now {
                break;
            }
            state.total -= c;
            state.entries.pop_front();
        }
        if state.total + cost <= self.limit {
            if cost > 0 {
                match state.entries.back_mut() {
                    // Keep entries ordered even if the clock stepped back.
                    Some((t, c)) if *t >= now => *c += cost,
                    _ => state.entries.push_back((now, cost)),
                }
                state.total += cost;
            }
            Decision::allow(
                self.limit,
                self.limit - state.total,
                self.reset_after(state, now),
            )
        } else {
            let need = state.total + cost - self.limit;
            let mut freed = 0;
            let mut retry = self.window;
            for &(t, c) in &state.entries {
                freed += c;
                if freed >= need {
                    retry = t + self.window - now;
                    break;
                }
            }
            Decision::deny(
                self.limit,
                self.limit - state.total,
                self.reset_after(state, now),
                retry,
            )
        }
    }

    fn reset_after(&self, state: &SlidingWindowLogState, now: u64) -> u64 {
        state
            .entries
            .back()
            .map_or(0, |&(t, _)| (t + self.window).saturating_sub(now))
    }
}
