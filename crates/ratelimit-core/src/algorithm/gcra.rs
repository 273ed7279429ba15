//! GCRA (generic cell rate algorithm): the shape of a token bucket kept in one
//! timestamp, the theoretical arrival time (TAT), with exact retry times.

use super::{Rate, refill};
use crate::{Decision, PolicyError};

/// Parameters of a GCRA limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gcra {
    burst: u64,
    interval: u64,
    rate: Rate,
}

/// State of a GCRA limiter for one key: the theoretical arrival time in µs
/// (0 for a fresh key).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GcraState {
    /// The theoretical arrival time, in µs.
    pub(crate) tat: u64,
}

impl Gcra {
    /// Bursts of up to `burst`, sustained `rate`.
    pub fn new(burst: u64, rate: Rate) -> Result<Self, PolicyError> {
        let (burst, interval) = refill(burst, "burst", rate)?;
        Ok(Gcra {
            burst,
            interval,
            rate,
        })
    }

    /// The largest burst.
    #[inline]
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The sustained rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Microseconds per unit.
    #[inline]
    pub fn interval_micros(&self) -> u64 {
        self.interval
    }

    /// Decides one request of `cost` at `now` (µs).
    #[inline]
    pub(crate) fn decide(&self, state: &mut GcraState, now: u64, cost: u64) -> Decision {
        decide_tat(self.burst, self.interval, state, now, cost).0
    }

    /// Consumes `amount` units even past empty (an admin penalty): the TAT
    /// moves `amount` intervals later, to at most two full bursts ahead of
    /// `now`, so a request of cost 1 waits at most one burst's refill time
    /// plus one interval. Returns what a peek then reports.
    pub(crate) fn penalize(&self, state: &mut GcraState, now: u64, amount: u64) -> Decision {
        penalize_tat(self.burst, self.interval, state, now, amount);
        self.decide(state, now, 0)
    }

    /// The TAT after a request of `cost` at `now` on `tat`, when it is
    /// admitted and consumes something (`cost > 0`); `None` when it leaves
    /// the TAT as it is. The transition of [`decide`](Self::decide), without
    /// the decision.
    #[inline]
    pub(crate) fn next_tat(&self, tat: u64, now: u64, cost: u64) -> Option<u64> {
        // A TAT past the clock's last reading is never admitted (see `decide_tat`).
        let new_tat = tat.max(now).checked_add(cost * self.interval)?;
        (cost > 0 && new_tat - now <= self.burst * self.interval).then_some(new_tat)
    }

    /// Gives back `amount` units (the TAT moves earlier, never before `now`:
    /// at most a full burst). Returns what a peek then reports.
    pub(crate) fn reward(&self, state: &mut GcraState, now: u64, amount: u64) -> Decision {
        reward_tat(self.interval, state, now, amount);
        self.decide(state, now, 0)
    }
}

/// The penalty of GCRA and the leaky bucket: the TAT moves `amount`
/// intervals later, capped at `now + 2 × capacity × interval` (and never
/// earlier than it was).
pub(crate) fn penalize_tat(
    capacity: u64,
    interval: u64,
    state: &mut GcraState,
    now: u64,
    amount: u64,
) {
    let cap = now.saturating_add(2 * capacity * interval);
    // `amount` above twice the capacity reaches the cap anyway.
    let amount = amount.min(2 * capacity);
    let moved = state.tat.max(now).saturating_add(amount * interval);
    state.tat = state.tat.max(moved.min(cap));
}

/// The reward of GCRA and the leaky bucket: the TAT moves `amount` intervals
/// earlier; at or before `now` the state is fresh.
pub(crate) fn reward_tat(interval: u64, state: &mut GcraState, now: u64, amount: u64) {
    let tat = state.tat.saturating_sub(amount.saturating_mul(interval));
    state.tat = if tat > now { tat } else { 0 };
}

/// The shared TAT transition of GCRA and the leaky bucket. Returns the decision
/// and, when allowed, the start of the request's slot.
#[inline]
pub(crate) fn decide_tat(
    capacity: u64,
    interval: u64,
    state: &mut GcraState,
    now: u64,
    cost: u64,
) -> (Decision, u64) {
    let limit_span = capacity * interval;
    let slot = state.tat.max(now);
    // A request whose TAT would pass the last reading a `u64` clock can
    // give (a manual clock set near it) is denied, never wrapped around.
    let (new_tat, past_the_end) = slot.overflowing_add(cost * interval);
    let new_tat = if past_the_end { u64::MAX } else { new_tat };
    if !past_the_end && new_tat - now <= limit_span {
        if cost > 0 {
            state.tat = new_tat;
        }
        let reset = state.tat.saturating_sub(now);
        let remaining = (limit_span - reset) / interval;
        (Decision::allow(capacity, remaining, reset), slot)
    } else {
        let reset = state.tat.saturating_sub(now);
        let remaining = limit_span.saturating_sub(reset) / interval;
        let retry = (new_tat - now).saturating_sub(limit_span);
        (Decision::deny(capacity, remaining, reset, retry), slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `next_tat` is the transition `decide` makes: the TAT it writes when
    /// it writes one, `None` when it leaves the TAT as it is.
    #[test]
    fn next_tat_is_the_transition_of_decide() {
        let gcra = Gcra::new(5, Rate::per_second(10)).expect("valid");
        let interval = gcra.interval_micros();
        let now = 1_000_000_000;
        for tat in (0..12)
            .map(|i| now - 2 * interval + i * interval / 2)
            .chain([0, now])
        {
            for cost in 0..=6 {
                let mut state = GcraState { tat };
                gcra.decide(&mut state, now, cost);
                let written = (state.tat != tat).then_some(state.tat);
                assert_eq!(
                    gcra.next_tat(tat, now, cost),
                    written,
                    "tat {tat}, cost {cost}"
                );
            }
        }
    }
}
