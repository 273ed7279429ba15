//! Token bucket: a burst of up to `capacity`, then `rate`.
//!
//! The state is a whole number of tokens and the time of the last refill. The
//! refill time advances by whole emission intervals only, so the fraction of
//! a token earned since then is never lost nor rounded up.

use super::{Rate, refill};
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
pub(crate) struct TokenBucketState {
    /// Whether the bucket has been used; a fresh bucket is full.
    pub(crate) started: bool,
    /// Whole tokens in the bucket at `last`.
    pub(crate) tokens: u64,
    /// When the bucket was last refilled, in µs.
    pub(crate) last: u64,
}

impl TokenBucket {
    /// A bucket of `capacity` tokens, refilled at `rate`.
    pub fn new(capacity: u64, rate: Rate) -> Result<Self, PolicyError> {
        let (capacity, interval) = refill(capacity, "capacity", rate)?;
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
    ///
    /// Only an admitted request of a positive cost writes the state, as the
    /// Redis script does (see [`FixedWindow::decide`](super::FixedWindow::decide)).
    pub(crate) fn decide(&self, state: &mut TokenBucketState, now: u64, cost: u64) -> Decision {
        let (c, t) = (self.capacity, self.interval);
        let (mut tokens, mut last) = if state.started {
            // Tokens above the capacity (a bucket that was larger under the
            // same name) are a full bucket.
            settle(state.tokens.min(c), state.last, now, t)
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
        // A `last` ahead of `now` (with no token left, see `settle`) is a
        // debt, from an admin penalty: nothing passes, not even a peek, until
        // it is paid back by the refill.
        let ahead = last.saturating_sub(now);
        let allowed = tokens >= cost && ahead == 0;
        if allowed && cost > 0 {
            tokens -= cost;
            *state = TokenBucketState {
                started: true,
                tokens,
                last,
            };
        }
        let reset = if tokens == c {
            0
        } else {
            (c - tokens) * t - progress + ahead
        };
        if allowed {
            Decision::allow(c, tokens, reset)
        } else {
            Decision::deny(c, tokens, reset, (cost - tokens) * t - progress + ahead)
        }
    }

    /// Consumes `amount` tokens even past empty (an admin penalty): the
    /// bucket goes into a debt of at most one full bucket, which it refills
    /// at the usual rate before earning tokens again, so a request of cost 1
    /// waits at most one full refill plus one interval. Returns what a peek
    /// then reports.
    pub(crate) fn penalize(&self, state: &mut TokenBucketState, now: u64, amount: u64) -> Decision {
        let level = self.level(state, now);
        let span = i128::from(self.capacity * self.interval);
        let lowered = level - i128::from(amount.min(2 * self.capacity) * self.interval);
        self.set_level(state, now, level.min(lowered.max(-span)));
        self.decide(state, now, 0)
    }

    /// Gives back `amount` tokens (paying back a debt first), never beyond a
    /// full bucket. Returns what a peek then reports.
    pub(crate) fn reward(&self, state: &mut TokenBucketState, now: u64, amount: u64) -> Decision {
        let level = self.level(state, now);
        let span = i128::from(self.capacity * self.interval);
        let raised = level + i128::from(amount.min(2 * self.capacity) * self.interval);
        self.set_level(state, now, raised.min(span));
        self.decide(state, now, 0)
    }

    /// The bucket's content at `now` in token-microseconds (a token is
    /// `interval` of them): whole tokens and the progress toward the next
    /// one, at most a full bucket, negative in debt.
    fn level(&self, state: &TokenBucketState, now: u64) -> i128 {
        let span = i128::from(self.capacity * self.interval);
        if !state.started {
            return span;
        }
        let level = i128::from(state.tokens) * i128::from(self.interval) + i128::from(now)
            - i128::from(state.last);
        level.min(span)
    }

    /// The state holding `level` at `now` (see [`level`](Self::level)).
    fn set_level(&self, state: &mut TokenBucketState, now: u64, level: i128) {
        let t = self.interval;
        let span = i128::from(self.capacity * t);
        *state = if level >= span {
            TokenBucketState::default()
        } else if level >= 0 {
            let level = u64::try_from(level).unwrap_or(0);
            TokenBucketState {
                started: true,
                tokens: level / t,
                last: now - level % t,
            }
        } else {
            TokenBucketState {
                started: true,
                tokens: 0,
                last: now + u64::try_from(-level).unwrap_or(0),
            }
        };
    }
}

/// Tokens and refill time with `last` never ahead of `now` while tokens are
/// left: when `last` is ahead (a debt, or a clock that stepped back), the
/// tokens in hand pay the debt first.
fn settle(tokens: u64, last: u64, now: u64, interval: u64) -> (u64, u64) {
    if last <= now || tokens == 0 {
        return (tokens, last);
    }
    let (debt, held) = (last - now, tokens * interval);
    if held >= debt {
        let level = held - debt;
        (level / interval, now - level % interval)
    } else {
        (0, last - held)
    }
}
