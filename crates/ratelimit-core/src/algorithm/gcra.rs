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

    /// The decision [`decide`](Self::decide) makes on `tat` at `now` when
    /// the request of `cost` is admitted and moves the TAT to `next` (what
    /// [`next_tat`](Self::next_tat) returned): the same decision, computed
    /// from the transition already made. A fresh key (`tat` not after
    /// `now`) is left `burst - cost` units, with no division.
    #[inline]
    pub(crate) fn admitted(&self, tat: u64, next: u64, now: u64, cost: u64) -> Decision {
        let reset = next - now;
        let remaining = if tat <= now {
            self.burst - cost
        } else {
            (self.burst * self.interval - reset) / self.interval
        };
        Decision::allow(self.burst, remaining, reset)
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

    /// `admitted` is the decision `decide` makes whenever the request is
    /// admitted and consumes something, fresh key or not, for bursts and
    /// rates whose interval does and does not divide a second evenly, and
    /// on clocks at both ends of `u64`.
    #[test]
    fn admitted_is_the_decision_of_decide() {
        for (burst, rate) in [
            (5, Rate::per_second(10)),
            (1, Rate::per_second(3)),
            (7, Rate::per_minute(13)),
            (1_000, Rate::per_second(1_000_000)),
        ] {
            let gcra = Gcra::new(burst, rate).expect("valid");
            let interval = gcra.interval_micros();
            let span = burst * interval;
            for now in [1_000_000_000, 0, 1, u64::MAX - span, u64::MAX - 1, u64::MAX] {
                for tat in (0..4 * burst)
                    .map(|i| {
                        now.saturating_sub(2 * interval)
                            .saturating_add(i * interval / 3)
                    })
                    .chain([
                        0,
                        now,
                        now.saturating_sub(1),
                        now.saturating_add(1),
                        u64::MAX,
                    ])
                {
                    for cost in [0, 1, 2, burst - 1, burst, burst + 1] {
                        assert_admitted_is_decided(&gcra, tat, now, cost);
                    }
                }
            }
        }
    }

    /// When `next_tat` admits `(tat, now, cost)`, `decide` moves the TAT
    /// there and returns what `admitted` returns.
    fn assert_admitted_is_decided(gcra: &Gcra, tat: u64, now: u64, cost: u64) {
        let Some(next) = gcra.next_tat(tat, now, cost) else {
            return;
        };
        let mut state = GcraState { tat };
        let decided = gcra.decide(&mut state, now, cost);
        assert_eq!(state.tat, next, "tat {tat}, now {now}, cost {cost}");
        assert_eq!(
            gcra.admitted(tat, next, now, cost),
            decided,
            "{gcra:?}, tat {tat}, now {now}, cost {cost}"
        );
    }

    proptest::proptest! {
        /// The same on random policies, clocks anywhere in `u64` and TATs
        /// up to three bursts either side of the clock.
        #[test]
        fn admitted_is_decided_anywhere(
            burst in 1u64..=2_000,
            amount in 1u64..=1_000_000,
            period_ms in 1u64..=3_600_000,
            now in proptest::prop_oneof![
                proptest::prelude::any::<u64>(),
                (u64::MAX - (1 << 52))..=u64::MAX,
                0u64..(1 << 52),
            ],
            offset in proptest::prelude::any::<i64>(),
            cost in 0u64..=2_001,
        ) {
            let rate = Rate::new(amount, std::time::Duration::from_millis(period_ms));
            let Ok(gcra) = Gcra::new(burst, rate) else {
                return Ok(());
            };
            let span = burst * gcra.interval_micros();
            let shift = offset.unsigned_abs() % (3 * span + 3);
            let tat = if offset < 0 { now.saturating_sub(shift) } else { now.saturating_add(shift) };
            assert_admitted_is_decided(&gcra, tat, now, cost.min(burst + 1));
        }
    }
}
