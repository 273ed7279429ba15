//! Sliding window counter: the previous window's count, weighted by how much of
//! it still overlaps the sliding window, plus the current window's count.
//!
//! Two counters per key, smooth across boundaries, approximate: it assumes the
//! previous window's requests were spread evenly. It never admits more than
//! `limit` within one aligned window.

use std::time::Duration;

use super::{MAX_EXACT, limit_per_window, penalized};
use crate::{Decision, PolicyError};

/// Parameters of a sliding window counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingWindowCounter {
    limit: u64,
    window: u64,
}

/// State of a sliding window counter for one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SlidingWindowCounterState {
    /// A time (µs) in the current window: its last microsecond as the
    /// stores write it (see
    /// [`FixedWindowState::window_last`](super::fixed_window::FixedWindowState::window_last)).
    pub(crate) window_last: u64,
    /// Cost admitted in the window before it.
    pub(crate) previous: u64,
    /// Cost admitted in the current window.
    pub(crate) current: u64,
}

impl SlidingWindowCounter {
    /// About `limit` per sliding `window`.
    ///
    /// The stores compare `limit * window` (in µs) exactly, so this product must
    /// stay below 2^52: for example up to 1,000 per 52 days, or 1,000,000 per
    /// 75 minutes.
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        let (limit, window) = limit_per_window(limit, window)?;
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

    /// The window start and the two counts that apply at `now`.
    ///
    /// A state written under other parameters (the same policy name with
    /// another window or limit) is read as one of this policy's: its current
    /// count belongs to the window of this length that holds the last
    /// microsecond of the window that wrote it, and its previous count to the
    /// window before that one. Under a shorter window the current count thus
    /// counts in full until the longer window would have ended (or later),
    /// and the previous count was admitted before the window it weighs from
    /// started. A count above twice the limit (the most a penalty leaves)
    /// counts as twice the limit.
    fn current(&self, state: &SlidingWindowCounterState, now: u64) -> (u64, u64, u64) {
        let w = self.window;
        let aligned = now - now % w;
        let start = state.window_last - state.window_last % w;
        let (previous, current) = (
            state.previous.min(2 * self.limit),
            state.current.min(2 * self.limit),
        );
        let empty = previous == 0 && current == 0;
        if empty || start + w < aligned {
            (aligned, 0, 0)
        } else if start + w == aligned {
            (aligned, current, 0)
        } else {
            // The same window, or a later one if the clock stepped back.
            (start, previous, current)
        }
    }

