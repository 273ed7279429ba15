//! Sliding window log: at most `limit` in every interval of length `window`.
//!
//! It remembers when each admitted unit was admitted: requests admitted in
//! the same microsecond share one entry.
//!
//! # Bounded state
//!
//! A limit up to 1,024 (the number of slots, `LOG_SLOTS`) is exact: the log
//! holds at most one entry per unit, so at most `2 × limit` entries (a
//! penalty may log up to twice the limit). Above it, the window is cut into
//! slots of `ceil(window / LOG_SLOTS)` µs aligned on the clock's origin, and
//! the requests admitted within one slot share one entry, stamped with the
//! latest admission: at most `LOG_SLOTS + 1` entries count at any time. The
//! approximation only ever errs towards denying: a unit counts at most one
//! slot (`window / LOG_SLOTS`, rounded up) longer than it was admitted, so
//! there are never more than `limit` units in any interval of length
//! `window`, and `retry_after`/`reset_after` are at most one slot later than
//! the exact log's. Either way a key holds at most `2 × LOG_SLOTS` entries
//! (16 bytes each in memory), and every decision reads at most that many.

use std::collections::VecDeque;
use std::time::Duration;

use super::limit_per_window;
use crate::{Decision, PolicyError};

/// The number of slots a window is cut into when the limit exceeds it (see
/// the module's docs): the bound on the entries of one sliding log.
pub(crate) const LOG_SLOTS: u64 = 1024;

/// Parameters of a sliding window log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingWindowLog {
    limit: u64,
    window: u64,
}

/// State of a sliding window log for one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SlidingWindowLogState {
    /// Admission times (µs) and the cost admitted then, oldest first.
    pub(crate) entries: VecDeque<(u64, u64)>,
    /// The sum of the costs in `entries`.
    pub(crate) total: u64,
}

impl SlidingWindowLog {
    /// At most `limit` in any `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        let (limit, window) = limit_per_window(limit, window)?;
        Ok(SlidingWindowLog { limit, window })
    }

    /// The limit per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window in microseconds.
    pub fn window_micros(&self) -> u64 {
        self.window
    }

    /// The width in µs of the slots whose admissions share one entry: 1 (one
    /// entry per microsecond, exact) up to a limit of 1,024,
    /// `ceil(window / 1024)` above (see the [module docs](self)).
    pub fn slot_micros(&self) -> u64 {
        if self.limit > LOG_SLOTS {
            self.window.div_ceil(LOG_SLOTS)
        } else {
            1
        }
    }

    /// Decides one request of `cost` at `now` (µs).
    pub(crate) fn decide(
        &self,
        state: &mut SlidingWindowLogState,
        now: u64,
        cost: u64,
    ) -> Decision {
        self.expire(state, now);
        if state.total + cost <= self.limit {
            add(state, now, cost, self.slot_micros());
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
    pub(crate) fn penalize(
        &self,
        state: &mut SlidingWindowLogState,
        now: u64,
        amount: u64,
    ) -> Decision {
        self.expire(state, now);
        let room = (2 * self.limit).saturating_sub(state.total);
        add(state, now, amount.min(room), self.slot_micros());
        self.decide(state, now, 0)
    }

    /// Gives back `amount` units, the most recent first (as if they had never
    /// been admitted); never more than the log holds, so never beyond a full
    /// budget. Returns what a peek then reports.
    pub(crate) fn reward(
        &self,
        state: &mut SlidingWindowLogState,
        now: u64,
        amount: u64,
    ) -> Decision {
        self.give_back(state, now, amount, End::Newest)
    }

    /// Gives back up to `amount` units from the `end` of the log. A request
    /// refused after it was admitted is refunded from the oldest end: a
    /// refund cannot tell its own units from a later request's, and the
    /// oldest leave the window first anyway, so the log then counts at least
    /// what it would have without the refunded request, never less (giving
    /// back the newest could free a later request's units early and admit
    /// past the limit). Returns what a peek then reports.
    pub(crate) fn give_back(
        &self,
        state: &mut SlidingWindowLogState,
        now: u64,
        amount: u64,
        end: End,
    ) -> Decision {
        self.expire(state, now);
        remove(state, amount, end);
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

/// Which end of a log units are removed from.
#[derive(Clone, Copy)]
pub(crate) enum End {
    Oldest,
    Newest,
}

/// Removes up to `amount` units from the `end` of the log.
fn remove(state: &mut SlidingWindowLogState, amount: u64, end: End) {
    let mut left = amount;
    while left > 0 {
        let entry = match end {
            End::Oldest => state.entries.front_mut(),
            End::Newest => state.entries.back_mut(),
        };
        let Some((_, c)) = entry else {
            return;
        };
        let taken = left.min(*c);
        *c -= taken;
        state.total -= taken;
        left -= taken;
        if *c == 0 {
            match end {
                End::Oldest => state.entries.pop_front(),
                End::Newest => state.entries.pop_back(),
            };
        }
    }
}

/// Logs `cost` units at `now` (nothing for 0), in the newest entry when it
/// lies in the same slot of `slot` µs, or later (the clock stepped back): the
/// entry then moves to the later of the two times, so units never leave
/// earlier than they would on their own.
fn add(state: &mut SlidingWindowLogState, now: u64, cost: u64, slot: u64) {
    if cost == 0 {
        return;
    }
    match state.entries.back_mut() {
        Some((t, c)) if *t >= now || *t / slot == now / slot => {
            *t = now.max(*t);
            *c += cost;
        }
        _ => state.entries.push_back((now, cost)),
    }
    state.total += cost;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_limit_keeps_at_most_one_entry_per_slot() {
        let window = 1_000_000;
        let log = SlidingWindowLog::new(100_000, Duration::from_micros(window)).expect("valid");
        assert_eq!(log.slot_micros(), 977);
        let mut state = SlidingWindowLogState::default();
        let mut admitted = Vec::new();
        let mut now = 5_000_000;
        // 10,000 admissions 50 µs apart, then 10,000 more after a pause.
        for i in 0..20_000u64 {
            now += if i == 10_000 { 600_000 } else { 50 };
            if log.decide(&mut state, now, 3).is_allowed() {
                admitted.push(now);
            }
            assert!(
                state.entries.len() as u64 <= LOG_SLOTS + 1,
                "{}",
                state.entries.len()
            );
        }
        assert_eq!(state.total, state.entries.iter().map(|e| e.1).sum::<u64>());
        // Never more than the limit in any window: each entry's units count
        // from no earlier than they were admitted.
        for (i, &t) in admitted.iter().enumerate() {
            let within = admitted[i..]
                .iter()
                .take_while(|&&u| u < t + window)
                .count();
            assert!(3 * within as u64 <= 100_000, "{within} admissions from {t}");
        }
        // Admissions in one slot share one entry, at the latest time.
        let &(t, c) = state.entries.back().expect("entries");
        assert_eq!(t, now);
        assert!(c > 3);
    }
}
