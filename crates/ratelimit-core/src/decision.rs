//! What a store answers: a [`Decision`].

use std::fmt;
use std::time::Duration;

/// The answer to "may this request pass?" for one policy and one key.
///
/// The semantics are shared by every algorithm and every store:
///
/// - a denied request consumes nothing;
/// - a cost of 0 peeks: it consumes nothing and is allowed, unless an
///   operator blocked the key or penalised it into debt
///   ([`AdminStore`](crate::AdminStore));
/// - [`remaining`](Decision::remaining) is what a request of cost 1 could still
///   take right now, after this decision;
/// - [`reset_after`](Decision::reset_after) is how long until the budget is fully
///   restored if nothing else is consumed;
/// - [`retry_after`](Decision::retry_after) is, when denied, the exact delay
///   until the same request would pass if nothing else is consumed (for the
///   concurrency policy: until enough leases expire, an upper bound, since a
///   holder may release sooner).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Decision {
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset_after_us: u64,
    retry_after_us: u64,
    delay_us: u64,
    /// The permit's high and low halves, when `has_permit`: two `u64`s
    /// rather than an `Option<u128>` (16-byte aligned), so a decision is 64
    /// bytes, not 80, on the hot path of every store.
    permit: [u64; 2],
    has_permit: bool,
    source: DecisionSource,
}

/// Who made a [`Decision`]: the store asked, or a store combinator answering
/// in its place. Layers report it (metrics, logs); it never changes what the
/// decision means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum DecisionSource {
    /// The store itself (the default): `MemoryStore`, `RedisStore`, or the
    /// primary store of a [`FallbackStore`](crate::FallbackStore).
    #[default]
    Store,
    /// The local store of a [`FallbackStore`](crate::FallbackStore), while
    /// its primary was unreachable.
    Fallback,
    /// A [`DeniedCache`](crate::DeniedCache), from a denial it remembered,
    /// without asking the store.
    DeniedCache,
}

impl DecisionSource {
    /// A short name: `store`, `fallback` or `denied_cache`.
    pub fn as_str(&self) -> &'static str {
        match self {
            DecisionSource::Store => "store",
            DecisionSource::Fallback => "fallback",
            DecisionSource::DeniedCache => "denied_cache",
        }
    }
}

impl fmt::Display for DecisionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Decision {
    /// An allowed decision. Times are in microseconds.
    #[inline]
    pub fn allow(limit: u64, remaining: u64, reset_after_us: u64) -> Self {
        Decision {
            allowed: true,
            limit,
            remaining,
            reset_after_us,
            retry_after_us: 0,
            delay_us: 0,
            permit: [0; 2],
            has_permit: false,
            source: DecisionSource::Store,
        }
    }

    /// A denied decision. Times are in microseconds; `retry_after_us` is at least 1.
    #[inline]
    pub fn deny(limit: u64, remaining: u64, reset_after_us: u64, retry_after_us: u64) -> Self {
        Decision {
            allowed: false,
            limit,
            remaining,
            reset_after_us,
            retry_after_us: retry_after_us.max(1),
            delay_us: 0,
            permit: [0; 2],
            has_permit: false,
            source: DecisionSource::Store,
        }
    }

    /// Sets the delay before an allowed request should start (leaky bucket).
    #[must_use]
    #[inline]
    pub fn with_delay_us(mut self, delay_us: u64) -> Self {
        self.delay_us = delay_us;
        self
    }

    /// Attaches a concurrency permit.
    #[must_use]
    pub fn with_permit(mut self, permit: PermitId) -> Self {
        #[allow(clippy::cast_possible_truncation)] // the two halves
        {
            self.permit = [(permit.0 >> 64) as u64, permit.0 as u64];
        }
        self.has_permit = true;
        self
    }

    /// Marks who made the decision (store combinators set it; see
    /// [`DecisionSource`]).
    #[must_use]
    pub fn with_source(mut self, source: DecisionSource) -> Self {
        self.source = source;
        self
    }

    /// Who made the decision: the store, or a combinator in its place.
    pub fn source(&self) -> DecisionSource {
        self.source
    }

