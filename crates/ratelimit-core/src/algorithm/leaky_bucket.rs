//! Leaky bucket (as a queue): admitted requests leave at a constant rate,
//! spaced one emission interval apart, and at most `capacity` units sit in the
//! bucket at once (the one being served included).
//!
//! The admission test is the same as GCRA's; in addition, every allowed
//! decision carries a [`delay`](crate::Decision::delay): how long the request
//! should wait for its slot. The tower layer's wait mode sleeps that long, so
//! calls to a downstream service are spaced evenly; in reject mode the delay is
//! reported but not waited for.

use super::gcra::{GcraState, decide_tat, penalize_tat, reward_tat};
use super::{Rate, refill};
use crate::{Decision, PolicyError};

/// Parameters of a leaky bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeakyBucket {
    capacity: u64,
    interval: u64,
    rate: Rate,
}

/// State of a leaky bucket for one key: when the next free slot starts (µs).
pub(crate) type LeakyBucketState = GcraState;

impl LeakyBucket {
    /// A bucket holding up to `capacity` units, draining at `rate`.
    pub fn new(capacity: u64, rate: Rate) -> Result<Self, PolicyError> {
        let (capacity, interval) = refill(capacity, "capacity", rate)?;
        Ok(LeakyBucket {
            capacity,
            interval,
            rate,
        })
    }

    /// How many units the bucket holds.
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The drain rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Microseconds per unit.
    #[inline]
    pub fn interval_micros(&self) -> u64 {
        self.interval
    }

    /// Decides one request of `cost` at `now` (µs).
    pub(crate) fn decide(&self, state: &mut LeakyBucketState, now: u64, cost: u64) -> Decision {
        let (decision, slot) = decide_tat(self.capacity, self.interval, state, now, cost);
        if decision.is_allowed() {
            decision.with_delay_us(slot - now)
        } else {
            decision
        }
    }

    /// Consumes `amount` units even past empty (an admin penalty): the next
    /// free slot moves `amount` intervals later, to at most two full buckets
    /// ahead of `now`. As for GCRA. Returns what a peek then reports.
    pub(crate) fn penalize(&self, state: &mut LeakyBucketState, now: u64, amount: u64) -> Decision {
        penalize_tat(self.capacity, self.interval, state, now, amount);
        self.decide(state, now, 0)
    }

    /// Gives back `amount` units: the next free slot moves earlier (never
    /// before `now`). Requests already admitted keep their slots, so the next
    /// ones may start closer to them than the rate. Returns what a peek then
    /// reports.
    pub(crate) fn reward(&self, state: &mut LeakyBucketState, now: u64, amount: u64) -> Decision {
        reward_tat(self.interval, state, now, amount);
        self.decide(state, now, 0)
    }
}
