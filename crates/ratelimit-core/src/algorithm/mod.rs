//! The seven algorithms: each one's parameters, as a [`Policy`](crate::Policy)
//! holds them ([`Algorithm`](crate::Algorithm)), and what it guarantees.
//!
//! Inside the crate each algorithm is a pure state transition in integer
//! microseconds, without I/O or floating point: the reference that every
//! store (in memory, and the Redis Lua scripts) reproduces exactly.
//!
//! Every algorithm but concurrency can be adjusted through
//! [`AdminStore`](crate::AdminStore): a penalty consumes even past empty,
//! into a debt of at most one more full budget (so a key is denied at most
//! about one window longer), and a reward gives back, never beyond a full
//! budget.

use std::time::Duration;

use crate::PolicyError;

/// `Display` (its name) and `FromStr` for a kind whose `ALL` lists every
/// value and whose `name` gives each one's; a name not among them fails
/// with `$unknown` (a tuple struct of the name given), whose message lists
/// the names: `unknown $what "x" (one of: a, b)`.
macro_rules! named_kinds {
    ($kind:ident, $unknown:ident, $what:literal) => {
        impl ::std::fmt::Display for $kind {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl ::std::str::FromStr for $kind {
            type Err = $unknown;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $kind::ALL
                    .into_iter()
                    .find(|k| k.name() == s)
                    .ok_or_else(|| $unknown(s.to_owned()))
            }
        }

        impl ::std::fmt::Display for $unknown {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, concat!("unknown ", $what, " {:?} (one of: "), self.0)?;
                for (i, kind) in $kind::ALL.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(kind.name())?;
                }
                f.write_str(")")
            }
        }

        impl ::std::error::Error for $unknown {}
    };
}
pub(crate) use named_kinds;

pub mod calendar;
pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

#[cfg(test)]
mod properties;
#[cfg(test)]
mod scenarios;

pub use calendar::{Calendar, Period};
pub use concurrency::Concurrency;
pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use leaky_bucket::LeakyBucket;
pub use sliding_window_counter::SlidingWindowCounter;
pub use sliding_window_log::SlidingWindowLog;
pub use token_bucket::TokenBucket;

/// The largest integer every store computes exactly (Redis Lua numbers are
/// doubles, exact up to 2^53).
pub(crate) const MAX_EXACT: u64 = (1 << 53) - 1;

/// The longest time span a policy may cover, in microseconds (2^50 µs, about
/// 35 years). Together with a clock reading below 2^52 (the Unix epoch in
/// microseconds until the year 2112), every sum stays below [`MAX_EXACT`].
// Not API: `ratelimit-tower`'s configuration bounds the durations it parses with it.
#[doc(hidden)]
pub const MAX_HORIZON_MICROS: u64 = 1 << 50;

/// The largest limit, capacity or concurrency maximum a policy may have (2^40).
pub(crate) const MAX_LIMIT: u64 = 1 << 40;

/// Converts a duration to whole microseconds, rejecting zero and anything
/// beyond [`MAX_HORIZON_MICROS`].
pub(crate) fn window_micros(window: Duration, what: &'static str) -> Result<u64, PolicyError> {
    let micros = window.as_micros();
    if micros == 0 {
        return Err(PolicyError::ZeroWindow { what });
    }
    if micros > u128::from(MAX_HORIZON_MICROS) {
        return Err(PolicyError::Unrepresentable {
            what,
            max: MAX_HORIZON_MICROS,
        });
    }
    u64::try_from(micros).map_err(|_| PolicyError::Unrepresentable {
        what,
        max: MAX_HORIZON_MICROS,
    })
}

pub(crate) fn check_limit(limit: u64, what: &'static str) -> Result<u64, PolicyError> {
    if limit == 0 {
        return Err(PolicyError::ZeroLimit { what });
    }
    if limit > MAX_LIMIT {
        return Err(PolicyError::Unrepresentable {
            what,
            max: MAX_LIMIT,
        });
    }
    Ok(limit)
}

/// The parameters of the algorithms that count within a window (the fixed
/// window, the sliding window log and counter), validated alike: `limit`,
/// then `window` in microseconds.
pub(crate) fn limit_per_window(limit: u64, window: Duration) -> Result<(u64, u64), PolicyError> {
    Ok((
        check_limit(limit, "limit")?,
        window_micros(window, "window")?,
    ))
}

/// `value` raised by `amount`, but not beyond `cap` (and never lowered, should
/// `value` already exceed `cap`): how a penalty adds to a counter.
pub(crate) fn penalized(value: u64, amount: u64, cap: u64) -> u64 {
    value.max(value.saturating_add(amount).min(cap))
}

/// A refill rate: `amount` tokens every `period`.
///
/// Stores work with the emission interval, `period / amount` rounded *up* to a
/// whole microsecond, so the effective rate is never above the configured one
/// (for 3 per second the interval is 333,334 µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    amount: u64,
    period: Duration,
}

impl Rate {
    /// `amount` tokens every `period`.
    pub const fn new(amount: u64, period: Duration) -> Self {
        Rate { amount, period }
    }

    /// `amount` tokens per second.
    pub const fn per_second(amount: u64) -> Self {
        Rate::new(amount, Duration::from_secs(1))
    }

    /// `amount` tokens per minute.
    pub const fn per_minute(amount: u64) -> Self {
        Rate::new(amount, Duration::from_secs(60))
    }

    /// `amount` tokens per hour.
    pub const fn per_hour(amount: u64) -> Self {
        Rate::new(amount, Duration::from_secs(3600))
    }

    /// Tokens per period.
    pub const fn amount(&self) -> u64 {
        self.amount
    }

    /// The period.
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// The emission interval in microseconds (one token every this many µs).
    pub(crate) fn interval_micros(&self) -> Result<u64, PolicyError> {
        if self.amount == 0 {
            return Err(PolicyError::ZeroLimit { what: "rate" });
        }
        let period = window_micros(self.period, "period")?;
        if period < self.amount {
            return Err(PolicyError::RateTooHigh {
                amount: self.amount,
                period: self.period,
            });
        }
        Ok(period.div_ceil(self.amount))
    }
}

/// The parameters of the algorithms that refill at a rate (the token
/// bucket, GCRA, the leaky bucket), validated alike: `capacity` (called
/// `what`) and the emission interval of `rate`, with `capacity * interval`
/// checked against [`MAX_HORIZON_MICROS`].
pub(crate) fn refill(
    capacity: u64,
    what: &'static str,
    rate: Rate,
) -> Result<(u64, u64), PolicyError> {
    let capacity = check_limit(capacity, what)?;
    let interval = rate.interval_micros()?;
    capacity
        .checked_mul(interval)
        .filter(|&h| h <= MAX_HORIZON_MICROS)
        .ok_or(PolicyError::Unrepresentable {
            what: "capacity times emission interval",
            max: MAX_HORIZON_MICROS,
        })?;
    Ok((capacity, interval))
}