    /// Whether the request may pass.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// The policy's limit: the most a key can take at once (the limit per
    /// window, the bucket capacity, the concurrency maximum).
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// What a request of cost 1 could still take right now, after this decision.
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// How long until the budget is fully restored if nothing else is consumed.
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after_us)
    }

    /// When denied, how long until the same request would pass; `None` when allowed.
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.allowed).then(|| Duration::from_micros(self.retry_after_us))
    }

    /// For the leaky bucket, how long an allowed request should wait for its
    /// slot so that admitted requests leave evenly spaced. Zero otherwise.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us)
    }

    /// The concurrency permit taken by this decision, to be released when the
    /// work is done.
    pub fn permit(&self) -> Option<PermitId> {
        let [high, low] = self.permit;
        self.has_permit
            .then(|| PermitId((u128::from(high) << 64) | u128::from(low)))
    }

    /// [`reset_after`](Self::reset_after) in microseconds.
    #[inline]
    pub fn reset_after_micros(&self) -> u64 {
        self.reset_after_us
    }

    /// [`retry_after`](Self::retry_after) in microseconds (0 when allowed).
    #[inline]
    pub fn retry_after_micros(&self) -> u64 {
        if self.allowed { 0 } else { self.retry_after_us }
    }

    /// [`delay`](Self::delay) in microseconds.
    #[inline]
    pub fn delay_micros(&self) -> u64 {
        self.delay_us
    }
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Decision");
        d.field("allowed", &self.allowed)
            .field("limit", &self.limit)
            .field("remaining", &self.remaining)
            .field("reset_after", &self.reset_after());
        if !self.allowed {
            d.field("retry_after", &Duration::from_micros(self.retry_after_us));
        }
        if self.delay_us > 0 {
            d.field("delay", &self.delay());
        }
        if let Some(permit) = self.permit() {
            d.field("permit", &permit);
        }
        if self.source != DecisionSource::Store {
            d.field("source", &self.source);
        }
        d.finish()
    }
}

/// The identity of one concurrency permit, unique across the instances that
/// share a store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PermitId(pub u128);

/// Where a store draws its permit ids: a random prefix per store instance
/// (the high 64 bits, so instances sharing a store never collide) and a
/// counter.
pub(crate) struct PermitIds {
    prefix: u64,
    counter: std::sync::atomic::AtomicU64,
}

impl PermitIds {
    pub(crate) fn new() -> Self {
        let seed = std::collections::hash_map::RandomState::new();
        let prefix = std::hash::BuildHasher::hash_one(
            &seed,
            (std::time::SystemTime::now(), std::process::id()),
        );
        PermitIds {
            prefix,
            counter: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// A fresh id for a check under `policy`: a concurrency policy's permit,
    /// or `PermitId(0)` (none) for every other algorithm.
    pub(crate) fn next_for(&self, policy: &crate::Policy) -> PermitId {
        if matches!(policy.algorithm(), crate::Algorithm::Concurrency(_)) {
            self.fresh()
        } else {
            PermitId(0)
        }
    }

    /// A fresh id, never 0: a permit's, or an operation's that must count
    /// once however often it is sent (a refund, whose resends carry it).
    pub(crate) fn fresh(&self) -> PermitId {
        let n = self
            .counter
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        PermitId((u128::from(self.prefix) << 64) | u128::from(n))
    }
}

/// `Debug` and `Display` of a 128-bit id type (a tuple struct of a `u128`):
/// 32 hex digits, and in `Debug` the type's name around them. A macro, since
/// a function cannot implement traits; the ids print alike wherever logged.
macro_rules! hex_id_fmt {
    ($id:ident) => {
        impl ::std::fmt::Debug for $id {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, concat!(stringify!($id), "({:032x})"), self.0)
            }
        }

        impl ::std::fmt::Display for $id {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, "{:032x}", self.0)
            }
        }
    };
}
pub(crate) use hex_id_fmt;

hex_id_fmt!(PermitId);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_is_one_cache_line_and_keeps_its_whole_permit() {
        // Every store returns one per call, through `Option` and `Result`.
        assert!(std::mem::size_of::<Decision>() <= 64);
        let permit = PermitId((0x0123_4567_89ab_cdef << 64) | 0xfedc_ba98_7654_3210);
        let decision = Decision::allow(10, 9, 100).with_permit(permit);
        assert_eq!(decision.permit(), Some(permit));
        assert_eq!(permit.to_string(), "0123456789abcdeffedcba9876543210");
        assert_eq!(
            format!("{permit:?}"),
            "PermitId(0123456789abcdeffedcba9876543210)"
        );
        assert_eq!(Decision::allow(10, 9, 100).permit(), None);
        assert_ne!(decision, Decision::allow(10, 9, 100));
        assert_eq!(
            Decision::allow(10, 9, 100)
                .with_permit(PermitId(0))
                .permit(),
            Some(PermitId(0))
        );
    }
}