    /// Decides one request of `cost` at `now` (µs).
    ///
    /// Only an admitted request of a positive cost writes the state, as the
    /// Redis script does (see [`FixedWindow::decide`](super::FixedWindow::decide)).
    pub(crate) fn decide(
        &self,
        state: &mut SlidingWindowCounterState,
        now: u64,
        cost: u64,
    ) -> Decision {
        let w = self.window;
        let (start, previous, current) = self.current(state, now);
        let elapsed = now.saturating_sub(start);
        // How far the window the counts belong to starts after `now` (a
        // count written in a longer window, or a clock that stepped back):
        // the previous count weighs in full until then.
        let ahead = start.saturating_sub(now);
        // Everything below is scaled by `w` to stay in integers.
        let weighted_previous = previous * (w - elapsed);
        let budget = self.limit * w;
        if weighted_previous + (current + cost) * w <= budget {
            let current = current + cost;
            if cost > 0 {
                *state = SlidingWindowCounterState {
                    window_last: start + (w - 1),
                    previous,
                    current,
                };
            }
            let remaining = (budget - weighted_previous - current * w) / w;
            Decision::allow(
                self.limit,
                remaining,
                reset_after(start, w, now, previous, current),
            )
        } else {
            let remaining = budget.saturating_sub(weighted_previous + current * w) / w;
            let retry = if current + cost <= self.limit {
                // Passes later in this window, once the previous window's
                // weight has decayed: previous * (w - e) <= (limit - current - cost) * w.
                let allowance = (self.limit - current - cost) * w / previous;
                (w - allowance.min(w)) - elapsed + ahead
            } else {
                // Passes in the next window, where `current` becomes the previous count.
                let allowance = (self.limit - cost) * w / current;
                (w - elapsed) + (w - allowance.min(w)) + ahead
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

impl SlidingWindowCounter {
    /// Consumes `amount` more in the current window even past the limit (an
    /// admin penalty), counting at most `2 × limit` there. The count weighs
    /// in the next window as the previous one, so a full penalty keeps a key
    /// denied for about half of the next window too, and never longer.
    /// Returns what a peek then reports.
    pub(crate) fn penalize(
        &self,
        state: &mut SlidingWindowCounterState,
        now: u64,
        amount: u64,
    ) -> Decision {
        self.adjust(state, now, |previous, current| {
            (previous, penalized(current, amount, 2 * self.limit))
        })
    }

    /// Gives back `amount`: from the current window's count first, then from
    /// the previous window's (whose units only weigh in part, so giving them
    /// back frees less than one unit each). Never below zero, so never beyond
    /// a full budget. Returns what a peek then reports.
    pub(crate) fn reward(
        &self,
        state: &mut SlidingWindowCounterState,
        now: u64,
        amount: u64,
    ) -> Decision {
        self.adjust(state, now, |previous, current| {
            let from_current = amount.min(current);
            let from_previous = (amount - from_current).min(previous);
            (previous - from_previous, current - from_current)
        })
    }

    /// Replaces the counts of the current window and of the one before it
    /// by what `change` makes of them, and returns what a peek then reports.
    fn adjust(
        &self,
        state: &mut SlidingWindowCounterState,
        now: u64,
        change: impl FnOnce(u64, u64) -> (u64, u64),
    ) -> Decision {
        let (start, previous, current) = self.current(state, now);
        let (previous, current) = change(previous, current);
        *state = SlidingWindowCounterState {
            window_last: start + (self.window - 1),
            previous,
            current,
        };
        self.decide(state, now, 0)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A state written under a 60 s window ("w119999999 8 2" in Redis)
    /// read under 45 s, at every point of the next windows.
    #[test]
    fn a_state_from_another_window_never_underflows_nor_over_admits() {
        const S: u64 = 1_000_000;
        let old = SlidingWindowCounter::new(10, Duration::from_secs(60)).expect("valid");
        let new = SlidingWindowCounter::new(10, Duration::from_secs(45)).expect("valid");
        let mut written = SlidingWindowCounterState::default();
        assert!(old.decide(&mut written, 10 * S, 8).is_allowed());
        assert!(old.decide(&mut written, 61 * S, 2).is_allowed());
        assert_eq!(
            (written.window_last, written.previous, written.current),
            (120 * S - 1, 8, 2)
        );
        for now in (61..=200).map(|s| s * S) {
            for cost in 0..=10 {
                let d = new.decide(&mut written.clone(), now, cost);
                assert!(d.remaining() <= 10, "{now} {cost}: {d:?}");
                // At most what is left of the minute and two 45 s windows.
                assert!(d.reset_after_micros() < 120 * S, "{now} {cost}: {d:?}");
                assert!(d.retry_after_micros() < 120 * S, "{now} {cost}: {d:?}");
                if now < 90 * S && cost > 0 {
                    // The minute's 10 count in full until it would have ended.
                    assert!(!d.is_allowed(), "{now} {cost}: {d:?}");
                    let at = now + d.retry_after_micros();
                    let retried = new.decide(&mut written.clone(), at, cost);
                    assert!(retried.is_allowed(), "{now} {cost} at {at}: {retried:?}");
                    assert!(!new.decide(&mut written.clone(), at - 1, cost).is_allowed());
                }
            }
        }
        // The 2 units of the minute that began at 60 s belong to the 45 s
        // window that holds the minute's last µs, [90 s, 135 s), and the 8
        // before them weigh as its previous window's: 7 more pass there.
        let mut state = written;
        let mut admitted = 0;
        for now in (90..135).map(|s| s * S) {
            while new.decide(&mut state, now, 1).is_allowed() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 7);
        assert_eq!(
            (state.window_last, state.previous, state.current),
            (135 * S - 1, 8, 9)
        );
    }
}
