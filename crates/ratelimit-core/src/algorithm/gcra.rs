//! GCRA (generic cell rate algorithm): the shape of a token bucket kept in one
//! timestamp, the theoretical arrival time (TAT), with exact retry times.

use super::{Rate, check_limit, horizon};
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
pub struct GcraState {
    /// The theoretical arrival time, in µs.
    pub tat: u64,
}

impl Gcra {
    /// Bursts of up to `burst`, sustained `rate`.
    pub fn new(burst: u64, rate: Rate) -> Result<Self, PolicyError> {
        let burst = check_limit(burst, "burst")?;
        let interval = rate.interval_micros()?;
        horizon(burst, interval)?;
        Ok(Gcra {
            burst,
            interval,
            rate,
        })
    }

    /// The largest burst.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The sustained rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Microseconds per unit.
    pub fn interval_micros(&self) -> u64 {
        self.interval
    }

    /// Decides one request of `cost` at `now` (µs).
    pub fn decide(&self, state: &mut GcraState, now: u64, cost: u64) -> Decision {
        decide_tat(self.burst, self.interval, state, now, cost).0
    }
}

/// The shared TAT transition of GCRA and the leaky bucket. Returns the decision
/// and, when allowed, the start of the request's slot.
pub(crate) fn decide_tat(
    capacity: u64,
    interval: u64,
    state: &mut GcraState,
    now: u64,
    cost: u64,
) -> (Decision, u64) {
    let limit_span = capacity * interval;
    let slot = state.tat.max(now);
    let new_tat = slot + cost * interval;
    if new_tat - now <= limit_span {
        if cost > 0 {
            state.tat = new_tat;
        }
        let reset = state.tat.saturating_sub(now);
        let remaining = (limit_span - reset) / interval;
        (Decision::allow(capacity, remaining, reset), slot)
    } else {
        let reset = state.tat.saturating_sub(now);
        let remaining = limit_span.saturating_sub(reset) / interval;
        let retry = new_tat - now - limit_span;
        (Decision::deny(capacity, remaining, reset, retry), slot)
    }
}
