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
        self.expire(state, now);
        if state.total + cost <= self.limit {
            add(state, now, cost);
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
                // A penalty may have pushed the total past the limit.
                self.limit.saturating_sub(state.total),
                self.reset_after(state, now),
                retry,
            )
        }
    }

    /// Consumes `amount` units even past the limit (an admin penalty): they
    /// are logged at `now` like admitted units and leave the window with
    /// them, so the key is denied at most one window longer. The log holds at
    /// most `2 × limit` units. Returns what a peek then reports.
    pub fn penalize(&self, state: &mut SlidingWindowLogState, now: u64, amount: u64) -> Decision {
        self.expire(state, now);
        let room = (2 * self.limit).saturating_sub(state.total);
        add(state, now, amount.min(room));
        self.decide(state, now, 0)
    }

    /// Gives back `amount` units, the most recent first (as if they had never
    /// been admitted); never more than the log holds, so never beyond a full
    /// budget. Returns what a peek then reports.
    pub fn reward(&self, state: &mut SlidingWindowLogState, now: u64, amount: u64) -> Decision {
        self.expire(state, now);
        let mut left = amount;
        while left > 0
            && let Some((_, c)) = state.entries.back_mut()
        {
            let taken = left.min(*c);
            *c -= taken;
            state.total -= taken;
            left -= taken;
            if *c == 0 {
                state.entries.pop_back();
            }
        }
        self.decide(state, now, 0)
    }

    /// Drops the entries that left the window: an entry admitted at `t`
    /// counts during `[t, t + window)`.
    fn expire(&self, state: &mut SlidingWindowLogState, now: u64) {
        while let Some(&(t, c)) = state.entries.front() {
            if t + self.window > now {
                break;
            }
            state.total -= c;
            state.entries.pop_front();
        }
    }

    fn reset_after(&self, state: &SlidingWindowLogState, now: u64) -> u64 {
        state
            .entries
            .back()
            .map_or(0, |&(t, _)| (t + self.window).saturating_sub(now))
    }
}

/// Logs `cost` units at `now` (nothing for 0).
fn add(state: &mut SlidingWindowLogState, now: u64, cost: u64) {
    if cost == 0 {
        return;
    }
    match state.entries.back_mut() {
        // Keep entries ordered even if the clock stepped back.
        Some((t, c)) if *t >= now => *c += cost,
        _ => state.entries.push_back((now, cost)),
    }
    state.total += cost;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> SlidingWindowLog {
        SlidingWindowLog::new(3, Duration::from_micros(1_000)).expect("valid")
    }

    #[test]
    fn penalty_units_leave_with_the_window() {
        let log = policy();
        let mut state = SlidingWindowLogState::default();
        assert!(log.decide(&mut state, 10_000, 1).is_allowed());
        let d = log.penalize(&mut state, 10_400, 100);
        assert_eq!(state.total, 6, "capped at twice the limit");
        assert!(!d.is_allowed());
        assert_eq!(d.remaining(), 0);
        // The penalty sits at 10_400 and leaves at 11_400.
        let denied = log.decide(&mut state, 10_500, 1);
        assert_eq!(denied.retry_after_micros(), 900);
        assert!(log.decide(&mut state, 11_400, 3).is_allowed());
    }

    #[test]
    fn reward_removes_the_most_recent_units() {
        let log = policy();
        let mut state = SlidingWindowLogState::default();
        log.decide(&mut state, 10_000, 1);
        log.decide(&mut state, 10_200, 2);
        let d = log.reward(&mut state, 10_300, 1);
        assert_eq!(state.entries, [(10_000, 1), (10_200, 1)]);
        assert_eq!((d.remaining(), d.reset_after_micros()), (1, 900));
        let d = log.reward(&mut state, 10_300, 5);
        assert!(state.entries.is_empty());
        assert_eq!((d.remaining(), d.reset_after_micros()), (3, 0));
    }
}
