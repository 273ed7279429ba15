//! Token bucket: a burst of up to `capacity`, then `rate`.
//!
//! The state is a whole number of tokens and the time of the last refill. The
//! refill time advances by whole emission intervals only, so the fraction of
//! a token earned since then is never lost nor rounded up.

use super::{Rate, check_limit, horizon};
use crate::{Decision, PolicyError};

/// Parameters of a token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    capacity: u64,
    interval: u64,
    rate: Rate,
}

/// State of a token bucket for one key. `None` in the store means a full bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenBucketState {
    /// Whether the bucket has been used; a fresh bucket is full.
    pub started: bool,
    /// Whole tokens in the bucket at `last`.
    pub tokens: u64,
    /// When the bucket was last refilled, in µs.
    pub last: u64,
}

impl TokenBucket {
    /// A bucket of `capacity` tokens, refilled at `rate`.
    pub fn new(capacity: u64, rate: Rate) -> Result<Self, PolicyError> {
        let capacity = check_limit(capacity, "capacity")?;
        let interval = rate.interval_micros()?;
        horizon(capacity, interval)?;
        Ok(TokenBucket {
            capacity,
            interval,
            rate,
        })
    }

    /// The capacity (the largest burst).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The refill rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Microseconds per token.
    pub fn interval_micros(&self) -> u64 {
        self.interval
    }

    /// Decides one request of `cost` at `now` (µs).
    pub fn decide(&self, state: &mut TokenBucketState, now: u64, cost: u64) -> Decision {
        let (c, t) = (self.capacity, self.interval);
        let (mut tokens, mut last) = if state.started {
            (state.tokens, state.last)
        } else {
            (c, now)
        };
        let elapsed = now.saturating_sub(last);
        let added = elapsed / t;
        if tokens + added >= c {
            tokens = c;
            last = now.max(last);
        } else {
            tokens += added;
            last += added * t;
        }
        // Progress toward the next token, in µs.
        let progress = now.saturating_sub(last);
        let allowed = tokens >= cost;
        if allowed {
            tokens -= cost;
        }
        *state = TokenBucketState {
            started: true,
            tokens,
            last,
        };
        let reset = if tokens == c {
            0
        } else {
            (c - tokens) * t - progress
        };
        if allowed {
            Decision::allow(c, tokens, reset)
        } else {
            Decision::deny(c, tokens, reset, (cost - tokens) * t - progress)
        }
    }
}
